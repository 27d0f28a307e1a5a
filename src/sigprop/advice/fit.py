r"""The fit of the advice's constants (`Rule`) on calibration sweeps, and the module that ships them.

    python -m sigprop.advice.fit TABLE.json            # fit on a calibration table, print the constants
    python -m sigprop.advice.fit TABLE.json --write    # ... and rewrite sigprop/advice/data/fitted.py

A *config* (`Case`) is a sweep point without its lr: advise's probe at init (`Probe`, with the last block's token
correlation), the run's β₁, its schedule area A = Σ_t lr_t/η and the unigram loss of its data, and its runs over
the lr grid (`GridRun`). A calibration table is a JSON list of such configs (`save_table`, `load_table`); the lr
benchmark (`sigprop.advice.benchmark`, ``--table``) writes one from its families' sweeps, data/calibration.json, the
table the shipped constants are fitted on.

Achieved outcome of a run: ``trains`` if it ends at least 0.1 nats below the unigram loss (`trains`); else
``diverges`` if its loss became non-finite or its lr is above the largest lr of its config that trains (with AdamW
and gradient clipping a too-large lr mostly sends the model back to the unigram plateau rather than to inf); else
``stalls``. A run's loss is its final loss, its initial loss if it diverged. Regret of an lr on a config: the loss at
that lr (linear in log lr between grid lrs, the nearest grid lr's outside the grid) minus the grid's best.

The fit (`fit`), each constant chosen on the calibration configs' own runs, outcomes first:

1. ``edge_basis``, ``top`` and ``kappa``: for every lr scale measurable on every config, ``top`` (a power of 2^¼
   times it), then ``kappa`` (a power of 2^¼), then ``top`` again, each maximising the outcome balanced accuracy
   over every (config, grid lr); the scale with the highest (ties keep the smaller change, and the scale listed
   first in `LIMITS`);
2. ``basis`` and ``best``: for every scale and the window √(η_min η_max) of step 1, the power of 2^¼ (2⁻⁸ … 2⁸)
   times it with the lowest mean regret of the advice (clipped into that window); the basis with the lowest;
3. [``lo``, ``hi``]: the 10 % and 90 % quantiles of best grid lr / basis lr over the configs whose best run trains
   (widened to hold ``best``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from ..records import Record
from ..train.levels import trains
from .probe import Probe
from .rule import LIMITS, OUTCOMES, WINDOW, Decision, Rule, decide, limits, outcome

FITTED = Path(__file__).resolve().parent / "data" / "fitted.py"
STEP = 0.25                          # the constants' grid: powers of 2^STEP


@dataclass(frozen=True)
class GridRun:
    """One run of a config's lr grid."""

    lr: float                        # peak lr
    final_loss: float                # final held-out loss (nan when it became non-finite)
    initial_loss: float              # held-out loss at init
    diverged: bool                   # the trainer stopped it as diverged

    @property
    def loss(self) -> float:
        """The run's final loss, its initial loss if it diverged."""
        return self.final_loss if math.isfinite(self.final_loss) else self.initial_loss


@dataclass(frozen=True)
class Case:
    """One calibration config: what `decide` needs at init, and its runs over the lr grid (ascending lr)."""

    name: str
    beta1: float                     # AdamW's β₁
    area: float                      # Σ_t lr_t / peak over the run's schedule (`schedule_area`)
    unigram: float                   # unigram loss of the run's data (nats)
    probe: Probe                     # advise's probe at init; its one record carries the last block's correlation
    runs: tuple[GridRun, ...]

    @cached_property
    def scales(self) -> dict[str, float]:
        """The lr scales η_k of the probe (`limits`)."""
        return limits(self.probe, self.beta1)

    @cached_property
    def achieved(self) -> tuple[str, ...]:
        """The achieved outcome of each run (module docstring), in the order of ``runs``."""
        ok = [trains(r.final_loss, self.unigram) for r in self.runs]
        top = max((r.lr for r, t in zip(self.runs, ok) if t), default=math.inf)
        return tuple("trains" if t else "diverges" if r.diverged or not math.isfinite(r.final_loss) or r.lr > top
                     else "stalls" for r, t in zip(self.runs, ok))

    @property
    def best_loss(self) -> float:
        """The lowest loss over the grid."""
        return min(r.loss for r in self.runs)

    @property
    def best_lr(self) -> float | None:
        """The grid lr of the lowest loss if that run trains, else None (no optimum to aim at)."""
        i = min(range(len(self.runs)), key=lambda k: self.runs[k].loss)
        return self.runs[i].lr if self.achieved[i] == "trains" else None

    def loss_at(self, lr: float) -> float:
        """The loss at ``lr``: linear in log lr between grid lrs, the nearest grid lr's outside the grid."""
        return float(np.interp(math.log(lr), [math.log(r.lr) for r in self.runs], [r.loss for r in self.runs]))

    def regret(self, lr: float) -> float:
        """``loss_at(lr)`` minus the grid's best loss (nats)."""
        return self.loss_at(lr) - self.best_loss

    def decide(self, rule: Rule) -> Decision:
        """``rule`` applied to this config's probe, for its run."""
        return decide(self.probe, self.beta1, self.area, self.unigram, rule)


