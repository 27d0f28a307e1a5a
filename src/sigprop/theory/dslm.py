"""DeepScaleLM's depth recursion of the token correlation (Kedia et al., ICML 2024), at finite length.

DSLM sets the value–output gain of block l from r_l, the token correlation entering it: the attention
output variance per unit gain is G(r_l) (`attention_gain`), so d²σ_v²σ_o² G(r_l) = 1 − p gives a unit
branch. The authors take G = r and an attention output correlation of 1 (L → ∞ keys, no mask); here
both come from the finite-length maps, for L keys per row (query i sees i keys when causal):

  G(r)     = r + (1 − r)((d − 1)F2 + Z1)/d            (`sigprop.theory.moments.attention.attention_gain`)
  r_out(r) = (r + (1 − r)((d − 2)ā e^{r(1−r)} + r(1 − r))/d) / G(r)

ā e^{ρβ²} is the mean overlap E⟨a_i, a_i'⟩ of two rows (`Attention`'s K1): ā the overlap of rows with
E a_ij = 1/n_i (`pair_overlap`), times E[e^{z+z'}]/(E e^z)² = e^{ρβ²} for two queries' logits on one key
(log-normal weights, logit variance β² = 1 − r, correlation ρ = r between queries); r(1 − r) is the
large-L value of the shared-logit term (`Attention`'s K2 → ρβ²).
Against Monte Carlo of a real layer (d = 64, 4 heads, L = 16–128, causal and not, r = 0–0.6) r_out is within
0.03 of the measured correlation (−0.028 to +0.014); DSLM's r_out = 1 is up to 0.83 above it.

Recursion over the blocks of a stack, residual x ← λx + β·D(f(x)) (λ² + β² = 1, dropout p):
  r₀ given (embedding output);  per attention sublayer r ← λ²r + β²(1 − p)·r_out(r);
  MLP r ← λ²r + β²(1 − p)·κ(r), κ the MLP's normalized kernel, applied per population of token pairs
  (same token / different tokens), since κ is not linear.
"""
from __future__ import annotations

import math
from typing import Callable

from .moments.attention import attention_gain


def pair_overlap(L: int, causal: bool) -> float:
    """ā = mean over query pairs i ≠ i' of Σ_j E[a_ij]E[a_i'j], with E a_ij = 1/n_i (exchangeable keys):
    Σ over shared keys of 1/(n_i n_i') = 1/max(n_i, n_i'). Causal: (L − H_L)/C(L, 2), H_L the harmonic
    number; bidirectional: 1/L."""
    if L < 2:
        return 1.0
    if not causal:
        return 1.0 / L
    harmonic = sum(1.0 / m for m in range(1, L + 1))
    return (L - harmonic) / (L * (L - 1) / 2)


def attention_correlation(r: float, L: int | None, causal: bool, d: int, n_heads: int) -> tuple[float, float]:
    """(G, r_out): the attention gain at input correlation ``r`` and the output token correlation over ``L`` keys;
    ``L=None`` is the authors' limit (G = r, r_out = 1)."""
    if L is None:
        return r, 1.0
    g = attention_gain(r, L, causal, d, n_heads)
    shared = r * (1.0 - r)                       # ρβ²: logit covariance of two queries on one key
    cov = r + (1.0 - r) * ((d - 2) * pair_overlap(L, causal) * math.exp(shared) + shared) / d
    return g, min(1.0, cov / g)


def block_correlations(pairs: tuple[tuple[float, float], ...], n_blocks: int, lam: float, beta: float, p: float,
                       L: int | None, causal: bool, d: int, n_heads: int, ffn_kernel: Callable[[float], float],
                       attentions: int = 1) -> tuple[tuple[float, float], ...]:
    """(r_l, G_l) entering every block l < ``n_blocks``: the mean input correlation and the attention gain there.

    ``pairs``: (weight, correlation) of each population of token pairs after the embeddings, weights summing
    to 1: with Zipf tokens and T summed tables, pairs holding the same token start at (1 − p)/T and the others
    at 0. Attention mixes over all keys, so its output correlation follows the mean r̄ = Σ w_k r_k; the MLP
    kernel acts on each population (κ is convex: for one table, a single r̄ = P(same) through κ would miss
    the same-token pairs' κ(1) = 1). ``attentions``: attention sublayers per block before the MLP (2 in an
    encoder–decoder's decoder, whose cross-attention is given the self-attention's rule). ``ffn_kernel``: κ.
    """
    weights = [w for w, _ in pairs]
    rs, out = [r for _, r in pairs], []
    for _ in range(n_blocks):
        for i in range(attentions):
            mean = sum(w * r for w, r in zip(weights, rs))
            g, r_out = attention_correlation(mean, L, causal, d, n_heads)
            if i == 0:
                out.append((mean, g))
            rs = [lam ** 2 * r + beta ** 2 * (1 - p) * r_out for r in rs]
        rs = [lam ** 2 * r + beta ** 2 * (1 - p) * ffn_kernel(r) for r in rs]
    return tuple(out)
