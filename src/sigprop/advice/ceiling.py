r"""How well successive halving can do when it is handed a bracket that holds the optimum: the ceiling of every
halving design within a cost, measured on the lr benchmark's grid runs.

Successive halving (`sigprop.advice.halving`) ranks its arms by their training loss at rungs early in the run. Its
regret has two sources: a bracket that misses the optimum (the rule that centres it is off), and a rung whose
leader is not the arm that ends best (the early ranking is not the final one). This module removes the first. For a
config and a `Schedule` of a arms, each bracket of a adjacent grid lrs that holds the grid's best lr is one a rule
placing its bracket within reach of the optimum may have chosen, and which of them it gets the rule cannot tell; the
*ceiling* is halving's regret on the worst of them (the arms read off the grid runs, as
`sigprop.advice.benchmark.halve_on_grid` reads them), beside its mean over them. A design whose ceiling misses a
target misses it whatever rule centres its bracket. The benchmark's grids are ×3 apart, the arms' `SPACING`.

    python -m sigprop.advice.ceiling docs/results/lr-benchmark-current.json \
        docs/results/lr-benchmark-modern-encoder.json
    python -m sigprop.advice.ceiling --runs runs/advise-bench        # the families the shipped data were made from

The schedules scored are `schedules`: every single-rung schedule of 2, 3 or 5 arms at a rung of `RUNGS` within
``cost`` runs besides the training run, and the shipped two-rung ones within it.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Sequence

from .benchmark import FITTED_FAMILIES, NEAR, Config, halve_on_grid, load, load_json
from .halving import SCHEDULES, Schedule

RUNGS = (0.05, 0.1, 0.2, 0.3, 0.5)
COST = 0.5          # the most a design may spend besides the training run, in runs


def schedules(cost: float = COST) -> list[Schedule]:
    """Every `Schedule` of 2, 3 or 5 arms with one rung at a fraction in `RUNGS`, and the two-rung ones of
    `SCHEDULES`, whose extra cost is at most ``cost`` runs; cheapest first."""
    single = [Schedule(a, (r,), (1,)) for a in (2, 3, 5) for r in RUNGS]
    return sorted({s for s in single + [s for s in SCHEDULES if len(s.rungs) > 1] if s.extra <= cost + 1e-12},
                  key=lambda s: (s.extra, s.arms, s.rungs))


def placements(c: Config, arms: int) -> list[float]:
    """The centres of the brackets of ``arms`` adjacent grid lrs of ``c`` that hold its best lr (the bracket's middle
    lr, the upper middle for an even count, as `sigprop.advice.halving.bracket` places it)."""
    best = c.losses.index(c.best)
    return [c.lrs[lo + arms // 2] for lo in range(max(0, best - arms + 1), min(best, len(c.lrs) - arms) + 1)]


def regrets(c: Config, schedule: Schedule) -> list[float]:
    """Halving's regret on ``c`` by ``schedule`` for each bracket of `placements` (empty when ``c`` has no curves
    or fewer grid lrs than arms, which leaves no bracket)."""
    if not c.curves:
        return []
    return [c.regret([halve_on_grid(c, centre, schedule)]) for centre in placements(c, schedule.arms)]


def table(configs: Sequence[Config], cost: float = COST) -> str:
    """Per schedule of `schedules`: its cost, then over ``configs`` the worst placement's mean regret and share
    within `NEAR` of the best, and the same averaged over the placements (each config weighs one); a Markdown
    table (a schedule with more arms than every config's grid is left out)."""
    scored = [c for c in configs if c.curves]
    lines = [f"{len(scored)} configs with curves; regret of halving handed a bracket that holds the optimum",
             "", "| schedule | cost (runs) | worst placement: mean regret | ≤ 0.05 | over placements: mean regret "
             "| ≤ 0.05 |", "|---|---|---|---|---|---|"]
    for s in schedules(cost):
        per = [r for r in (regrets(c, s) for c in scored) if r]
        if not per:
            continue
        worst = [max(r) for r in per]
        lines.append(f"| {s} | {s.extra:.2g} | {statistics.fmean(worst):.3f} | "
                     f"{sum(w <= NEAR for w in worst)}/{len(worst)} | "
                     f"{statistics.fmean(statistics.fmean(r) for r in per):.3f} | "
                     f"{statistics.fmean(sum(x <= NEAR for x in r) / len(r) for r in per):.0%} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sigprop.advice.ceiling", description=__doc__.split("\n")[0])
    p.add_argument("json", nargs="*", help="benchmark JSONs written with --json (they keep the runs' curves)")
    p.add_argument("--runs", default=None, help="also the family sweeps under this folder (`benchmark.load`)")
    p.add_argument("--families", nargs="+", default=list(FITTED_FAMILIES), help="with --runs: the families to load")
    p.add_argument("--cost", type=float, default=COST, help="the most a schedule may spend besides the run, in runs")
    args = p.parse_args(argv)
    configs = [c for path in args.json for c in load_json(Path(path))]
    if args.runs:
        configs += load(Path(args.runs), args.families)
    if not any(c.curves for c in configs):
        raise SystemExit("no config with training curves (a benchmark JSON written with --json, or --runs)")
    print(table(configs, args.cost))


if __name__ == "__main__":
    main()