def last_record(corr: float) -> Record:
    """The one record `decide` reads: a last block with token correlation ``corr``."""
    return Record(layer=1, sublayer="mlp", fwd_mean=0.0, fwd_var=1.0, token_corr=corr)


def balanced_accuracy(pairs: Sequence[tuple[str, str]]) -> float:
    """Mean over the achieved outcomes present of the share predicted right, over (achieved, predicted) pairs."""
    return statistics.fmean(statistics.fmean(p == k for a, p in pairs if a == k)
                            for k in OUTCOMES if any(a == k for a, _ in pairs))


def outcome_pairs(cases: Sequence[Case], rule: Rule) -> list[tuple[str, str]]:
    """(achieved, predicted) outcome of every run of every config under ``rule``."""
    out = []
    for c in cases:
        d = c.decide(rule)
        out += [(a, outcome(r.lr, d)[0]) for r, a in zip(c.runs, c.achieved)]
    return out


def mean_regret(cases: Sequence[Case], rule: Rule) -> float:
    """The mean over the configs of the regret of ``rule``'s recommended lr."""
    return statistics.fmean(c.regret(c.decide(rule).recommended) for c in cases)


def factors(lo: float, hi: float) -> list[float]:
    """Powers of 2 from 2^lo to 2^hi in steps of 2^`STEP`."""
    return [2.0 ** (lo + STEP * i) for i in range(int(round((hi - lo) / STEP)) + 1)]


def usable_scales(cases: Sequence[Case]) -> list[str]:
    """The lr scales (`LIMITS`) finite on every config."""
    return [k for k in LIMITS if all(math.isfinite(c.scales[k]) for c in cases)]


def fitted_best(cases: Sequence[Case], rule: Rule, basis: str) -> Rule:
    """``rule`` read from ``basis``, ``best`` the power of 2^¼ times it (2⁻⁸ to 2⁸) with the lowest mean regret
    (its interval left wide: the interval does not move the advice)."""
    wide = replace(rule, basis=basis, lo=2.0 ** -8, hi=2.0 ** 8)
    return min((replace(wide, best=f) for f in factors(-8, 8)), key=lambda r: mean_regret(cases, r))


def log_ratios(cases: Sequence[Case], rule: Rule) -> list[float]:
    """log(best grid lr / the rule's basis lr) over the configs whose best run trains."""
    out = []
    for c in cases:
        base = c.decide(rule).base
        if c.best_lr is not None and math.isfinite(base) and base > 0:
            out.append(math.log(c.best_lr / base))
    return out


def fit(cases: Sequence[Case]) -> Rule:
    """The `Rule` fitted on ``cases`` (module docstring, steps 1-3); its other fields keep their defaults."""
    bal = lambda r: balanced_accuracy(outcome_pairs(cases, r))

    def tuned(edge_basis: str) -> Rule:
        r = Rule(edge_basis=edge_basis, top=1.0, kappa=1.0, lo=2.0 ** -8, hi=2.0 ** 8)
        for name in ("top", "kappa", "top"):
            now = getattr(r, name)
            options = sorted((replace(r, **{name: now * f}) for f in factors(-12, 12)),
                             key=lambda x: abs(math.log(getattr(x, name) / now)))
            r = max(options, key=bal)
        return r

    scales = usable_scales(cases)
    rule = max((tuned(k) for k in scales), key=bal)
    rule = min((fitted_best(cases, rule, k) for k in (*scales, WINDOW)), key=lambda r: mean_regret(cases, r))
    lo, hi = (math.exp(v) for v in np.quantile(log_ratios(cases, rule), [0.1, 0.9]))
    return replace(rule, lo=min(lo, rule.best), hi=max(hi, rule.best))


