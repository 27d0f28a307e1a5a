"""Summed embedding tables (token, position, segment, ...), and the Zipf token-collision probability."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .state import Component, Mixing, Moments, check_nonneg, check_size, ratio, replace

EULER_GAMMA = 0.5772156649015329


def zipf_collision_probability(vocab_size: int) -> float:
    """Σ p_i² for a Zipf law p_i ∝ 1/i over ``vocab_size`` tokens, exactly: (Σ 1/i²)/(Σ 1/i)².

    The probability that two positions hold the same token (independent unigram draws).
    """
    check_size("vocab_size", vocab_size)
    i = np.arange(1, vocab_size + 1, dtype=float)
    return float(np.sum(1 / i ** 2) / np.sum(1 / i) ** 2)


def zipf_ids(vocab_size: int, n_seqs: int, n_tokens: int, seed: int = 0):
    """(n_seqs, n_tokens) int64 token ids drawn i.i.d. from the Zipf law p_i ∝ 1/i (id i − 1), a fixed seed."""
    import torch

    check_size("vocab_size", vocab_size)
    w = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(w / w.sum(), n_seqs * n_tokens, replacement=True, generator=g).view(n_seqs, n_tokens)


def zipf_collision_approx(vocab_size: int, euler: bool = True) -> float:
    """ζ(2)/(ln V + γ)² (``euler``, the ICLR reviewer's form) or ζ(2)/(ln V)² (the paper's), for reference.

    Against `zipf_collision_probability`: with γ, within 0.1 % at V = 1000 (tests/test_moments_units.py); without γ,
    (1 + γ/ln V)² times the form with γ (so high by 2γ/ln V to first order; figures for BERT's and GPT-2's
    vocabularies: docs/moments.md §2).

    Args:
        vocab_size: V (at least 2).
        euler: add the Euler–Mascheroni γ.

    Raises:
        ValueError: ``vocab_size`` below 2 or not an integer.
    """
    check_size("vocab_size", vocab_size, minimum=2)
    return (math.pi ** 2 / 6) / (math.log(vocab_size) + (EULER_GAMMA if euler else 0.0)) ** 2


@dataclass(frozen=True)
class Embedding(Component):
    """x = Σ_t E_t[id_t(position)], table t with i.i.d. N(0, σ_t²) entries, one per ``collisions`` entry;
    ``var`` is σ_t² for every table, or one variance per table.

    ``collisions[t]`` = P(two different positions read the same row of table t): Σ p_i² for the
    token table (`zipf_collision_probability`), 0 for a position table, 1 for a segment table
    that all tokens share. Rows are independent, so
        μ' = 0,  σ'² = Σ_t σ_t²,  Cov' = Σ_t σ_t² collisions[t],  r' = Cov'/σ'²
    (r' = mean(collisions) when the tables share one variance).
    A source: ``fwd`` ignores the input's forward fields (token ids have none). ``bwd`` returns
    the gradient moments of each looked-up vector, which equal those of the output.
    """

    var: float | tuple[float, ...]
    collisions: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.collisions:
            raise ValueError("collisions must name at least one table")
        if not isinstance(self.var, (int, float)) and len(self.var) != len(self.collisions):
            raise ValueError(f"var must be one variance or one per table ({len(self.collisions)}), got {self.var}")
        for v in self.table_vars:
            check_nonneg("var", v)
        for c in self.collisions:
            if not 0.0 <= c <= 1.0:
                raise ValueError(f"collisions entries must be in [0, 1], got {c}")

    @property
    def table_vars(self) -> tuple[float, ...]:
        """σ_t² of each table."""
        if isinstance(self.var, (int, float)):
            return (float(self.var),) * len(self.collisions)
        return tuple(float(v) for v in self.var)

    def fwd(self, m: Moments) -> Moments:
        var = sum(self.table_vars)
        return replace(m, mean=0.0, var=var, corr=ratio(sum(v * c for v, c in zip(self.table_vars, self.collisions)),
                                                        var), norm_disp=0.0, kurtosis=3.0)

    def token_mixing(self) -> Mixing:
        return Mixing.SOURCE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=g_out.grad_var, grad_corr=g_out.grad_corr)


@dataclass(frozen=True)
class PatchEmbedding(Component):
    """ViT input: tokens [cls + E_pos[0]; W_p·patch_j + E_pos[j]], j = 1..``n_patches``, T = 1 + n_patches.

    Pixels i.i.d. N(0, ``pixel_var``), patches disjoint; W_p (d × ``fan_in``, fan_in = C·p²) i.i.d.
    N(0, ``patch_var``), class token N(0, ``cls_var``), position rows N(0, ``pos_var``), all independent
    (a patch bias is zero at init). Per token and feature the mean is 0 and
        Var(cls token) = σ_cls² + σ_pos²,   Var(patch token) = fan_in σ_p² σ_px² + σ_pos²,
    and every pair of different tokens is uncorrelated (distinct position rows, independent patches,
    cls independent of W_p). The cls token is the one token that differs from the others, so the tokens are
    not exchangeable; the state is the token average `measure` records (it pools all tokens):
        σ'² = (Var(cls) + n_patches Var(patch))/T,   r' = 0.
    Downstream maps then treat the cls token like the others, an O(1/T) error in the forward averages
    (none when the two variances agree, as under DSLM). A source, like `Embedding`: ``fwd`` ignores its
    input, ``bwd`` passes the gradient moments through. Norm dispersion (`state`): W_p·patch is Gaussian given
    the patch, whose squared norm spreads as χ²_fan_in, so the patch part carries e = 2/fan_in (to first order) with
    weight (its share of the patch token's variance)², over the n_patches/T patch tokens.
    """

    patch_var: float
    fan_in: int
    pos_var: float
    cls_var: float
    n_patches: int
    pixel_var: float = 1.0

    def __post_init__(self) -> None:
        for name in ("patch_var", "pos_var", "cls_var", "pixel_var"):
            check_nonneg(name, getattr(self, name))
        check_size("fan_in", self.fan_in)
        check_size("n_patches", self.n_patches)

    @property
    def token_vars(self) -> tuple[float, float]:
        """(variance of the cls token, variance of a patch token)."""
        return self.cls_var + self.pos_var, self.fan_in * self.patch_var * self.pixel_var + self.pos_var

    def fwd(self, m: Moments) -> Moments:
        cls, patch = self.token_vars
        share = self.fan_in * self.patch_var * self.pixel_var / patch if patch > 0 else 0.0
        disp = share ** 2 * (2 / self.fan_in) * self.n_patches / (1 + self.n_patches)
        return replace(m, mean=0.0, var=(cls + self.n_patches * patch) / (1 + self.n_patches), corr=0.0,
                       norm_disp=disp, kurtosis=3.0)

    def token_mixing(self) -> Mixing:
        return Mixing.SOURCE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=g_out.grad_var, grad_corr=g_out.grad_corr)


@dataclass(frozen=True)
class ClassToken(Component):
    """The ViT head's read-out of token 0 of ``T``. Forward: the token's moments are taken as the exchangeable
    state's. Backward: a gradient on one token of T has token-averaged variance σ_g²/T and no correlation."""

    T: int

    def fwd(self, m: Moments) -> Moments:
        return m

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=g_out.grad_var / self.T, grad_corr=0.0)
