"""DSLM's token-correlation recursions through a stack whose sublayers carry their own residual weights and scales.

`sigprop.theory.dslm` runs its recursions through a stack of one (λ, β) whose every branch has unit variance, the
stack DSLM builds. A grown stack (`sigprop.models.grow`, mode "dslm") is not one: its old blocks keep the (λ, β) of
their depth and the V/O std made for the gain their stream had then, its new blocks get the new depth's. Here each
residual site s is a `ResidualSite` (kind, λ_s, β_s, c_s), x ← λ_s x + β_s D(f_s(x)), with the branch's variance

  attention  c_s·G_s     c_s = d²σ_v²σ_o²/(1 − p) read off its weights, G_s the gain at its input (the V/O rule
                         d²σ_v²σ_o² G = 1 − p with G = 1/c_s: unit exactly when its input has the gain it was made
                         for); c_s = None: the rule at its own input's gain, c_s = 1/G_s, a unit branch;
  MLP        c_s         DSLM's FFN rule gives 1 at every depth (c_s = d d_ff σ₁²σ₂² m₂/(1 − p)).

Both recursions then take one step per site, exactly as the uniform ones do per sublayer, with the branch's variance
in place of 1 (v: the stream's Gram or variance, not held at a unit diagonal; V̂ = norm(v) is what a norm in front
of the branch sees, and with Post-LN v is normalized after every add):

  Gram (`gram_sites`)   v ← λ_s² v + β_s²·D(c_s G_s·B_s/G_s)   attention, B_s = E[A X Xᵀ A ᵀ]/d at V̂ (Monte Carlo)
                        v ← λ_s² v + β_s²·D(c_s·κ(V̂))           MLP, κ entrywise with unit diagonal
  mean (`mean_sites`)   q ← λ_s² q + β_s² w_s,  r_k ← (λ_s² q r_k + β_s² w_s (1 − p) ρ_k)/q_new per population k,
                        w_s the branch variance above, ρ_k = r_out(r̄) (attention) or κ(r_k) (MLP)

with a norm on the branch output ("out", "sandwich") adding the branch normalized per token (w_s = 1) whatever c_s.
A stack of one (λ, β), λ² + β² = 1, and c_s = None everywhere is the uniform recursion: `gram_sites` then draws the
same Monte Carlo samples as `sigprop.theory.dslm.gram_correlations` evaluated at every block, `mean_sites` takes the
steps of `sigprop.theory.dslm.block_correlations`, and both return their (r_l, G_l) to rounding (rel. 1e-10,
`tests/test_grow_dslm.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .dslm import _mean_offdiagonal, _normalized, attention_correlation, attention_gram

KINDS = ("attn", "mlp")


@dataclass(frozen=True)
class ResidualSite:
    """One residual site x ← λx + β D(f(x)) of a stack: ``kind`` "attn" (self- or cross-attention) or "mlp";
    ``scale`` c: the attention branch's variance per unit gain, d²σ_v²σ_o²/(1 − p) (None: 1/G at its own input, a
    unit branch), or the MLP branch's variance (None: 1)."""

    kind: str
    lam: float
    beta: float
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ResidualSite.kind must be one of {KINDS}, got {self.kind!r}")

    def variance(self, gain: float) -> float:
        """The branch's output variance after dropout: c·G (attention at gain G; None: 1), c (MLP; None: 1)."""
        if self.scale is None:
            return 1.0
        return self.scale * gain if self.kind == "attn" else self.scale


def gram_sites(grams: torch.Tensor, sites: Sequence[ResidualSite], p: float, causal: bool, d: int, n_heads: int,
               ffn_kernel: Callable[[torch.Tensor], torch.Tensor], post: bool = False, branch_norm: bool = False,
               rows: int = 2048, seed: int = 0) -> tuple[tuple[float, float], ...]:
    """(r_s, G_s) at every attention site: the mean token correlation of V̂ entering it and its gain, by the Gram
    recursion of the module docstring from the embedding ``grams`` (S, T, T), every site evaluated (no spacing).

    ``ffn_kernel`` acts entrywise on a tensor of correlations; ``post``: the stream is normalized after every add
    (Post-LN); ``branch_norm``: a norm on each branch's output; ``rows``, ``seed``: the Monte Carlo of the attention
    Gram as in `sigprop.theory.dslm.gram_blocks` (rows query rows per site in heads of T rows, one generator)."""
    s, t, _ = grams.shape
    draws = max(1, math.ceil(rows / (s * t)))
    gen = torch.Generator().manual_seed(seed)
    eye = torch.eye(t, dtype=torch.float64)
    mask = (1 - p) * (1 - eye) + eye                  # dropout keeps the diagonal, scales the rest by 1 − p
    v, out = grams.clone(), []
    for site in sites:
        vhat = _normalized(v)                                                          # (S, T, T)
        if site.kind == "attn":
            branch = attention_gram(vhat, d, n_heads, causal, draws, gen)
            gain = float(branch.diagonal(dim1=-2, dim2=-1).mean())
            out.append((_mean_offdiagonal(vhat), gain))
            y = _normalized(branch) if branch_norm else site.variance(gain) * (branch / gain)
        else:
            y = ffn_kernel(vhat) * (1 - eye) + eye
            y = y if branch_norm else site.variance(1.0) * y
        v = site.lam ** 2 * v + site.beta ** 2 * (y * mask)
        v = _normalized(v) if post else v
    return tuple(out)


def mean_sites(pairs: tuple[tuple[float, float], ...], sites: Sequence[ResidualSite], p: float, L: int | None,
               causal: bool, d: int, n_heads: int, ffn_kernel: Callable[[float], float], post: bool = False,
               branch_norm: bool = False) -> tuple[tuple[float, float], ...]:
    """(r̄_s, G_s) at every attention site by the mean recursion of the module docstring: ``pairs`` the (weight,
    correlation) populations after the embeddings (`sigprop.theory.dslm.block_correlations`), the stream's variance
    q tracked from 1 (held at 1 under ``post``), the attention output correlation r_out(r̄) of
    `sigprop.theory.dslm.attention_correlation` over ``L`` keys, ``ffn_kernel`` the MLP's κ."""
    weights, rs = [w for w, _ in pairs], [r for _, r in pairs]
    q, out = 1.0, []
    for site in sites:
        mean = sum(w * r for w, r in zip(weights, rs))
        if site.kind == "attn":
            gain, r_out = attention_correlation(mean, L, causal, d, n_heads)
            out.append((mean, gain))
            branch, var = [r_out] * len(rs), 1.0 if branch_norm else site.variance(gain)
        else:
            branch, var = [ffn_kernel(r) for r in rs], 1.0 if branch_norm else site.variance(1.0)
        q_new = site.lam ** 2 * q + site.beta ** 2 * var
        rs = [(site.lam ** 2 * q * r + site.beta ** 2 * var * (1 - p) * b) / q_new for r, b in zip(rs, branch)]
        q = 1.0 if post else q_new
    return tuple(out)
