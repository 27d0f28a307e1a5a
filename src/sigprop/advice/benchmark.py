"""The lr benchmark: the families of ``configs/advise_bench``, each config swept over one lr grid, and the ways to
choose a learning rate scored on it, leave-one-family-out.

    sigprop sweep --config configs/advise_bench/FAMILY.toml --resume        # the data, one sweep per family
    python -m sigprop.advice.benchmark --runs runs/advise-bench     # the table (choosers cached per config)
    python -m sigprop.advice.benchmark --runs runs/advise-bench --table src/sigprop/advice/data/calibration.json
    python -m sigprop.advice.benchmark --runs runs/advise-bench --schedules src/sigprop/advice/data/halving_scores.py
    python -m sigprop.advice.benchmark --families modern --reference docs/results/lr-benchmark.json

Without ``--families`` it loads `FITTED_FAMILIES`, the families the shipped data (`data/calibration.json`,
`data/halving_scores.py`) were made from; the others are held out from all of it.

A *config* is a sweep point without its lr and seed. Its runs over the grid give its final validation loss at every
lr (a diverged run counts its initial loss: it ends no better than it started) and its *stall level*
(`unigram_loss`: the loss of the training split's token frequencies, or of its class prior for a classifier).
A *chooser* picks the lrs to train at; its *regret* on a config is the best final loss of the picked runs minus
the grid's best (an lr between two grid lrs reads the loss linearly interpolated in log lr, an lr outside the
grid its nearest grid lr's), and its *cost* is the compute it spends besides the one training run it chose, in
units of that run. An *outcome* per (config, lr): ``trains`` if the run ends at least 0.1 nats below the stall
level (`sigprop.train.levels.trains`); else ``diverges`` if its lr is above the largest lr that trains; else
``stalls``.

Choosers (`CHOOSERS`): ``fixed`` — the grid lr of least mean regret over every *other* family's configs (cost 0);
``pair`` — the two grid lrs whose better run has the least mean regret there (cost 1: a second run); each also
``…-hindsight``, chosen over every config, the scored family's included; ``range-test`` — the LR range test
(`sigprop.advice.range_test`: one run of the config's steps with the lr ramped; the min-loss / 10 pick; cost 1);
``prodigy`` — one run with Prodigy at lr 1 (cost 0; it keeps one step size for every group, so a config whose scheme
sets per-role lrs, μP's or CompleteP's, is marked);
``advise`` — `sigprop.advice.advise`'s rule at init (cost: its wall seconds over one run's); ``advise-invariant`` —
the same with its lr scales measured with the scale-invariant weights held still (``hold_invariant``), and
``halving-invariant`` ``halving-shipped`` centred on its lr;
``advise-lofo`` — the same rule with its constants refitted by `sigprop.advice.fit` on every other family's configs
(their probes and runs, `calibration`; the shipped constants are fitted on every family, the scored one's included);
``advise-proxy`` — `sigprop.advice.proxy`, the proxy trained over a short grid within half a run, carried by the
output-change scale (``advise-proxy-layer``, ``advise-proxy-median``: by the largest or the median layer's change,
the first of them as `sigprop advise --method proxy` trains it;
``advise-proxy-direct``: the proxy's lrs unchanged, ratio 1; all on the same proxy runs); ``advise-proxy-deep`` —
the same with a proxy of the config's depth, only narrower (its steps cut where even the narrowest does not fit
half a run), carried by the layer-change scale across width alone; ``advise-proxy-pair`` —
`sigprop.advice.proxy.pick_by_proxy`: a proxy within half a run trained at the ``pair`` chooser's two lrs (fitted
on the other families), the better one chosen; ``halving`` — successive halving (`sigprop.advice.halving`) over a
bracket of grid lrs centred on ``advise-lofo``'s lr, its schedule chosen on the other families, read off the grid
runs (an arm stopped at step n is the first n steps of its grid run); ``halving-shipped`` — successive halving as
`sigprop advise` runs it, the shipped schedule centred on the shipped rule's lr, read off the grid runs the same
way (held out only on a family outside those the shipped data were made from). The advise choosers also predict an
outcome at every grid lr, scored by balanced accuracy over the three outcomes; `targets` says which of the targets a
chooser meets.

``--json`` keeps every grid run's training curve (`Config.curves`), so a chooser that reads the runs' first steps
is scored again from the file alone; ``--reference FILE`` adds that file's configs of the families not loaded from
``--runs`` as configs the choosers fit on (the fixed lrs' other families), never scored.

The second command also writes the *calibration table* (`calibration_table`): every config's probe at init and runs
over the grid, the table `sigprop.advice.fit` fits the shipped constants on.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..console import one_line
from ..console.files import write_atomic
from ..train.config import RunConfig, from_mapping
from ..train.levels import trains, unigram_loss
from ..train.run_summary import ended_at
from ..train.sweep import finished_records, load_spec

if TYPE_CHECKING:
    from .fit import Case

FAMILIES_DIR = Path(__file__).resolve().parents[3] / "configs" / "advise_bench"
FITTED_FAMILIES = ("completep", "decoder", "encdec", "encoder", "hf-gpt2", "hf-llama", "horizon-1000", "horizon-150",
                   "mup", "schemes", "vit", "wide")       # the families the shipped data were made from
NEAR = 0.05             # a regret at most this (nats) counts as "near the best"
PROXY_BUDGET = 0.5      # the proxy's compute, in training runs of the config (`sigprop advise`'s default)


@dataclass(frozen=True)
class Config:
    """One config of a family: its grid, final (`ended_at`) and initial loss and divergence per lr, stall level and
    the run config of its first run."""

    family: str
    key: str
    lrs: tuple[float, ...]
    losses: tuple[float, ...]
    initial: tuple[float, ...]       # initial loss per grid lr
    diverged: tuple[bool, ...]       # per grid lr: the run stopped on a non-finite loss or evaluation
    level: float
    run: dict[str, Any]              # the run-config mapping (its lr is the grid's first)
    run_s: float                     # median wall seconds of one of its training runs
    curves: tuple[tuple[float, ...], ...] = ()   # per grid lr: its training loss at steps 1, 2, … (nan: not logged)

    @property
    def best(self) -> float:
        return min(self.losses)

    def loss_at(self, lr: float) -> float:
        """The final loss at ``lr``: interpolated in log lr between grid lrs, the nearest grid lr's outside."""
        xs = [math.log(x) for x in self.lrs]
        t = min(max(math.log(lr), xs[0]), xs[-1])
        for (a, la), (b, lb) in itertools.pairwise(zip(xs, self.losses)):
            if a <= t <= b:
                w = (t - a) / (b - a)
                return la + w * (lb - la)
        return self.losses[0]

    def regret(self, lrs: Sequence[float]) -> float:
        """Best final loss among runs at ``lrs`` minus the grid's best."""
        return min(self.loss_at(x) for x in lrs) - self.best

    def outcomes(self) -> list[str]:
        """The achieved outcome at each grid lr (module docstring)."""
        ok = [trains(x, self.level) for x in self.losses]
        top = max((lr for lr, t in zip(self.lrs, ok) if t), default=None)
        return ["trains" if t else "diverges" if top is not None and lr > top else "stalls"
                for lr, t in zip(self.lrs, ok)]

    def train_losses(self, lr: float) -> dict[int, float]:
        """Step → training loss of the grid run at ``lr`` (`sigprop.advice.halving.train_losses`' form)."""
        return dict(enumerate(self.curves[self.lrs.index(lr)], 1))


