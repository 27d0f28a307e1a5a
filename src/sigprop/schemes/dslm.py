"""DeepScaleLM (Kedia et al., ICML 2024): unit moments through depth for Pre-LN and Post-LN.

Residual, at every sublayer: x ← λ x + β D(f(x)), λ² + β² = 1, β² = k/N with N the number of
residual branches in the stack (2 per block, 3 in an encdec decoder) and k = ``dslm_k`` (2).
Invariant: if x and f(x) have unit variance, so does every sublayer output.

Init (all N(0, σ²), p = dropout, d = d_model, T = 2 summed embedding tables):
  embeddings      σ² = (1−p)/T                         unit variance after embedding dropout
  Q, K            σ² = 1/d
  V, O            σ² = √((1−p)/G_l)/d                  d²σ_v²σ_o² G_l/(1−p) = 1, G_l = `attention_gain`
  FFN, ReLU-like  σ₁² = σ₂² = √((1−p)/(m₂ d d_ff))      d_ff d σ₁²σ₂² m₂/(1−p) = 1
  FFN, GeLU       σ₁² = 1/d, σ₂² = (1−p)/(m₂ d_ff)      same product; unit pre-activation variance
with m₂ = E[φ(g)²], g ~ N(0,1) (½ for ReLU, 1 for shaped ReLU). For d_ff = 4d and ReLU this is
the authors' √((1−p)/2)/d. G_l → r_l for long bidirectional sequences, the authors' V/O init;
at finite (and causal) length G_l adds the token-specific part the authors' limit drops. r_l, the input token correlation of block l, follows the authors'
recursion: r₀ = (1−p)·r_emb; attention block output correlation 1−p; FFN block output
correlation (1−p)·κ(r) with κ the normalized activation kernel; residual mix r ← λ²r + β²r_f.
r_emb = P(two positions hold the same token)/T under a Zipf unigram law, 0 for a ViT (patches of
independent pixels; real images are correlated: set ``dslm_r0``), which also attends over its
1 + (image/patch)² tokens rather than max_seq_len (`ModelConfig.n_tokens`).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import torch

from ..theory.kernels import gaussian_kernel, gaussian_moment, relu_kernel
from ..theory.moments.embedding import zipf_collision_probability
from .base import ParamInfo, Scheme, Site, stack_layers, sublayers_per_block
from .shaped import unit_residual

HOMOGENEOUS = ("relu", "shaped_relu")


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


def attention_gain(r: float, seq_len: int, causal: bool) -> float:
    """G = E|Σ_j a_ij v_j|²/(d σ_v² σ²) for one attention row at init, averaged over rows.

    With tokens x_j of variance σ² and correlation r, given the softmax row a_i,
    E|Σ_j a_ij v_j|² ∝ Σ_jk a_ij a_ik ρ_jk = r (Σ_j a_ij)² + (1−r) Σ_j a_ij² = r + (1−r) S_i.
    With Q, K ~ N(0, 1/d) the logits of row i vary over its n_i keys with variance β² = 1−r
    (only the token-specific part of k_j varies), and for i.i.d. N(0, β²) logits the softmax
    has S_i = E Σ_j a_ij² ≈ n·E[e^{2z}]/(n E[e^z])² = e^{β²}/n_i (log-normal), capped at 1
    (n_i = 1 gives S = 1 exactly). n_i = seq_len, or i for causal rows. Hence
    G = r + (1−r)·mean_i min(1, e^{1−r}/n_i) → r as seq_len → ∞ without a causal mask.
    """
    e = math.exp(1.0 - r)
    if not causal:
        return r + (1.0 - r) * min(1.0, e / seq_len)
    k = min(seq_len, math.floor(e))          # rows n_i ≤ e^{1−r} are capped at 1
    tail = sum(1.0 / n for n in range(k + 1, seq_len + 1))
    return r + (1.0 - r) * (k + e * tail) / seq_len


@lru_cache(maxsize=64)
def block_correlations(cfg: Any, stack: str) -> tuple[float, ...]:
    """Predicted input token correlation r_l of every block of ``stack`` (the authors' recursion)."""
    p = cfg.dropout
    if cfg.dslm_r0 is not None:
        r = cfg.dslm_r0 * (1 - p)
    else:
        r = 0.0 if cfg.arch == "vit" else zipf_collision_probability(cfg.vocab_size) / 2 * (1 - p)
    lam, beta = DSLM().residual(cfg, Site(stack, 0, "attn"))
    out = []
    for _ in range(stack_layers(cfg, stack)):
        out.append(r)
        for _ in range(sublayers_per_block(cfg, stack) - 1):       # self (and cross) attention
            r = lam ** 2 * r + beta ** 2 * (1 - p)
        r = lam ** 2 * r + beta ** 2 * (1 - p) * activation_kernel(cfg.activation, r)
    return tuple(out)


class DSLM(Scheme):
    name = "dslm"
    norms = ("preln", "postln")

    def check(self, cfg: Any) -> None:
        if cfg.dslm_k <= 0:
            raise ValueError(f"ModelConfig.dslm_k must be > 0, got {cfg.dslm_k}")
        if cfg.dslm_r0 is not None and not 0 <= cfg.dslm_r0 <= 1:
            raise ValueError(f"ModelConfig.dslm_r0 must be in [0, 1], got {cfg.dslm_r0}")

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
            r = block_correlations(cfg, p.stack)[p.layer]
            causal = p.stack == "dec"
            return math.sqrt(math.sqrt((1 - drop) / attention_gain(r, cfg.n_tokens, causal)) / d)
        if p.role in ("ffn_in", "ffn_out"):
            m2 = second_moment(cfg.activation)
            if cfg.activation in HOMOGENEOUS:
                return math.sqrt(math.sqrt((1 - drop) / (m2 * d * cfg.d_ff)))
            return math.sqrt(1.0 / d) if p.role == "ffn_in" else math.sqrt((1 - drop) / (m2 * cfg.d_ff))
        raise KeyError(f"scheme 'dslm' has no init rule for role {p.role!r}")
