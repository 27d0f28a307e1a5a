"""Scale-aware errors of predicted moments against measured ones, and the percentile table (test harness of
`moments_mc` and `test_moments_mc`).

Error of one prediction (``scaled_error``): |pred − emp| / max(|emp|, scale), with
``scale`` = the measured standard deviation for a mean, the measured variance for a
covariance (so a covariance error is the error of the correlation, since covariances can be
arbitrarily close to 0), and 0 for a variance (plain relative error).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


def scaled_error(pred: float, emp: float, scale: float = 0.0) -> float:
    """|pred − emp| / max(|emp|, scale)."""
    den = max(abs(emp), scale)
    return abs(pred - emp) / den if den > 0 else abs(pred - emp)


@dataclass(frozen=True)
class ErrorRow:
    """One predicted-vs-measured comparison; ``se`` is the Monte-Carlo standard error in the same units."""

    component: str
    quantity: str
    pred: float
    emp: float
    scale: float = 0.0
    se: float = 0.0

    @property
    def error(self) -> float:
        return scaled_error(self.pred, self.emp, self.scale)

    @property
    def rel_se(self) -> float:
        return scaled_error(self.emp + self.se, self.emp, self.scale)


def error_table(rows: Iterable[ErrorRow]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (component, quantity): count n, 50/90/99th percentiles of the error and median MC error."""
    groups: dict[tuple[str, str], list[ErrorRow]] = {}
    for row in rows:
        groups.setdefault((row.component, row.quantity), []).append(row)
    table = {}
    for key, rs in groups.items():
        err = np.array([r.error for r in rs])
        table[key] = {"n": len(rs), "p50": float(np.percentile(err, 50)), "p90": float(np.percentile(err, 90)),
                      "p99": float(np.percentile(err, 99)), "mc_se": float(np.median([r.rel_se for r in rs]))}
    return table


def format_error_table(table: dict[tuple[str, str], dict[str, float]]) -> str:
    """Markdown table, errors in %."""
    lines = ["| component | quantity | n | p50 % | p90 % | p99 % | MC s.e. % |", "|---|---|---|---|---|---|---|"]
    for (comp, qty), s in sorted(table.items()):
        lines.append(f"| {comp} | {qty} | {s['n']} | {100 * s['p50']:.2f} | {100 * s['p90']:.2f} | "
                     f"{100 * s['p99']:.2f} | {100 * s['mc_se']:.2f} |")
    return "\n".join(lines)
