"""Summed embedding tables (token, position, segment, ...), and the Zipf token-collision probability."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .state import Moments, check_nonneg, check_size, ratio

EULER_GAMMA = 0.5772156649015329


def zipf_collision_probability(vocab_size: int) -> float:
    """Σ p_i² for a Zipf law p_i ∝ 1/i over ``vocab_size`` tokens, exactly: (Σ 1/i²)/(Σ 1/i)².

    The probability that two positions hold the same token (independent unigram draws).
    """
    check_size("vocab_size", vocab_size)
    i = np.arange(1, vocab_size + 1, dtype=float)
    return float(np.sum(1 / i ** 2) / np.sum(1 / i) ** 2)


def zipf_collision_approx(vocab_size: int, euler: bool = True) -> float:
    """ζ(2)/(ln V + γ)² (``euler``, the ICLR reviewer's form) or ζ(2)/(ln V)² (the paper's), for reference.

    Relative error against `zipf_collision_probability`: with γ, below 0.2% for V >= 1000;
    without γ, +12% at V = 30522 (BERT) and +11% at V = 50257 (GPT-2).
    """
    check_size("vocab_size", vocab_size, minimum=2)
    return (math.pi ** 2 / 6) / (math.log(vocab_size) + (EULER_GAMMA if euler else 0.0)) ** 2


@dataclass(frozen=True)
class Embedding:
    """x = Σ_t E_t[id_t(position)], tables with i.i.d. N(0, ``var``) entries, one per ``collisions`` entry.

    ``collisions[t]`` = P(two different positions read the same row of table t): Σ p_i² for the
    token table (`zipf_collision_probability`), 0 for a position table, 1 for a segment table
    that all tokens share. Rows are independent, so
        μ' = 0,  σ'² = T σ_e²,  Cov' = σ_e² Σ_t collisions[t],  r' = mean(collisions).
    A source: ``fwd`` ignores the input's forward fields (token ids have none). ``bwd`` returns
    the gradient moments of each looked-up vector, which equal those of the output.
    """

    var: float
    collisions: tuple[float, ...]

    def __post_init__(self) -> None:
        check_nonneg("var", self.var)
        if not self.collisions:
            raise ValueError("collisions must name at least one table")
        for c in self.collisions:
            if not 0.0 <= c <= 1.0:
                raise ValueError(f"collisions entries must be in [0, 1], got {c}")

    def fwd(self, m: Moments) -> Moments:
        n = len(self.collisions)
        return replace(m, mean=0.0, var=n * self.var, corr=ratio(self.var * sum(self.collisions), n * self.var))

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=g_out.grad_var, grad_corr=g_out.grad_corr)