PROBE_FIELDS = tuple(f.name for f in fields(Probe) if f.name != "records")


def case_row(c: Case) -> dict:
    """A config as one JSON row of a calibration table (non-finite floats as strings, which JSON lacks)."""
    num = lambda x: x if math.isfinite(x) else str(x)
    probe = {k: getattr(c.probe, k) for k in PROBE_FIELDS}
    probe["line"] = [[lr, num(loss)] for lr, loss in probe["line"]]
    return {"name": c.name, "beta1": c.beta1, "area": c.area, "unigram": c.unigram,
            "last_corr": c.probe.records[-1].token_corr, "probe": {k: v if k == "line" else num(v)
                                                                   for k, v in probe.items()},
            "runs": [{**asdict(r), "final_loss": num(r.final_loss)} for r in c.runs]}


def row_case(row: dict) -> Case:
    """The inverse of `case_row`."""
    probe = {k: float(v) if k != "line" else tuple((lr, float(loss)) for lr, loss in v)
             for k, v in row["probe"].items()}
    return Case(row["name"], row["beta1"], row["area"], row["unigram"],
                Probe(records=(last_record(row["last_corr"]),), **probe),
                tuple(GridRun(r["lr"], float(r["final_loss"]), r["initial_loss"], r["diverged"])
                      for r in row["runs"]))


def save_table(cases: Sequence[Case], path: Path) -> None:
    """Write a calibration table (one row per config, `case_row`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[\n" + ",\n".join(json.dumps(case_row(c)) for c in cases) + "\n]\n")


def load_table(path: Path) -> list[Case]:
    """Read a calibration table written by `save_table`."""
    return [row_case(row) for row in json.loads(Path(path).read_text())]


def constants(rule: Rule) -> dict[str, float | str]:
    """The fitted fields of a `Rule` (those `fit` chooses)."""
    return {k: getattr(rule, k) for k in ("basis", "best", "lo", "hi", "edge_basis", "top", "kappa")}


def module_text(rule: Rule, data: str, commit: str) -> str:
    """The source of `FITTED`: the fitted constants under a header naming the data and the commit they came from."""
    lines = ["r'''The `Rule` constants fitted by `sigprop.advice.fit`; `rule.Rule` takes them as its defaults.",
             "",
             "Written by `python -m sigprop.advice.fit TABLE --write` at COMMIT from the calibration table DATA names",
             "(the lr benchmark's: `python -m sigprop.advice.benchmark --runs runs/advise-bench --table TABLE`); do",
             "not edit by hand.",
             "'''",
             "",
             "DATA = (" + "\n        ".join(map(repr, textwrap.wrap(data, 100, drop_whitespace=False))) + ")",
             f"COMMIT = {commit!r}",
             "CONSTANTS = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in constants(rule).items()]
    return "\n".join([*lines, "}", ""])


def _commit() -> str:
    """The checkout's HEAD commit ("unknown" outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sigprop.advice.fit TABLE [--write]`` (module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m sigprop.advice.fit", description=__doc__.split("\n")[0])
    ap.add_argument("table", type=Path, help="calibration table (JSON, `save_table`)")
    ap.add_argument("--write", action="store_true", help=f"rewrite {FITTED.name} with the fitted constants")
    args = ap.parse_args(argv)
    cases = load_table(args.table)
    rule = fit(cases)
    print(json.dumps(constants(rule), indent=1))
    if args.write:
        digest = hashlib.sha256(args.table.read_bytes()).hexdigest()[:16]
        data = f"{args.table} (sha256 {digest}): {len(cases)} configs, {sum(len(c.runs) for c in cases)} runs"
        FITTED.write_text(module_text(rule, data, _commit()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
