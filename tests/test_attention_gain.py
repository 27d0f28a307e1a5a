"""DeepScaleLM's finite-length attention gain: three closed forms against Monte Carlo of a real layer (the table of
docs/moments.md §7).

G = E[o²]/(d²σ_v²σ_o²σ²) for o = Softmax(x W_q (x W_k)ᵀ/√d_k) x W_v W_o (multi-head, Q, K, V, O ~ N(0, 1/d)),
tokens x_j of unit variance with token correlation r. DSLM's V/O init divides by G, so its error is the attention
branch's variance error. Forms compared, n_i the keys row i reads:

  lognormal   r + (1−r)·mean_i min(1, e^{1−r}/n_i)             (log-normal Σ_j a_ij²)
  ratio       r + (1−r)·mean_i e^{v}/(e^{v} + n_i − 1), v = 1−r (ratio of expectations)
  exact       the `sigprop.theory.moments.Attention` forward map (Gaussian-logit softmax functionals, finite
              width d, d_k)

Width 64, 4 heads, 200 networks × 8 sequences per row (`test_moments_dslm.one_layer`, seed 0), float64, causal and
bidirectional rows of L = 16, 32, 128 at r = 0, 0.1, 0.3, 0.6. The table: ``python -m pytest -m slow -s
tests/test_attention_gain.py``.
"""
from __future__ import annotations

import math

import pytest

from sigprop.theory.moments import Attention, Moments
from test_moments_dslm import HEADS, D, one_layer

pytestmark = pytest.mark.slow

LENGTHS, CORRS, DRAWS = (16, 32, 128), (0.0, 0.1, 0.3, 0.6), 200
FORMS = ("lognormal", "ratio", "exact")


def keys(L: int, causal: bool) -> list[int]:
    """The number of keys each row reads: 1 … L causal, L for every row otherwise."""
    return list(range(1, L + 1)) if causal else [L]


def lognormal(r: float, n: list[int]) -> float:
    return r + (1 - r) * sum(min(1.0, math.exp(1 - r) / m) for m in n) / len(n)


def ratio(r: float, n: list[int]) -> float:
    v = 1 - r
    return r + (1 - r) * sum(math.exp(v) / (math.exp(v) + m - 1) for m in n) / len(n)


def exact(r: float, L: int, causal: bool) -> float:
    return Attention(D, HEADS, L, 1 / D, 1 / D, 1 / D, 1 / D, causal=causal).fwd(Moments(0.0, 1.0, r)).var


def rows() -> list[dict]:
    """One row per (causal, L, r): the Monte-Carlo mean and standard error of G and each form's value."""
    out = []
    for causal in (True, False):
        for L in LENGTHS:
            for r in CORRS:
                var, _ = one_layer(r, L, causal, draws=DRAWS, seed=0)
                out.append(dict(causal=causal, L=L, r=r, mc=var.mean().item(),
                                se=var.std().item() / math.sqrt(DRAWS), lognormal=lognormal(r, keys(L, causal)),
                                ratio=ratio(r, keys(L, causal)), exact=exact(r, L, causal)))
    return out


def table(rs: list[dict]) -> str:
    lines = ["| causal | L | r | Monte Carlo (± s.e.) | lognormal | ratio | exact |", "|---|---|---|---|---|---|---|"]
    for row in rs:
        cells = [f"{row[k]:.4f} ({row[k] / row['mc'] - 1:+.1%})" for k in FORMS]
        lines.append(f"| {row['causal']} | {row['L']} | {row['r']} | {row['mc']:.4f} ± {row['se']:.4f} | "
                     + " | ".join(cells) + " |")
    worst = [max(abs(row[k] / row["mc"] - 1) for row in rs) for k in FORMS]
    return "\n".join([*lines, "| | | | worst relative error | " + " | ".join(f"{w:.1%}" for w in worst) + " |"])


def test_the_exact_gain_matches_monte_carlo_where_the_closed_forms_miss():
    """The exact map within 2% + 2 standard errors of every row (measured: ≤ 1.9%, s.e. ≤ 0.8%); the log-normal
    form misses by more than 30% and the ratio form by more than 10% somewhere (short causal rows)."""
    rs = rows()
    print(table(rs))
    for row in rs:
        assert abs(row["exact"] - row["mc"]) < 0.02 * row["mc"] + 2 * row["se"], row
    for form, miss in (("lognormal", 0.3), ("ratio", 0.1)):
        assert any(abs(row[form] / row["mc"] - 1) > miss and abs(row[form] - row["mc"]) > 5 * row["se"]
                   for row in rs), form
