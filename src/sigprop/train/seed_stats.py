"""Statistics over seeds: the one rule every summary and verdict uses.

For per-seed values v_1..v_n: mean, sample standard deviation (ddof 1; 0 for one seed) and standard error
of the mean std/√n. A seed whose value is not finite (NaN or ±inf: a diverged run) makes mean, std and
se NaN: a mean over the seeds that survived would hide the divergence. ``per_seed`` keeps every value.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np


def seed_stats(values: Iterable[float]) -> dict[str, Any]:
    """{"mean", "std", "se", "per_seed"} of ``values`` by the rule above (no values: NaN, 0 seeds)."""
    v = np.asarray(list(values), dtype=float)
    if not len(v) or not np.isfinite(v).all():
        return {"mean": math.nan, "std": math.nan, "se": math.nan, "per_seed": v.tolist()}
    std = float(v.std(ddof=1)) if len(v) > 1 else 0.0
    return {"mean": float(v.mean()), "std": std, "se": std / math.sqrt(len(v)), "per_seed": v.tolist()}


def mean_curve(curves: Sequence[Sequence[Sequence[float]]], column: int = 1) -> dict[str, list[float]]:
    """Mean, min and max over curves of rows [step, value, ...] (``column`` picks the value), cut to the
    shortest curve."""
    if not curves:
        return {"step": [], "mean": [], "min": [], "max": []}
    n = min(len(c) for c in curves)
    rows = np.asarray([c[:n] for c in curves], dtype=float)                # (curves, n, columns)
    values = rows[:, :, column]
    return {"step": rows[0, :, 0].tolist(), "mean": values.mean(0).tolist(), "min": values.min(0).tolist(),
            "max": values.max(0).tolist()}