def curve(run_dir: str) -> tuple[float, ...]:
    """A run's training loss at steps 1 … its last logged step, nan where a step is not logged."""
    from .halving import train_losses

    losses = train_losses(run_dir)
    return tuple(losses.get(s, math.nan) for s in range(1, max(losses, default=0) + 1))


def load(runs: Path, families: Sequence[str] | None = None, directory: Path = FAMILIES_DIR) -> list[Config]:
    """Every finished config of every family sweep under ``runs/FAMILY`` (a config counts once all its grid lrs
    are finished); the families are the sweep files of ``directory`` (default: the checkout's
    ``configs/advise_bench``) but ``base.toml``."""
    out = []
    for path in sorted(Path(directory).glob("*.toml")):
        family = path.stem
        if family == "base" or (families and family not in families):
            continue
        spec = load_spec(path, str(runs / family))
        grid = sorted(spec.grid["optim.lr"])
        by_key: dict[str, dict[float, dict[str, Any]]] = {}
        for r in finished_records(runs / family / "sweep.jsonl").values():
            point = {k: v for k, v in r["point"].items() if k not in ("optim.lr", "seed")}
            by_key.setdefault(json.dumps(point, sort_keys=True), {})[r["point"]["optim.lr"]] = r
        for key, rs in sorted(by_key.items()):
            if sorted(rs) != grid:
                continue
            runs_ = [rs[lr] for lr in grid]
            out.append(Config(family, key, tuple(grid), tuple(ended_at(r) for r in runs_),
                              tuple(r["initial_val_loss"] for r in runs_), tuple(r["diverged"] for r in runs_),
                              unigram_loss(runs_[0]["config"]["train"]["out_dir"]), runs_[0]["config"],
                              statistics.median(r["wall_s"] for r in runs_),
                              tuple(curve(r["config"]["train"]["out_dir"]) for r in runs_)))
    return out


