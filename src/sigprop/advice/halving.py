r"""Successive halving over a bracket of peak lrs: train every lr of the bracket for a short stretch of the run
itself, keep the best, train those further, and so on; the last one left goes on to the end as the training run.

The arms are the run itself at different peak lrs, same seed and data order, under the run's own warmup and decay
(which span the whole run, so an arm stopped at step n is exactly the first n steps of the full run at that lr:
the trainer's ``train.stop_at``, continued bit-exactly by ``train.resume``). A *rung* at fraction r of the run's
T steps ranks the arms still in by their mean training loss over the last `WINDOW` × T steps up to step
n = round(r T) (at least `MIN_WINDOW` steps; every arm sees the same batches, so the comparison is paired); an
arm whose loss is not finite there is out. After rung j the ``keep[j]`` best go on; the last rung keeps one.

*Cost*, in runs of the target besides the one training run the survivor becomes: an arm cut at rung j spent
r_j of a run, so extra = Σ_j (a_j − k_j) r_j, with a_j arms entering rung j and k_j kept (an arm that diverged
before the rung is counted as if it had run to it).

The bracket is `bracket`: ``arms`` lrs `SPACING` apart, centred on the rule's lr at init
(`sigprop.advice.rule`); its width and the rungs are a `Schedule`. Which schedule, of `SCHEDULES`, is the one
whose held-out regret on the lr benchmark is least among those within `MAX_EXTRA` (docs/advise.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

SPACING = 3.0        # ratio of neighbouring arms
WINDOW = 0.02        # share of the run's steps whose mean training loss ranks the arms at a rung ...
MIN_WINDOW = 3       # ... and the fewest steps it averages
MAX_EXTRA = 0.4      # the most compute a schedule may spend besides the training run, in runs


@dataclass(frozen=True)
class Schedule:
    """``arms`` lrs in the bracket; after rung j, at ``rungs[j]`` × the run's steps, the ``keep[j]`` best go on
    (the last keeps 1)."""

    arms: int
    rungs: tuple[float, ...]
    keep: tuple[int, ...]

    def __post_init__(self) -> None:
        alive = (self.arms, *self.keep)
        if not (len(self.rungs) == len(self.keep) >= 1 and self.keep[-1] == 1
                and all(a > k >= 1 for a, k in zip(alive, self.keep))
                and all(0 <= a < b < 1 for a, b in zip((0.0, *self.rungs), self.rungs))):
            raise ValueError(f"Schedule: rungs {self.rungs} must rise within (0, 1) and keep {self.keep} fall "
                             f"below arms={self.arms} to 1, one keep per rung")

    @property
    def extra(self) -> float:
        """Runs spent besides the survivor's own: Σ_j (a_j − k_j) r_j."""
        alive = (self.arms, *self.keep)
        return sum((a - k) * r for a, k, r in zip(alive, self.keep, self.rungs))

    def __str__(self) -> str:
        cuts = ", ".join(f"{k} kept at {r:g}" for r, k in zip(self.rungs, self.keep))
        return f"{self.arms} lrs ×{SPACING:g} apart; {cuts} (extra {self.extra:.2g} runs)"


SCHEDULES = tuple(s for s in (
    Schedule(3, (0.05,), (1,)), Schedule(3, (0.1,), (1,)), Schedule(3, (0.2,), (1,)),
    Schedule(3, (0.05, 0.2), (2, 1)), Schedule(3, (0.1, 0.3), (2, 1)),
    Schedule(5, (0.05,), (1,)), Schedule(5, (0.1,), (1,)),
    Schedule(5, (0.05, 0.2), (2, 1)), Schedule(5, (0.05, 0.25), (2, 1)),
    Schedule(7, (0.05,), (1,)),
) if s.extra <= MAX_EXTRA + 1e-12)


def bracket(centre: float, arms: int) -> list[float]:
    """``arms`` lrs `SPACING` apart, the middle one (the upper middle for an even count) at ``centre``."""
    return [centre * SPACING ** (k - arms // 2) for k in range(arms)]


def rung_step(fraction: float, steps: int) -> int:
    """The step a rung at ``fraction`` of a run of ``steps`` steps ranks at: round(fraction × steps), at least
    `MIN_WINDOW`."""
    return max(MIN_WINDOW, round(fraction * steps))


def rung_loss(losses: dict[int, float], n: int, steps: int) -> float:
    """The rank of an arm trained ``n`` steps: its mean training loss over its steps n − w + 1 … n, w =
    max(`MIN_WINDOW`, ⌈`WINDOW` × ``steps``⌉) (``losses``: step → the loss of that step, numbered from 1 as the
    trainer logs them); inf if any of them is missing (the arm stopped on a non-finite loss) or not finite."""
    w = max(MIN_WINDOW, math.ceil(WINDOW * steps))
    window = [losses.get(s, math.inf) for s in range(max(1, n - w + 1), n + 1)]
    return sum(window) / len(window) if all(map(math.isfinite, window)) else math.inf


def halve(lrs: Sequence[float], loss_at: Callable[[float, int], float], schedule: Schedule, steps: int
          ) -> tuple[float, list[dict[str, float]]]:
    """Successive halving of ``lrs`` by ``schedule`` for a run of ``steps`` steps. ``loss_at(lr, n)`` trains (or
    reads) the arm at ``lr`` to step n and returns its `rung_loss`. Returns the survivor and, per rung and arm,
    ``{"rung", "step", "lr", "loss"}`` (ties go to the smaller lr; arms all out: the smallest goes on)."""
    alive, log = sorted(lrs), []
    for fraction, keep in zip(schedule.rungs, schedule.keep):
        n = rung_step(fraction, steps)
        ranked = sorted(((loss_at(lr, n), lr) for lr in alive), key=lambda x: (x[0], x[1]))
        log += [{"rung": fraction, "step": n, "lr": lr, "loss": loss} for loss, lr in ranked]
        alive = sorted(lr for _, lr in ranked[:keep])
    return alive[0], log


__all__ = ["MAX_EXTRA", "SCHEDULES", "SPACING", "Schedule", "bracket", "halve", "rung_loss", "rung_step"]
