"""Pre-LN transformer: x ← x + f(LN(x)), final LN; standard (Xavier-like) init.

Invariant it does NOT keep (DeepScaleLM §3): the stream variance grows linearly with depth,
σ²_l ≈ σ²_0 + l·σ²_f, and the per-layer gradient norm falls like 1/√(l+1).
"""
from .base import Scheme


class PreLN(Scheme):
    name = "preln"
    norm_placements = ("pre",)
