"""Where the best learning rate of a grid sits, and the lr one grid step beyond its edge.

A *grid* is an ascending list of peak lrs with one loss each (NaN or ±inf = diverged). Its best lr η* is
the lr of the lowest finite loss (ties: the smallest lr); η* is *at an edge* when it is the smallest or the
largest lr of the grid, so the optimum may lie outside it. A grid of one lr brackets nothing: its only lr
is at an edge. One grid step beyond an edge is the ratio of the two outermost lrs on that side (× above
the top, ÷ below the bottom), rounded to 3 significant digits (0.1²/0.03 lands on 0.333, not 0.3333…).
"""
from __future__ import annotations

import math
from typing import Literal, Sequence

Direction = Literal["up", "down"]


def best_lr(lrs: Sequence[float], losses: Sequence[float]) -> tuple[float | None, bool]:
    """(η*, whether η* is the smallest or largest lr of ``lrs``); (None, False) when every lr diverged."""
    finite = [(loss, lr) for lr, loss in zip(lrs, losses) if math.isfinite(loss)]
    if not finite:
        return None, False
    lr = min(finite)[1]
    return lr, lr in (min(lrs), max(lrs))


def step_beyond(lrs: Sequence[float], direction: Direction) -> float:
    """The lr one grid step above the top (``"up"``) or below the bottom (``"down"``) of ascending ``lrs``."""
    if len(lrs) < 2:
        raise ValueError(f"an lr grid needs at least 2 values to extend, got {list(lrs)}")
    if direction not in ("up", "down"):
        raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
    lr = lrs[-1] * lrs[-1] / lrs[-2] if direction == "up" else lrs[0] * lrs[0] / lrs[1]
    return float(f"{lr:.3g}")


def next_lr(lrs: Sequence[float], losses: Sequence[float]) -> tuple[float, Direction] | None:
    """The lr that brackets the optimum of ascending ``lrs`` one step beyond the edge holding η*, and the
    direction; None when η* is inside the grid. Every lr diverged: one step down."""
    lr, edge = best_lr(lrs, losses)
    if lr is not None and not edge:
        return None
    direction: Direction = "up" if lr == lrs[-1] and lr != lrs[0] else "down"
    return step_beyond(lrs, direction), direction
