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
(`sigprop.advice.rule`); its width and the rungs are a `Schedule`. For a budget, `schedule_for` takes the schedule of
`SCHEDULES` within it whose regret on the lr benchmark is least (``data/halving_scores.py``, each config's bracket
centred by the rule refitted without its family; docs/advise.md has the held-out figures). `advise_by_halving`
runs it on a run config: the arms are runs under ``out``, and the survivor's folder, stopped at the last rung, is
the training run to continue (``train.resume``).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..console import UserError
from ..train.config import RunConfig

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


def train_losses(run_dir: str | Path) -> dict[int, float]:
    """Step → training loss of a run's ``metrics.jsonl`` (a step logged twice, around a resume: the later)."""
    from ..train.logging import read_jsonl
    path = Path(run_dir) / "metrics.jsonl"
    return {r["step"]: r["loss"] for r in read_jsonl(path, "train")} if path.exists() else {}


def schedule_for(budget: float) -> Schedule:
    """The schedule of `SCHEDULES` whose extra cost is within ``budget`` (runs) with the least mean regret on the
    lr benchmark (``data/halving_scores.py``), the cheaper on a tie. UserError (a ValueError) if none fits, naming
    the least budget that would do."""
    from .data.halving_scores import SCORES

    fits = [r for r in SCORES if r["extra"] <= budget + 1e-12]
    if not fits:
        least = min(r["extra"] for r in SCORES)
        raise UserError(f"--budget {budget:g}: successive halving needs at least {least:.2g} of one training run")
    best = min(fits, key=lambda r: (r["mean_regret"], r["extra"]))
    return Schedule(best["arms"], tuple(best["rungs"]), tuple(best["keep"]))


@dataclass(frozen=True)
class HalvingAdvice:
    """What successive halving did on the run and what it says of it (module docstring)."""

    recommended_lr: float
    schedule: str                                    # `Schedule.__str__`
    rungs: list[dict[str, float]]                    # per rung and arm: rung, step, lr, loss (`halve`)
    run_dir: str                                     # the survivor's run, stopped at the last rung
    resume_step: int                                 # the step it stopped at
    predictions: list[dict[str, Any]]                # per asked lr: lr, outcome, reason (the rule's at init)
    cost: float                                      # the cut arms' steps, in training runs of the run
    cost_s: float                                    # wall seconds, the probe and the arms
    collapsed: bool = False
    target: Any = field(default=None, repr=False)    # the run's `Advice` at init

    def table(self) -> str:
        """The terminal table."""
        from .advise import unbounded_note

        rows = [f"successive halving: {self.schedule}, centred on the rule's lr at init "
                f"{self.target.recommended_lr:.3g}" if self.target else self.schedule]
        rows += [f"  rung {r['rung']:g} (step {r['step']:.0f})  lr {r['lr']:10.3g}  train loss {r['loss']:.4f}"
                 for r in self.rungs]
        rows.append(f"recommended lr       {self.recommended_lr:.3g}")
        if self.target is not None and self.target.scale_invariant:
            rows.append(unbounded_note(self.target.scale_invariant) + "; the bracket is centred below that bound")
        if self.collapsed:
            rows.append("the run's stack is rank-collapsed at init: it stalls at every lr (nothing trained)")
        else:
            rows.append(f"its run, stopped at step {self.resume_step}: {self.run_dir}; to continue it: sigprop train "
                        f"--config RUN.toml --set optim.lr={self.recommended_lr:g} train.out_dir={self.run_dir} "
                        "train.resume=true")
        rows += [f"  {'lr':>10s}  {'outcome':9s}  reason"]
        rows += [f"  {p['lr']:10.3g}  {p['outcome']:9s}  {p['reason']}" for p in self.predictions]
        rows.append(f"cost: {self.cost:.2g} of one training run besides the run it leaves, {self.cost_s:.0f} s")
        return "\n".join(rows)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (the run's own rule-based report under ``target``)."""
        from .advise import with_target
        return with_target(self)


def arm_folder(cfg: RunConfig, lr: float, out: str | Path) -> Path:
    """The folder under ``out`` of ``cfg``'s arm at peak ``lr``, named by the hash of its run tables (a rerun
    reuses it)."""
    tables = cfg.to_dict()
    del tables["train"]["out_dir"]
    tables["optim"]["lr"] = lr
    tag = hashlib.sha1(json.dumps(tables, sort_keys=True).encode()).hexdigest()[:12]
    return Path(out) / f"lr{lr:g}-{tag}"


def train_arm(cfg: RunConfig, lr: float, n: int, out: str | Path) -> float:
    """Train ``cfg`` at peak ``lr`` to step ``n`` in its `arm_folder` (from the arm's last checkpoint if it has one:
    ``train.stop_at``, ``train.resume``) and return its `rung_loss` there."""
    from ..train.config import from_mapping
    from ..train.one_run import run_once

    run_dir = arm_folder(cfg, lr, out)
    losses = train_losses(run_dir)
    if max(losses, default=0) < n and not any(not math.isfinite(x) for x in losses.values()):
        raw = cfg.to_dict()
        raw["optim"]["lr"] = lr
        raw["train"].update(out_dir=str(run_dir), stop_at=n, resume=True, fresh_if_none=True, progress=False)
        run_once(from_mapping(RunConfig, raw))
        losses = train_losses(run_dir)
    return rung_loss(losses, n, cfg.train.steps)


def advise_by_halving(cfg: RunConfig, budget: float = 0.5, lrs: Sequence[float] | None = None,
                      out: str | Path = "runs/advise-halving", progress: bool = True) -> HalvingAdvice:
    """Successive halving on the run ``cfg`` within ``budget`` (`schedule_for`) over the bracket centred on its
    rule-based lr at init (`sigprop.advice.advise`); ``lrs``: the run's peak lrs whose outcome to predict (default
    its ``optim.lr``; the rule's outcomes); the arms are runs under ``out``. A stack rank-collapsed at init stalls
    at every lr and trains nothing."""
    from ..console.progress import bar
    from .advise import DEFAULT_RULE, advise

    start = time.perf_counter()
    schedule = schedule_for(budget)
    asked = [cfg.optim.lr] if lrs is None else list(lrs)
    target = advise(cfg, lrs=asked)
    if target.rank_collapse >= DEFAULT_RULE.collapse:
        predictions = [{"lr": lr, "outcome": "stalls", "reason": "rank-collapsed at init"} for lr in asked]
        return HalvingAdvice(target.recommended_lr, str(schedule), [], "", 0, predictions, 0.0,
                             time.perf_counter() - start, True, target)
    arms = [float(f"{x:.3g}") for x in bracket(target.recommended_lr, schedule.arms)]
    total = schedule.arms + sum(schedule.keep[:-1])
    shown = bar(total, "halving (arms to rungs)", enabled=progress)

    def loss_at(lr: float, n: int) -> float:
        loss = train_arm(cfg, lr, n, out)
        shown.update(1)
        return loss
    try:
        lr, log = halve(arms, loss_at, schedule, cfg.train.steps)
    finally:
        shown.close()
    step = rung_step(schedule.rungs[-1], cfg.train.steps)
    return HalvingAdvice(lr, str(schedule), log, str(arm_folder(cfg, lr, out)), step, target.predictions,
                         schedule.extra, time.perf_counter() - start, False, target)


__all__ = ["MAX_EXTRA", "SCHEDULES", "SPACING", "HalvingAdvice", "Schedule", "advise_by_halving", "arm_folder",
           "bracket", "halve", "rung_loss", "rung_step", "schedule_for", "train_arm", "train_losses"]