def load_json(path: Path) -> list[Config]:
    """The configs of a benchmark JSON (``--json``); one written before `Config.curves` existed has none."""
    fields = {f.name for f in dataclasses.fields(Config)}
    return [Config(**{k: tuple(map(tuple, v)) if k == "curves" else tuple(v) if isinstance(v, list) else v
                      for k, v in c.items() if k in fields}) for c in json.loads(Path(path).read_text())["configs"]]


def least_regret(configs: Sequence[Config], k: int) -> tuple[float, ...]:
    """The ``k`` grid lrs whose best run has the least mean regret over ``configs``."""
    grid = configs[0].lrs
    return min(itertools.combinations(grid, k), key=lambda c: statistics.fmean(x.regret(c) for x in configs))


Choice = dict[str, Any]   # "lrs" to train at, "cost" in runs; maybe "said" (outcome per grid lr), "loss" (its own
                          # run), "note" (a caveat, marked in the tables), "detail" (how it chose)


def fixed(k: int, hindsight: bool = False) -> Callable[[Config, Sequence[Config]], Choice]:
    """The ``k`` grid lrs of least mean regret over the other families' configs (every config: ``hindsight``)."""
    def choose(c: Config, every: Sequence[Config]) -> Choice:
        fit = list(every) if hindsight else [x for x in every if x.family != c.family]
        return {"lrs": least_regret(fit, k) if fit else (), "cost": float(k - 1)}      # no other family: no answer
    return choose


NO_ANSWER: Choice = {"lrs": (), "cost": 0.0}           # a chooser that failed on a config (regret: inf)


