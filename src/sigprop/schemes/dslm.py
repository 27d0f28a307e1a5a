"""DeepScaleLM (Kedia et al., ICML 2024): unit moments through depth, for every normed placement.

Residual, at every sublayer: x ← λ x + β D(f(x)), λ² + β² = 1, β² = k/N with N the number of
residual branches in the stack (2 per block, 3 in an encdec decoder) and k = ``dslm_k`` (2).
Invariant: if x and f(x) have unit variance, so does every sublayer output ("out", "sandwich": below).

Init (all N(0, σ²), p = dropout, d = d_model, T = 2 summed embedding tables):
  embeddings      σ² = (1−p)/T                         unit variance after embedding dropout
  Q, K            σ² = 1/d
  V, O            σ² = √((1−p)/G_l)/d                  d²σ_v²σ_o² G_l/(1−p) = 1
  FFN, ReLU-like  σ₁² = σ₂² = √((1−p)/(m₂ d d_ff))      d_ff d σ₁²σ₂² m₂/(1−p) = 1
  FFN, GeLU       σ₁² = 1/d, σ₂² = (1−p)/(m₂ d_ff)      same product; unit pre-activation variance
with m₂ = E[φ(g)²], g ~ N(0,1) (½ for ReLU, 1 for shaped ReLU). For d_ff = 4d and ReLU this is
the authors' √((1−p)/2)/d. G_l is the attention gain at the input token correlation r_l of block l
over ``n_tokens`` keys (causal in a decoder stack), both from `sigprop.theory.dslm`: up to
``GRAM_MAX_TOKENS`` tokens its token Gram recursion (the whole T × T Gram of sampled Zipf sequences
through the blocks, which carries causal stacks' position-dependent correlations and repeated tokens; a deep
stack's attention Gram sampled every ⌊0.01/β²⌋ blocks, every block up to 192),
beyond that the authors' depth recursion of the mean correlation with the finite-length attention gain
and output correlation. Both give G → r_l for long bidirectional sequences (the authors' V/O init) and
add the token-specific part at finite and causal length. r₀ = (1−p)·r_emb, r_emb = P(two positions hold the
same token)/T under a Zipf unigram law, 0 for a ViT (patches of independent pixels; real images are correlated:
set ``dslm_r0``), which also attends over its 1 + (image/patch)² tokens rather than max_seq_len
(`ModelConfig.n_tokens`).

Placements. "pre" and "post" as above. "out" (x ← λx + β D(N(f(x))), OLMo 2) and "sandwich" (x ← λx +
β D(N₂(f(N₁(x)))), Gemma 2/3, Peri-LN) keep the residual weights; their norm on the branch output gives every
branch output unit variance exactly (|y|² = d per token, `sigprop.theory.moments.norm`), so the stream's unit
variance holds by construction. What the V/O and FFN stds set there is σ_f², the branch's variance before its
output norm, and that norm's backward divides the gradient by σ_f: the invariant kept at 1 is σ_f², which makes the
output norm an identity in the mean at init and leaves the branch's backward Pre-LN DSLM's. The stds are the
Pre-LN rule for the branch's input: under "sandwich" N₁(x), exactly Pre-LN's; under "out" the stream x, whose
per-token variance is 1 (every add mixes unit-variance terms with λ² + β² = 1) and whose token correlation is the
stream's, the V̂ the Pre-LN recursion tracks (its per-token norm spreads by O(1/√d) where N₁ would fix it; the rule
leaves that out). The recursion adds each branch normalized per token, as the output norm does
(``branch_norm`` of `sigprop.theory.dslm.gram_blocks`).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable

import torch

from ..fields import FieldError
from ..nn.block import OUTPUT_NORMED
from ..theory import dslm as theory_dslm
from ..theory.kernels import gaussian_kernel, gaussian_moment, relu_kernel, tabulated
from ..theory.moments.embedding import zipf_collision_probability, zipf_ids
from .base import ParamInfo, Scheme, Site, stack_layers, sublayers_per_block
from .shaped import unit_residual

HOMOGENEOUS = ("relu", "shaped_relu")
GRAM_SEQUENCES = 8          # Zipf sequences the Gram recursion averages over


def activation_kernel(activation: str, rho: float) -> float:
    """κ(ρ) = E[φ(u)φ(v)]/E[φ(u)²] for unit Gaussians with correlation ρ (ReLU-like: closed form)."""
    if activation in HOMOGENEOUS:
        return relu_kernel(rho)     # the shaped ReLU differs by O(1/√n) slopes; ReLU is its n → ∞ kernel
    gelu = torch.nn.functional.gelu
    return gaussian_kernel(gelu, rho) / gaussian_moment(lambda x: gelu(x) ** 2)


def second_moment(activation: str) -> float:
    """m₂ = E[φ(g)²], g ~ N(0, 1)."""
    if activation == "relu":
        return 0.5
    if activation == "shaped_relu":
        return 1.0                  # normalized by construction
    return gaussian_moment(lambda x: torch.nn.functional.gelu(x) ** 2)


def embedding_pairs(cfg: Any, n_tables: int = 2, shared: int = 0) -> tuple[tuple[float, float], ...]:
    """(weight, correlation) of the token pairs after the embeddings (``n_tables`` summed tables, ``shared`` of
    them one row for every position, e.g. BERT's token type) and dropout: under a Zipf unigram law a fraction
    P(same token) of pairs share their token row, correlation (1−p)(1 + S)/T, the others (1−p)S/T (mean
    r₀ = (1−p)·r_emb); ``dslm_r0`` and a ViT (0) give one population."""
    p = cfg.dropout
    if cfg.dslm_r0 is not None:
        return ((1.0, cfg.dslm_r0 * (1 - p)),)
    if cfg.arch == "vit":
        return ((1.0, 0.0),)
    same = zipf_collision_probability(cfg.vocab_size)
    return (same, (1 - p) * (1 + shared) / n_tables), (1 - same, (1 - p) * shared / n_tables)


def correlations(cfg: Any, stack: str, ffn_kernel: Callable[[float], float], n_tables: int = 2,
                 shared: int = 0) -> tuple[tuple[float, float], ...]:
    """(r_l, G_l) of every block of ``stack`` over ``cfg``'s ``n_tokens`` keys (causal in a decoder stack), with
    ``n_tables`` summed embedding tables (``shared`` of them one row for every position) and the MLP kernel
    ``ffn_kernel``: `sigprop.theory.dslm.gram_correlations` on sampled Zipf sequences up to
    ``GRAM_MAX_TOKENS`` tokens (``dslm_r0`` and a ViT: one sequence of uniform correlation), the mean
    recursion `sigprop.theory.dslm.block_correlations` beyond."""
    if cfg.n_tokens > theory_dslm.GRAM_MAX_TOKENS:
        lam, beta = DSLM().residual(cfg, Site(stack, 0, "attn"))
        n_blocks, causal, attentions = stack_layers(cfg, stack), stack == "dec", sublayers_per_block(cfg, stack) - 1
        return theory_dslm.block_correlations(embedding_pairs(cfg, n_tables, shared), n_blocks, lam, beta,
                                              cfg.dropout, cfg.n_tokens, causal, cfg.d_model, cfg.n_heads,
                                              ffn_kernel, attentions=attentions)
    return theory_dslm.gram_correlations(*_gram_arguments(cfg, stack, ffn_kernel, n_tables, shared))


def block_grams(cfg: Any, stack: str) -> list[torch.Tensor]:
    """The (S, T, T) normalized token Gram entering every block of ``stack`` by the Gram recursion (sigprop's
    two tables and plain MLP), the tokens the V/O rule is made for: e.g. to feed a block what the scheme assumes."""
    kernel = lambda r: activation_kernel(cfg.activation, r)
    return [vhat for vhat, _ in theory_dslm.gram_blocks(*_gram_arguments(cfg, stack, kernel, 2, 0))]


def _gram_arguments(cfg: Any, stack: str, ffn_kernel: Callable[[float], float], n_tables: int,
                    shared: int) -> tuple[Any, ...]:
    """Positional arguments of `sigprop.theory.dslm.gram_blocks` / `gram_correlations` for ``cfg``'s ``stack``."""
    lam, beta = DSLM().residual(cfg, Site(stack, 0, "attn"))
    T = cfg.n_tokens
    uniform = cfg.dslm_r0 is not None or cfg.arch == "vit"
    tokens = None if uniform else zipf_ids(cfg.vocab_size, GRAM_SEQUENCES, T)
    grams = theory_dslm.embedding_grams(tokens, T, n_tables, shared, cfg.dropout, cfg.dslm_r0)
    return (grams, stack_layers(cfg, stack), lam, beta, cfg.dropout, stack == "dec", cfg.d_model, cfg.n_heads,
            tabulated(ffn_kernel), sublayers_per_block(cfg, stack) - 1, cfg.norm_placement == "post",
            cfg.norm_placement in OUTPUT_NORMED)


@lru_cache(maxsize=64)
def block_correlations(cfg: Any, stack: str) -> tuple[tuple[float, float], ...]:
    """(r_l, G_l) of every block of ``stack`` for a sigprop model: two tables, the plain φ MLP."""
    return correlations(cfg, stack, lambda r: activation_kernel(cfg.activation, r))


def vo_std(cfg: Any, gain: float) -> float:
    """σ_v = σ_o = (√((1−p)/G)/d)^{1/2}: d²σ_v²σ_o² G = 1 − p, a unit attention branch at attention gain G."""
    return math.sqrt(math.sqrt((1 - cfg.dropout) / gain) / cfg.d_model)


class DSLM(Scheme):
    name = "dslm"
    norm_placements = ("pre", "post", "out", "sandwich")
    learnable_residual = True

    def check(self, cfg: Any) -> None:
        if cfg.dslm_k <= 0:
            raise FieldError(f"ModelConfig.dslm_k must be > 0, got {cfg.dslm_k}")
        if cfg.dslm_r0 is not None and not 0 <= cfg.dslm_r0 <= 1:
            raise FieldError(f"ModelConfig.dslm_r0 must be in [0, 1], got {cfg.dslm_r0}")

    def residual(self, cfg: Any, site: Site) -> tuple[float, float]:
        n_branches = stack_layers(cfg, site.stack) * sublayers_per_block(cfg, site.stack)
        return unit_residual(cfg, math.sqrt(min(1.0, cfg.dslm_k / n_branches)))

    def std(self, cfg: Any, p: ParamInfo) -> float:
        d, drop = cfg.d_model, cfg.dropout
        if p.role in ("embed", "pos", "cls"):
            return math.sqrt((1 - drop) / 2)
        if p.role == "patch":
            return math.sqrt((1 - drop) / (2 * p.fan_in))
        if p.role in ("q", "k", "head"):
            return math.sqrt(1.0 / d)
        if p.role in ("v", "o"):
            return vo_std(cfg, block_correlations(cfg, p.stack)[p.layer][1])
        if p.role in ("ffn_in", "ffn_out"):
            m2 = second_moment(cfg.activation)
            if cfg.activation in HOMOGENEOUS:
                return math.sqrt(math.sqrt((1 - drop) / (m2 * d * cfg.d_ff)))
            return math.sqrt(1.0 / d) if p.role == "ffn_in" else math.sqrt((1 - drop) / (m2 * cfg.d_ff))
        raise KeyError(f"scheme 'dslm' has no init rule for role {p.role!r}")
