"""Which checkpoint is safe to resume from after a NaN stop: the newest "last good" one.

A training step is *healthy* when its loss and gradient norm are finite and the loss is at most
``SPIKE`` times the lowest training loss of the steps before it. A checkpoint taken after step s
is *good* when step s + 1, the first step taken from it, was healthy: its weights and optimizer
state still train. Divergence usually shows as a loss spike some steps before the loss turns
NaN, so the newest checkpoint is often already blown up; the newest good one is the one to resume
from (with a lower learning rate).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

SPIKE = 2.0   # a loss above SPIKE × the best loss so far marks the step unhealthy


def healthy(loss: float, grad_norm: float, best: float) -> bool:
    """Finite loss and gradient norm, and no spike: loss <= SPIKE · best (any finite loss if no best yet)."""
    return math.isfinite(loss) and math.isfinite(grad_norm) and (not math.isfinite(best) or loss <= SPIKE * best)


class LastGood:
    """Follows the checkpoints and steps of a run; ``good`` is the newest checkpoint whose next step was healthy.

    ``saved(path)`` after each checkpoint, ``observe(loss, grad_norm)`` after each step's loss is
    known (before it is applied); ``meta()`` goes into the checkpoint so a resumed run knows both.
    """

    def __init__(self, good: Path | None = None, best: float = math.inf) -> None:
        self.good, self.best = good, best
        self.pending: Path | None = None        # the checkpoint whose next step has not run yet

    @classmethod
    def from_record(cls, path: Path, record: dict[str, Any]) -> LastGood:
        """State after resuming from the checkpoint ``path`` with JSON ``record`` (its next step decides it)."""
        name = record.get("last_good")
        earlier = Path(path).parent / name if name else None
        best = record.get("best_loss")                  # None: no finite loss seen before that checkpoint
        tracker = cls(earlier if earlier is not None and earlier.exists() else None,
                      math.inf if best is None else float(best))
        tracker.pending = Path(path)
        return tracker

    def saved(self, path: Path | None) -> None:
        self.pending = path

    def observe(self, loss: float, grad_norm: float) -> bool:
        """Record one step; returns whether it was healthy."""
        ok = healthy(loss, grad_norm, self.best)
        if ok and self.pending is not None:
            self.good = self.pending
        self.pending = None
        if math.isfinite(loss):
            self.best = min(self.best, loss)
        return ok

    def meta(self) -> dict[str, Any]:
        """JSON extras for the next checkpoint: the good checkpoint before it and the best loss so far."""
        return {"last_good": self.good.name if self.good is not None else None,
                "best_loss": self.best if math.isfinite(self.best) else None}
