"""Every moment map against Monte Carlo of the real torch op (tests/moments_mc.py).

Bar (per component and quantity, over the family's grid): median error < 2% and 99th
percentile < 10%. The bar only tests the theory if the Monte-Carlo noise is well below it, so
each family also asserts that its median standard error (10 blocks of samples, control
variates for the shared token factor) is below 1%; sample sizes are set for that.
"""
from __future__ import annotations

import pytest
import torch.nn.functional as F

from moment_errors import ErrorRow, error_table, format_error_table
from moments_mc import FAMILIES, AuthorsLayerNorm, AuthorsSoftmax, Case, family_rows, pointwise
from sigprop.theory.moments import LayerNorm, Moments, ReLU, Softmax

MEDIAN, P99, MAX_SE = 0.02, 0.10, 0.01


def failures(rows: list[ErrorRow]) -> list[str]:
    """(component, quantity) groups that miss the bar."""
    return [f"{c}/{q}: p50 {s['p50']:.3%} p99 {s['p99']:.3%}" for (c, q), s in error_table(rows).items()
            if s["p50"] >= MEDIAN or s["p99"] >= P99]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_monte_carlo(family: str) -> None:
    rows = [r for r in family_rows(family, FAMILIES[family]()) if r.component == family]
    table = error_table(rows)
    assert table, "no rows"
    for (comp, qty), s in table.items():
        assert s["mc_se"] < MAX_SE, f"{comp}/{qty}: Monte-Carlo noise {s['mc_se']:.2%} too large to test the bar"
    assert not failures(rows), failures(rows)


class HalfSquareReLU(ReLU):
    """A classic slip: the variance of relu(x) taken as E[relu²] = σ²/2 (the second moment)."""

    def fwd(self, m: Moments) -> Moments:
        out = super().fwd(m)
        return Moments(out.mean, m.var / 2, out.corr)


def test_checker_rejects_wrong_formulas() -> None:
    """Tests that cannot fail are defects: wrong maps must miss the bar on the same simulations."""
    cases = [Case(f"r{r}", HalfSquareReLU(), Moments(0.0, 1.0, r), pointwise(F.relu), (2048, 2, 64))
             for r in (0.0, 0.5)]
    assert failures([r for r in family_rows("half-square relu", cases) if r.component == "half-square relu"])
    # the authors' LayerNorm (r(1 − 1/d), σ_g²/σ²) at small width, and their softmax approximations
    ln8 = pointwise(lambda x: F.layer_norm(x, (8,), eps=1e-12))
    ln = [Case(f"r{r}", LayerNorm(8), Moments(0.0, 1.0, r, 1.0, 0.3), ln8, (8192, 4, 8),
               others=(("authors", AuthorsLayerNorm(8)),)) for r in (0.5, 0.9)]
    rows = family_rows("ours", ln)
    assert not failures([r for r in rows if r.component == "ours"])
    assert failures([r for r in rows if r.component == "authors"])
    sm = family_rows("ours", [Case("", Softmax(8), Moments(0.0, 1.0, 0.0), pointwise(lambda x: x.softmax(1)),
                                   (1024, 8, 64), others=(("V1", AuthorsSoftmax(8, False)),))])
    assert not failures([r for r in sm if r.component == "ours"])
    assert failures([r for r in sm if r.component == "V1"])


def test_error_table_and_format() -> None:
    rows = [ErrorRow("c", "var", 1.0 + e, 1.0) for e in (0.0, 0.01, 0.02, 0.03)] + [ErrorRow("c", "cov", 0.1, 0.0, 1.0)]
    table = error_table(rows)
    assert table[("c", "var")]["n"] == 4
    assert table[("c", "var")]["p50"] == pytest.approx(0.015)
    assert table[("c", "var")]["p99"] == pytest.approx(0.0297)
    assert table[("c", "cov")]["p50"] == pytest.approx(0.1)       # scale-aware: |0.1 − 0| / max(0, 1)
    text = format_error_table(table)
    assert text.splitlines()[0].startswith("| component | quantity |")
    assert "| c | var | 4 | 1.50 | 2.70 | 2.97 |" in text
