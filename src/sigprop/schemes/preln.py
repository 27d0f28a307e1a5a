"""Pre-LN transformer: x ← x + f(LN(x)), final LN; standard (Xavier-like) init.

Invariant it does NOT keep (DeepScaleLM §3): the stream variance grows linearly with depth,
σ²_l ≈ σ²_0 + l·σ²_f, and the per-layer gradient norm falls like 1/√(l+1).

Placements: "pre" (the default); "out", x ← x + N(f(x)) (OLMo 2, arXiv 2501.00656), and "sandwich",
x ← x + N₂(f(N₁(x))) (Gemma 2, arXiv 2408.00118; Peri-LN, Kim et al. 2025, arXiv 2502.02732), each with the
final norm: the same unit residual adds and init, with σ²_f = 1 exactly (the branch ends in a norm), so the
stream still grows linearly. Under "out" the branches read the growing stream itself, so without qk-norm the
attention logits grow as σ²_l (their scale β ∝ σ²_l).
"""
from .base import Scheme


class PreLN(Scheme):
    name = "preln"
    norm_placements = ("pre", "out", "sandwich")