def _cached(name: str, compute: Callable[[Config], dict[str, Any]], cache: Path
            ) -> Callable[[Config, Sequence[Config]], dict[str, Any] | None]:
    """``compute`` of a config, kept in ``cache/name``; None (said on stderr, not kept: the next call retries) when
    it raises."""
    def run(c: Config, _every: Sequence[Config]) -> dict[str, Any] | None:
        path = cache / name / f"{hashlib.sha1((c.family + c.key).encode()).hexdigest()[:16]}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                result = compute(c)
            except Exception as e:
                print(f"{name} on {c.family} {c.key}: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
                return None
            write_atomic(path, json.dumps({"family": c.family, "key": c.key, **result}))
        return json.loads(path.read_text())
    return run


def _cfg(c: Config, out: Path) -> RunConfig:
    raw = json.loads(json.dumps(c.run))
    raw["train"] = {**raw["train"], "out_dir": str(out), "progress": False}
    return from_mapping(RunConfig, raw)


def range_test(cache: Path) -> Callable[[Config, Sequence[Config]], Choice]:
    """The LR range test's min-loss / 10 pick (cost: its ramp run, the config's steps)."""
    from .range_test import run_range_test

    def compute(c: Config) -> dict[str, Any]:
        t = run_range_test(_cfg(c, cache / "tmp"))
        return {"lr": t.min_over_10, "steepest": t.steepest, "steps": len(t.lrs), "cost_s": t.cost_s}
    cached = _cached("range-test", compute, cache)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        r = cached(c, every)
        if r is None:
            return NO_ANSWER
        return {"lrs": (r["lr"],), "cost": r["steps"] / c.run["train"]["steps"]}
    return choose


def advise_chooser(cache: Path, hold_invariant: bool = False) -> Callable[[Config, Sequence[Config]], Choice]:
    """`advise`'s recommended lr (cost: its wall seconds over one training run's), with its outcome per grid lr;
    ``hold_invariant``: its lr scales measured with the scale-invariant weights held still."""
    from .advise import advise

    def compute(c: Config) -> dict[str, Any]:
        try:
            a = advise(_cfg(c, cache / "tmp"), lrs=list(c.lrs), hold_invariant=hold_invariant)
        except (NotImplementedError, ValueError) as e:
            return {"lr": None, "error": " ".join(str(e).split()), "cost_s": 0.0, "outcomes": None}
        return {"lr": a.recommended_lr, "cost_s": a.cost_s, "outcomes": [p["outcome"] for p in a.predictions],
                "held": a.held_tensors}
    cached = _cached("advise-invariant" if hold_invariant else "advise", compute, cache)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        r = cached(c, every)
        if r is None:
            return NO_ANSWER
        return {"lrs": (r["lr"],) if r["lr"] else (), "cost": r["cost_s"] / c.run_s, "said": r["outcomes"]}
    return choose


def calibration(cache: Path) -> Callable[[Config], tuple[Case, float] | None]:
    """A config as a calibration `sigprop.advice.fit.Case` with advise's wall seconds: the probe `advise` measures on
    its run config (kept in ``cache/probe``), its β₁ and schedule area, its stall level as the unigram loss and its
    runs over the grid; None (said on stderr) where advise raised."""
    from .advise import advise, run_area
    from .fit import Case, GridRun, case_row, row_case

    def compute(c: Config) -> dict[str, Any]:
        cfg = _cfg(c, cache / "tmp")
        a = advise(cfg, lrs=list(c.lrs))
        case = Case(f"{c.family} {c.key}", cfg.optim.beta1, run_area(cfg.optim, cfg.train.steps), c.level, a.probe, ())
        return {**case_row(case), "cost_s": a.cost_s}
    cached = _cached("probe", compute, cache)

    def case(c: Config) -> tuple[Case, float] | None:
        r = cached(c, ())
        if r is None:
            return None
        runs = tuple(GridRun(lr, math.nan if d else loss, init, d)
                     for lr, loss, init, d in zip(c.lrs, c.losses, c.initial, c.diverged))
        return dataclasses.replace(row_case(r), runs=runs), r["cost_s"]
    return case


def calibration_table(configs: Sequence[Config], cache: Path) -> list[Case]:
    """Every config as a calibration `Case` (`calibration`), the table `sigprop.advice.fit` fits the shipped
    constants on. Raises RuntimeError naming the configs advise failed on."""
    case = calibration(cache)
    cases = [case(c) for c in configs]
    failed = [f"{c.family} {c.key}" for c, x in zip(configs, cases) if x is None]
    if failed:
        raise RuntimeError(f"no probe for {failed}")
    return [x[0] for x in cases]


def lofo_chooser(cache: Path) -> Callable[[Config, Sequence[Config]], Choice]:
    """`advise`'s rule with its constants refitted (`sigprop.advice.fit.fit`) on every other family's configs
    (`calibration`), applied to the scored config's probe: its recommended lr and its outcome per grid lr (cost:
    advise's wall seconds over one training run's)."""
    from .fit import fit
    from .rule import outcome

    case = calibration(cache)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        here, others = case(c), [case(x) for x in every if x.family != c.family]
        if here is None or not others or not all(others):           # no other family, or a probe missing
            return NO_ANSWER
        try:
            d = here[0].decide(fit([x[0] for x in others]))
        except ValueError:                              # the scales the rule reads are not measurable here
            return NO_ANSWER
        return {"lrs": (d.recommended,), "cost": here[1] / c.run_s, "said": [outcome(lr, d)[0] for lr in c.lrs]}
    return choose


def halve_on_grid(c: Config, centre: float, schedule: Any) -> float:
    """The lr successive halving (`sigprop.advice.halving.halve`) by ``schedule`` keeps on config ``c``, read off
    its grid runs (an arm stopped at step n is the first n steps of the grid run at its lr, `Config.curves`), over
    the schedule's count of grid lrs centred on the grid lr nearest ``centre``, shifted to lie within the grid."""
    from .halving import halve, rung_loss

    i = min(range(len(c.lrs)), key=lambda j: abs(math.log(c.lrs[j] / centre)))
    lo = min(max(0, i - schedule.arms // 2), len(c.lrs) - schedule.arms)
    losses = {lr: c.train_losses(lr) for lr in c.lrs[lo:lo + schedule.arms]}
    steps = c.run["train"]["steps"]
    return halve(list(losses), lambda lr, n: rung_loss(losses[lr], n, steps), schedule, steps)[0]


def halving_picks(cache: Path) -> Callable[[Config, Any, Sequence[Config], frozenset[str]], float]:
    """``pick(c, schedule, every, out)``: `halve_on_grid` of config ``c`` by ``schedule`` centred on the rule's lr
    at init (constants refitted, as in ``advise-lofo``, on every config in ``every`` whose family is not in ``out``,
    `calibration`). Raises ValueError where the rule cannot judge ``c``. Its attributes ``case`` (`calibration`,
    read once per config) and ``rule(out)`` (the refitted rule) are what it read."""
    from .fit import fit

    read, cases, rules = calibration(cache), {}, {}

    def case(c: Config) -> tuple[Case, float] | None:
        if c.family + c.key not in cases:
            cases[c.family + c.key] = read(c)
        return cases[c.family + c.key]

    def rule(every: Sequence[Config], out: frozenset[str]) -> Any:
        if out not in rules:
            rules[out] = fit([case(x)[0] for x in every if x.family not in out])
        return rules[out]

    def pick(c: Config, s: Any, every: Sequence[Config], out: frozenset[str]) -> float:
        return halve_on_grid(c, case(c)[0].decide(rule(every, out)).recommended, s)
    pick.case, pick.rule = case, rule
    return pick


def halving_chooser(cache: Path) -> Callable[[Config, Sequence[Config]], Choice]:
    """Successive halving read off the grid runs (`halving_picks`, its bracket centred by the rule refitted without
    the config's family) by the schedule, of `sigprop.advice.halving.SCHEDULES`, of least mean regret over the
    other families' configs (their brackets centred by the rule refitted without either family), the cheaper on a
    tie. Cost: the schedule's extra runs plus the probe's wall time over one run's; outcomes: the rule's."""
    from .halving import SCHEDULES
    from .rule import outcome

    pick = halving_picks(cache)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        others, out = [x for x in every if x.family != c.family], frozenset((c.family,))
        if not others or any(pick.case(x) is None for x in every):       # no other family, or a probe missing
            return NO_ANSWER
        try:
            s = min(SCHEDULES, key=lambda s: (statistics.fmean(
                x.regret([pick(x, s, every, frozenset((c.family, x.family)))]) for x in others), s.extra))
            lr = pick(c, s, every, out)
        except ValueError:                              # the scales the rule reads are not measurable here
            return NO_ANSWER
        d = pick.case(c)[0].decide(pick.rule(every, out))
        return {"lrs": (lr,), "cost": s.extra + pick.case(c)[1] / c.run_s,
                "said": [outcome(x, d)[0] for x in c.lrs], "detail": str(s)}
    return choose


def shipped_halving_chooser(cache: Path, hold_invariant: bool = False
                            ) -> Callable[[Config, Sequence[Config]], Choice]:
    """Successive halving as `sigprop advise` runs it at its default budget `PROXY_BUDGET`: the shipped schedule
    (`sigprop.advice.halving.schedule_for`) and the shipped rule's lr at init as the centre (the ``advise``
    chooser's probe, or ``advise-invariant``'s with ``hold_invariant``), read off the grid runs (`halve_on_grid`).
    Fitted on the families the shipped data were made from: held out only for a family outside them. Cost: the
    schedule's extra runs plus the probe's wall time over one run's; outcomes: the rule's."""
    from .halving import schedule_for

    probe, schedule = advise_chooser(cache, hold_invariant), schedule_for(PROXY_BUDGET)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        a = probe(c, every)
        if not a["lrs"]:
            return a
        return {**a, "lrs": (halve_on_grid(c, a["lrs"][0], schedule),), "cost": schedule.extra + a["cost"],
                "detail": str(schedule)}
    return choose


def schedule_table(configs: Sequence[Config], cache: Path) -> list[dict[str, Any]]:
    """Per schedule of `sigprop.advice.halving.SCHEDULES`: its fields, extra cost, and mean regret and share ≤
    `NEAR` over every config (each bracket centred by the rule refitted without the config's family), the table
    `sigprop.advice.halving.schedule_for` chooses a budget's schedule from."""
    from .halving import SCHEDULES

    pick = halving_picks(cache)
    out = []
    for s in SCHEDULES:
        r = [c.regret([pick(c, s, configs, frozenset((c.family,)))]) for c in configs]
        out.append({**dataclasses.asdict(s), "extra": s.extra, "mean_regret": statistics.fmean(r),
                    "near": sum(x <= NEAR for x in r) / len(r)})
    return out


def write_schedules(rows: Sequence[dict[str, Any]], n: int, path: Path) -> None:
    """``rows`` (`schedule_table` over ``n`` configs) as a Python module of one list, ``SCORES``, with how it was
    made."""
    body = ",\n    ".join(repr({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}) for r in rows)
    doc = "\n".join([
        f"The halving schedules scored on the lr benchmark's {n} configs (`sigprop.advice.benchmark.schedule_table`):",
        "per schedule its arms, rungs, keeps, extra cost in runs, and mean regret and share within "
        f"{NEAR} nats of the",
        "grid's best over every config, each bracket centred by the rule refitted without the config's family.", "",
        "Written by", f"    python -m sigprop.advice.benchmark --runs runs/advise-bench --schedules {path.as_posix()}",
        "do not edit by hand.", ""])
    write_atomic(path, f'"""{doc}"""\n\nSCORES = [\n    {body},\n]\n')


def per_role_lrs(c: Config) -> bool:
    """Whether the config's scheme and parametrization give its parameter groups more than one lr multiplier (μP's
    hidden and output rules, CompleteP's depth rules), which Prodigy's one step size cannot follow."""
    from ..models.build import build_model
    from ..train.optim import param_groups, param_rules

    cfg = _cfg(c, Path(c.run["train"]["out_dir"]))
    groups = param_groups(param_rules(build_model(cfg.model, "meta"), cfg.model), cfg.optim)
    return len({g["lr_mult"] for g in groups}) > 1


def prodigy(cache: Path) -> Callable[[Config, Sequence[Config]], Choice]:
    """One run with Prodigy (``optim.optimizer="prodigy"``, lr 1 under the config's warmup and decay, its betas
    and weight decay): its own final loss (cost 0: it is the training run). It keeps one step size for every
    parameter group, so a μP config's per-role lr rules keep only their ratios (marked)."""
    from ..train.one_run import train_run

    def compute(c: Config) -> dict[str, Any]:
        t = c.run
        r = train_run(cache / "tmp", t["model"], t["data"], {**t["optim"], "optimizer": "prodigy", "lr": 1.0},
                      {k: v for k, v in t["train"].items() if k not in ("out_dir", "seed")}, t["train"]["seed"])
        return {"loss": ended_at(r), "wall_s": r["wall_s"]}
    cached = _cached("prodigy", compute, cache)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        r = cached(c, every)
        if r is None:
            return NO_ANSWER
        return {"lrs": (), "cost": 0.0, "loss": r["loss"],
                "note": "one step size where the scheme sets per-role lrs" if per_role_lrs(c) else ""}
    return choose


def proxy_chooser(cache: Path, basis: str | None, keep_depth: bool = False
                  ) -> Callable[[Config, Sequence[Config]], Choice]:
    """`sigprop.advice.proxy.advise_by_proxy` at budget `PROXY_BUDGET` with the ``basis`` lr scale (the proxy runs
    are shared by every basis; cost: the proxy runs), with its outcome per grid lr; ``keep_depth``: a proxy of the
    config's depth, narrower only."""
    from .proxy import advise_by_proxy

    def compute(c: Config) -> dict[str, Any]:
        a = advise_by_proxy(_cfg(c, cache / "tmp"), PROXY_BUDGET, lrs=list(c.lrs), out=cache / "proxy-runs",
                            progress=False, basis=basis, keep_depth=keep_depth)
        return {"lr": a.recommended_lr, "cost": a.cost, "outcomes": [p["outcome"] for p in a.predictions],
                "ratio": a.ratio, "grid": a.grid, "cost_s": a.cost_s}
    name = f"proxy-{'deep-' if keep_depth else ''}{(basis or 'direct').replace(' ', '-')}"
    cached = _cached(name, compute, cache)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        r = cached(c, every)
        if r is None:
            return NO_ANSWER
        return {"lrs": (r["lr"],), "cost": r["cost"], "said": r["outcomes"]}
    return choose


def pair_proxy_chooser(cache: Path) -> Callable[[Config, Sequence[Config]], Choice]:
    """`sigprop.advice.proxy.pick_by_proxy` between the ``pair`` chooser's two lrs (fitted on the other families)
    within `PROXY_BUDGET` (cost: the two proxy runs)."""
    from .proxy import pick_by_proxy
    pair = fixed(2)

    def choose(c: Config, every: Sequence[Config]) -> Choice:
        lrs = pair(c, every)["lrs"]
        if not lrs:
            return NO_ANSWER
        r = _cached(f"proxy-pair-{'-'.join(f'{x:g}' for x in lrs)}", lambda c: dataclasses.asdict(
            pick_by_proxy(_cfg(c, cache / "tmp"), lrs, PROXY_BUDGET, cache / "proxy-runs", progress=False)),
            cache)(c, every)
        return NO_ANSWER if r is None else {"lrs": (r["lr"],), "cost": r["cost"]}
    return choose


def choosers(cache: Path, names: Sequence[str]) -> dict[str, Callable[[Config, Sequence[Config]], Choice]]:
    """The choosers of the module docstring by name."""
    every = {"fixed": fixed(1), "pair": fixed(2), "fixed-hindsight": fixed(1, True),
             "pair-hindsight": fixed(2, True), "range-test": None, "advise": None, "prodigy": None,
             "advise-proxy": None, "advise-proxy-layer": None, "advise-proxy-median": None,
             "advise-proxy-direct": None, "advise-proxy-pair": None, "advise-lofo": None, "advise-proxy-deep": None,
             "halving": None, "halving-shipped": None, "advise-invariant": None, "halving-invariant": None}
    unknown = sorted(set(names) - set(every))
    if unknown:
        raise ValueError(f"unknown chooser(s) {unknown}; valid: {sorted(every)}")
    made = {"range-test": lambda: range_test(cache), "advise": lambda: advise_chooser(cache),
            "prodigy": lambda: prodigy(cache), "advise-proxy": lambda: proxy_chooser(cache, "output change"),
            "advise-proxy-layer": lambda: proxy_chooser(cache, "layer change"),
            "advise-proxy-median": lambda: proxy_chooser(cache, "median layer change"),
            "advise-proxy-direct": lambda: proxy_chooser(cache, None),
            "advise-proxy-deep": lambda: proxy_chooser(cache, "layer change", keep_depth=True),
            "advise-proxy-pair": lambda: pair_proxy_chooser(cache), "advise-lofo": lambda: lofo_chooser(cache),
            "halving": lambda: halving_chooser(cache), "halving-shipped": lambda: shipped_halving_chooser(cache),
            "advise-invariant": lambda: advise_chooser(cache, hold_invariant=True),
            "halving-invariant": lambda: shipped_halving_chooser(cache, hold_invariant=True)}
    return {n: every[n] or made[n]() for n in names}


def balanced_accuracy(said: Sequence[str], achieved: Sequence[str]) -> float:
    """Mean over the achieved outcomes present of the share predicted right."""
    kinds = sorted(set(achieved))
    return statistics.fmean(sum(s == a == k for s, a in zip(said, achieved)) / achieved.count(k) for k in kinds)


def score(configs: Sequence[Config], chooser: Callable[[Config, Sequence[Config]], Choice],
          every: Sequence[Config] = ()) -> list[dict[str, Any]]:
    """One row per config: family, key, chosen lrs, regret (inf when the chooser gave no lr), cost, and the
    predicted and achieved outcome per grid lr where the chooser predicts them. The chooser sees ``configs`` and
    ``every`` (configs it may fit on, never scored)."""
    rows, seen = [], [*configs, *every]
    for c in configs:
        ch = chooser(c, seen)
        regret = ch["loss"] - c.best if "loss" in ch else c.regret(ch["lrs"]) if ch["lrs"] else math.inf
        rows.append({"family": c.family, "key": c.key, "lrs": list(ch["lrs"]), "cost": ch["cost"], "regret": regret,
                     "said": ch.get("said"), "achieved": c.outcomes(), "note": ch.get("note", ""),
                     "detail": ch.get("detail", "")})
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median and mean regret, the share within `NEAR` of the best, the median cost, of ``rows``."""
    r = [x["regret"] for x in rows]
    return {"n": len(r), "median": statistics.median(r), "mean": statistics.fmean(r),
            "near": sum(x <= NEAR for x in r) / len(r), "cost": statistics.median(x["cost"] for x in rows)}


def outcome_accuracy(rows: Sequence[dict[str, Any]]) -> float | None:
    """Balanced accuracy of a chooser's predicted outcomes over every (config, grid lr) it judged; None if none."""
    judged = [r for r in rows if r["said"]]
    if not judged:
        return None
    return balanced_accuracy(sum((r["said"] for r in judged), []), sum((r["achieved"] for r in judged), []))


TARGETS = {"≤ 0.05 on ≥ 80 %": lambda s, acc: s["near"] >= 0.8, "mean ≤ 0.05": lambda s, acc: s["mean"] <= NEAR,
           "outcomes ≥ 0.8": lambda s, acc: acc is not None and acc >= 0.8,
           "cost ≤ 0.5": lambda s, acc: s["cost"] <= PROXY_BUDGET,
           "every config answered": lambda s, acc: s["answered"]}


def targets(rows: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """Which of `TARGETS` a chooser's rows meet: regret ≤ `NEAR` on at least 80 % of configs, mean regret ≤ `NEAR`,
    outcome balanced accuracy ≥ 0.8 (a chooser that predicts none fails it), median cost ≤ `PROXY_BUDGET` runs, a
    finite regret on every config."""
    s = {**summary(rows), "answered": all(math.isfinite(r["regret"]) for r in rows)}
    return {name: bool(met(s, outcome_accuracy(rows))) for name, met in TARGETS.items()}


def targets_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown, one row per chooser: each of `targets` met (yes) or not (no)."""
    lines = ["| chooser | " + " | ".join(TARGETS) + " |", "|---|" + "---|" * len(TARGETS)]
    lines += [f"| {name} | " + " | ".join("yes" if met else "no" for met in targets(rows).values()) + " |"
              for name, rows in results.items()]
    return "\n".join(lines)


def overall(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown, one row per chooser over every config: median and mean regret, share ≤ `NEAR`, median cost,
    outcome balanced accuracy (– for a chooser that predicts no outcome)."""
    lines = [f"| chooser | median regret | mean regret | ≤ {NEAR} | cost (runs) | outcome bal. acc. |",
             "|---|---|---|---|---|---|"]
    for name, rows in results.items():
        s, acc = summary(rows), outcome_accuracy(rows)
        lines.append(f"| {name} | {s['median']:.3f} | {s['mean']:.3f} | {s['near']:.0%} | {s['cost']:.2g} | "
                     + ("–" if acc is None else f"{acc:.2f}") + " |")
    return "\n".join(lines)


def by_family(configs: Sequence[Config], results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown, one row per chooser and one column per family (its config count in the header): mean regret and,
    in brackets, the share ≤ `NEAR`; a cell whose rows carry a note (Prodigy on μP: one step size) is marked †
    and each such note is listed below the table."""
    families = sorted({c.family for c in configs})
    head = "| chooser | " + " | ".join(f"{f} ({sum(c.family == f for c in configs)})" for f in families) + " |"
    lines, notes = [head, "|---|" + "---|" * len(families)], set()
    for name, rows in results.items():
        cells = []
        for f in families:
            here = [x for x in rows if x["family"] == f]
            s, marked = summary(here), {x["note"] for x in here if x["note"]}
            notes |= {f"{name}: {n}" for n in marked}
            cells.append(f"{s['mean']:.3f} ({s['near']:.0%})" + " †" * bool(marked))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [f"\n† {n}" for n in sorted(notes)])


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sigprop.advice.benchmark", description=__doc__.split("\n")[0])
    p.add_argument("--runs", default="runs/advise-bench", help="the family sweeps' parent folder")
    p.add_argument("--choosers", nargs="+", default=["fixed", "pair", "fixed-hindsight", "pair-hindsight"])
    p.add_argument("--families", nargs="+", default=list(FITTED_FAMILIES),
                   help="the families to load and score (default: those the shipped data were made from)")
    p.add_argument("--families-dir", default=str(FAMILIES_DIR), help="the families' sweep files")
    p.add_argument("--reference", default=None, help="a benchmark JSON (--json) whose configs of other families "
                   "the choosers may fit on, never scored")
    p.add_argument("--json", default=None, help="also write every config's rows as JSON")
    p.add_argument("--table", default=None, help="also write the calibration table of every config (`calibration`)")
    p.add_argument("--schedules", default=None, help="also write the halving schedules' scores (`schedule_table`) "
                   "as the Python module `sigprop.advice.halving.schedule_for` reads")
    args = p.parse_args(argv)
    runs = Path(args.runs)
    configs = load(runs, args.families, Path(args.families_dir))
    if not configs:
        raise SystemExit(f"no finished config under {runs}")
    if args.table:
        from .fit import save_table
        save_table(calibration_table(configs, runs / "choosers"), Path(args.table))
    if args.schedules:
        write_schedules(schedule_table(configs, runs / "choosers"), len(configs), Path(args.schedules))
    scored = {c.family for c in configs}
    every = [c for c in load_json(Path(args.reference)) if c.family not in scored] if args.reference else []
    results = {n: score(configs, c, every) for n, c in choosers(runs / "choosers", args.choosers).items()}
    print(overall(results), by_family(configs, results), targets_table(results), sep="\n\n")
    if args.json:
        fitted = {"reference": args.reference, "reference_families": sorted({c.family for c in every})} if every else {}
        write_atomic(Path(args.json), json.dumps({"configs": [c.__dict__ for c in configs], **fitted,
                                                   "results": results}, indent=1))


if __name__ == "__main__":
    main()
