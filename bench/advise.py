"""Evaluation of `sigprop advise` and of the LR range test on the lr sweeps that exist here.

    OMP_NUM_THREADS=1 python bench/advise.py            # after the four sweeps below have run

Sweeps (`sigprop sweep --config FILE --jobs 2`): configs/sweep/depth_lr.toml, configs/sweep/width_mup.toml,
configs/sweep/advise_eval.toml and configs/sweep/advise_eval_deep.toml. A *config* is a sweep point without its lr;
its runs over the lr grid give the achieved outcome of every (config, lr) and the grid's best loss. Achieved outcome
of a run: ``trains`` if it ends more than 0.1 nats below the unigram loss of its data; else ``diverges`` if its loss
became non-finite or its lr is above the largest lr of its config that trains (it fails because its lr is too large:
with AdamW and gradient clipping a too-large lr mostly sends the model back to the unigram plateau rather than to
inf); else ``stalls``.

Calibration and scoring sets are disjoint, under two splits (`split`) of advise_eval and advise_eval_deep (one sweep
in two files: depth 96 has its own), depth_lr and width_mup calibrating in both: *balanced*, alternate (depth,
width) cells, so each set holds both widths and every depth; *by width*, scoring = width 64, the first design, which
leaves calibration one width of advise_eval and so cannot fit how the lr moves with width (both are reported). The
`Rule` constants are fitted on one set (`sigprop.advice.fit`) and every figure is reported on both; the reverse
fit (on the scoring set, scored on calibration) is reported too. Per config: regret = final loss at the
recommended lr (linear in log lr between grid points, the nearest grid point outside the grid; a diverged run counts
its initial loss) − the grid's best loss; the hindsight baseline is the one grid lr with the lowest mean loss over
the set's configs of each sweep.
Cost = advise's wall seconds / the sweep's training compute, that is its runs' steps times one training step's wall
seconds (`step_time`, measured in the same process as advise, so both on the same machine state; the range test's
compute is its steps times that step); beside it the same ratio against the runs' logged wall times (taken under
whatever else ran then), and, independent of the machine, advise's forward+backward passes (float64) / the sweep's
training steps (the range test: its steps / the sweep's).

What a regret means here: the regret at √2 and 2 times (and divided by) the best grid lr; how tightly the best lr
follows the lr scale that predicts it best up to a constant (the s.d. of the log ratio); and, on the configs that
configs/sweep/advise_eval_seed1.toml runs again under a second seed (`REPLICATES`: depths 4 and 24, every scheme and
width), the regret of that seed's best lr on the first seed's runs (an oracle that knows the optimum up to seed
noise: the floor under any advice scored against one seed), how often that seed's outcomes match the first's (the
ceiling of an outcome prediction scored against one seed), advise's figures on the same configs, and the seeds'
difference in final loss.

Advise and range-test results are cached per config under runs/advise-bench/ (delete it to re-measure).
Writes the table to stdout, runs/advise-bench/table.md and, with --write, into docs/advise.md and
bench/RESULTS.md between their ``<!-- advise-eval -->`` markers.

    OMP_NUM_THREADS=1 python bench/advise.py --claims   # after `sigprop reproduce dslm-depth|depth-transfer`

scores the shipped rule (`Rule()`, fitted on the lr benchmark's configs) and the range test, unfitted, on
the claims' lr grids (`CLAIMS`, folders under runs/reproduce: each model's grid at the tuning seed,
`sigprop.experiments.tuning`, or, for depth-transfer, which scores every lr of its panels, at its seed): other
depths (to 192 layers), widths, corpus and step counts than the sweeps above; per claim and together, written between
``<!-- advise-claims -->`` markers with --write.

    OMP_NUM_THREADS=1 python bench/advise.py --bases      # after the claims have run, as for --claims

fits each lr scale as the recommendation's basis on the balanced split's calibration set (`fitted_best`) and scores
it on the scoring set and each claim's lr grids: how far each scale carries to runs it was not fitted on; written
between ``<!-- advise-bases -->`` markers with --write.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from sigprop.advice.advise import advise, lm_loss, run_inputs
from sigprop.advice.fit import (
    Case,
    GridRun,
    balanced_accuracy,
    fit,
    fitted_best,
    last_record,
    usable_scales,
)
from sigprop.advice.probe import Probe
from sigprop.advice.range_test import run_range_test
from sigprop.advice.rule import LIMITS, OUTCOMES, WINDOW, Rule, outcome, schedule_area
from sigprop.console import UserError
from sigprop.experiments.tuning import TUNING_SEED
from sigprop.train.config import RunConfig, from_mapping
from sigprop.train.levels import unigram_loss
from sigprop.train.optim import make_optimizer
from sigprop.train.sampler import EpochSampler, generator
from sigprop.train.schedules import lr_at
from sigprop.train.sweep import finished_records, load_spec, logged_records

SWEEPS = ("configs/sweep/depth_lr.toml", "configs/sweep/width_mup.toml", "configs/sweep/advise_eval.toml",
          "configs/sweep/advise_eval_deep.toml")
REPLICATES = {"advise_eval": "configs/sweep/advise_eval_seed1.toml"}   # a second seed of (part of) a sweep
CACHE = Path("runs/advise-bench")
MARKER, CLAIMS_MARKER, BASES_MARKER = "<!-- advise-eval -->", "<!-- advise-claims -->", "<!-- advise-bases -->"
CLAIMS = ("runs/reproduce/dslm-depth/sweeps",      # claims' sweep folders (`sigprop reproduce NAME`)
          "runs/reproduce/depth-transfer/sweeps")


def configs(path: str) -> list[dict]:
    """Every config of a sweep with at least one finished run: name, set, RunConfig (its first run's, lr aside),
    the sweep's lr grid, its finished runs (``complete`` when every grid lr has one), unigram loss."""
    spec = load_spec(path)
    try:
        records, _ = logged_records(spec)
    except UserError as e:                               # this sweep has not run yet
        print(f"{path}: {e}", file=sys.stderr)
        return []
    grid = sorted(spec.grid["optim.lr"])
    groups: dict[str, list[dict]] = {}
    for r in records:
        key = json.dumps({k: v for k, v in r["point"].items() if k != "optim.lr"}, sort_keys=True)
        groups.setdefault(key, []).append(r)
    unigram = unigram_loss(records[0]["config"]["train"]["out_dir"])
    sweep = Path(path).stem
    out = []
    for key, runs in groups.items():
        runs = sorted(runs, key=lambda r: r["point"]["optim.lr"])
        point = json.loads(key)
        name = sweep + ":" + ",".join(f"{k.split('.')[-1]}={v}" for k, v in point.items() if k != "seed")
        cfg = from_mapping(RunConfig, runs[0]["config"])
        out.append({"name": name, "sweep": sweep.removesuffix("_deep"), "set": split(sweep, cfg), "cfg": cfg,
                    "runs": runs, "unigram": unigram, "grid": grid, "complete": len(runs) == len(grid)})
    return out


def claim_configs(folder: str) -> list[dict]:
    """The lr grids of a claim's sweep folder as configs (as `configs`): runs grouped by their whole config but
    lr, seed and run folder (a config that two of the claim's panels share ran in each: one run per lr is kept),
    then by seed; per config the tuning seed's grid (`sigprop.experiments.tuning`), else, for a claim that scores
    every lr of its grid without tuning (depth-transfer), the lowest seed's; grids of fewer than 3 lrs are left
    out."""
    groups: dict[str, dict[int, dict[float, dict]]] = {}
    for r in finished_records(Path(folder) / "sweep.jsonl").values():
        config = {**r["config"], "optim": {**r["config"]["optim"], "lr": None},
                  "train": {**r["config"]["train"], "seed": None, "out_dir": None}}
        by_lr = groups.setdefault(json.dumps(config, sort_keys=True), {}).setdefault(r["point"].get("seed", 0), {})
        by_lr.setdefault(r["point"]["optim.lr"], r)
    grids = []
    for by_seed in groups.values():
        full = {seed: list(runs.values()) for seed, runs in by_seed.items() if len(runs) >= 3}
        if full:
            grids.append(full[TUNING_SEED] if TUNING_SEED in full else full[min(full)])
    claim, out = Path(folder).parent.name, []
    for runs in grids:
        runs = sorted(runs, key=lambda r: r["point"]["optim.lr"])
        grid = [r["point"]["optim.lr"] for r in runs]
        model = runs[0]["config"]["model"]
        extra = {"admin_mode": model["scheme"] == "admin", "qk_norm": model["qk_norm"],
                 "parametrization": model["parametrization"] != "standard"}
        z_loss = runs[0]["config"]["optim"]["z_loss"]
        name = (f"{claim}:scheme={model['scheme']},norm={model['norm_placement']},n_layers={model['n_layers']},"
                f"d_model={model['d_model']}" + "".join(f",{k}={model[k]}" for k, shown in extra.items() if shown)
                + (f",z_loss={z_loss:g}" if z_loss else ""))
        out.append({"name": name, "sweep": claim, "set": {}, "cfg": from_mapping(RunConfig, runs[0]["config"]),
                    "runs": runs, "unigram": unigram_loss(runs[0]["config"]["train"]["out_dir"]), "grid": grid,
                    "complete": True})
    return out


DEPTHS, WIDTHS = (4, 24, 96), (32, 64)
SPLITS = {"balanced": "balanced (each set holds both widths and every depth)",
          "width": "by width (scoring = width 64, which calibration never sees)"}


def split(sweep: str, cfg: RunConfig) -> dict[str, str]:
    """A config's set under each split: ``balanced`` puts (depth, width) cells of advise_eval(_deep) in alternate
    sets, so that each set holds both widths and every depth (calibration: 4 × 32, 24 × 64, 96 × 32; scoring:
    4 × 64, 24 × 32, 96 × 64); ``width`` puts width 64 in scoring. depth_lr and width_mup calibrate in both."""
    if not sweep.startswith("advise_eval"):
        return {"balanced": "calibration", "width": "calibration"}
    cell = DEPTHS.index(cfg.model.n_layers) + WIDTHS.index(cfg.model.d_model)
    return {"balanced": "scoring" if cell % 2 else "calibration",
            "width": "scoring" if cfg.model.d_model == 64 else "calibration"}


def _cache(name: str, kind: str) -> Path:
    return CACHE / kind / (name.replace(":", "_").replace(",", "_").replace("=", "") + ".json")


def measured(c: dict) -> dict:
    """advise's probe and report on a config (cached): what the rule needs to be refitted without re-measuring."""
    path = _cache(c["name"], "advise")
    if path.exists():
        return json.loads(path.read_text())
    a = advise(c["cfg"], lrs=c["grid"])
    p = a.probe
    row = {"probe": {k: v for k, v in asdict(p).items() if k != "records"},
           "last_corr": a.rank_collapse, "lambda_a": a.lambda_a, "lambda_g": a.lambda_g,
           "lambda_a_measured": a.lambda_a_measured, "lambda_g_measured": a.lambda_g_measured,
           "grad_spread": a.grad_spread, "fwd_var_range": list(a.fwd_var_range), "unigram_advise": a.unigram_loss,
           "cost_s": a.cost_s, "passes": a.passes}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row))
    return row


def ranged(c: dict) -> dict:
    """The range test on a config (cached): its two picks and its wall seconds."""
    path = _cache(c["name"], "range")
    if path.exists():
        return json.loads(path.read_text())
    t = run_range_test(c["cfg"])
    row = {"steepest": t.steepest, "min_over_10": t.min_over_10, "cost_s": t.cost_s, "steps": len(t.lrs)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row))
    return row


def step_time(c: dict, steps: int = 12) -> dict:
    """Wall seconds of one training step of a config (cached): the median of ``steps`` AdamW steps (forward,
    backward, clip, update) on its model and its run's batches, after two warm-up steps, in this process, so
    that advise's and the range test's costs can be set against the sweep's measured on the same machine state."""
    path = _cache(c["name"], "step")
    if path.exists():
        return json.loads(path.read_text())
    cfg = c["cfg"]
    inputs = run_inputs(cfg)
    model, loss = inputs.model, lm_loss(cfg.optim.z_loss)
    opt = make_optimizer(model, cfg.optim, cfg.model)
    sampler = EpochSampler(len(inputs.data.train), cfg.train.seed)
    times = []
    for s in range(steps + 2):
        batch = inputs.data.train.batch(sampler.indices(s, cfg.train.batch_size), generator(cfg.train.seed, s))
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss(model, batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        times.append(time.perf_counter() - start)
    row = {"step_s": statistics.median(times[2:])}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row))
    return row


def case(c: dict, m: dict) -> Case:
    """A config and its cached measurements as the fit's `Case` (made once per config)."""
    if "case" not in c:
        steps, unit = c["cfg"].train.steps, replace(c["cfg"].optim, lr=1.0)
        probe = {**m["probe"], "line": tuple(tuple(x) for x in m["probe"]["line"])}
        c["case"] = Case(c["name"], c["cfg"].optim.beta1, schedule_area([lr_at(t, steps, unit) for t in range(steps)]),
                         c["unigram"], Probe(records=(last_record(m["last_corr"]),), **probe), grid_runs(c["runs"]))
    return c["case"]


def grid_runs(runs: list[dict]) -> tuple[GridRun, ...]:
    """A sweep's run records as the fit's `GridRun`s."""
    return tuple(GridRun(r["point"]["optim.lr"], r["final_val_loss"], r["initial_val_loss"], r["diverged"])
                 for r in runs)


def cases(cs: list[dict], ms: dict[str, dict]) -> list[Case]:
    return [case(c, ms[c["name"]]) for c in cs]


def predict_config(c: dict, m: dict, rule: Rule) -> dict:
    """The rule applied to a config's cached measurements: the `Decision` and the outcome at every grid lr."""
    k = case(c, m)
    d = k.decide(rule)
    return {"decision": d, "recommended": d.recommended, "eta_max": d.eta_max, "decider": d.decided_by,
            "outcomes": [outcome(r.lr, d)[0] for r in k.runs], "one_step": _interp(k.probe.line, d.recommended)}


def _interp(points, lr: float) -> float:
    """Linear interpolation in log lr of (lr, value) points; the nearest point outside their range."""
    pts = sorted((a, b) for a, b in points)
    x = np.log([a for a, _ in pts])
    y = np.asarray([b for _, b in pts], dtype=float)
    y = np.where(np.isfinite(y), y, np.nanmax(np.where(np.isfinite(y), y, np.nan)))
    return float(np.interp(math.log(lr), x, y))


RANKERS = {"|lambda_a|": lambda m: abs(m["lambda_a"]), "|lambda_g|": lambda m: abs(m["lambda_g"]),
           "|lambda_a| + |lambda_g|": lambda m: abs(m["lambda_a"]) + abs(m["lambda_g"]),
           "gradient spread": lambda m: m["grad_spread"], "last-block token correlation": lambda m: m["last_corr"]}


def spearman(a, b) -> float:
    ra, rb = (np.argsort(np.argsort(np.asarray(x))) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else math.nan


def recalls(pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Per-outcome recall of (true, predicted) outcome pairs, over the outcomes that occur."""
    return {k: statistics.mean(p == k for t, p in pairs if t == k) for k in OUTCOMES if any(t == k for t, _ in pairs)}


def by_sweep(cs: list[dict]) -> dict[str, list[dict]]:
    """The configs grouped by their sweep (or claim), in first-seen order."""
    out: dict[str, list[dict]] = {}
    for c in cs:
        out.setdefault(c["sweep"], []).append(c)
    return out


def score(cs: list[dict], ms: dict[str, dict], rule: Rule, ranges: dict[str, dict] | None,
          steps: dict[str, dict] | None = None) -> dict:
    """Every figure of one set under ``rule`` (the range test's with ``ranges``, costs per training step with
    ``steps``, the `step_time` of each config)."""
    preds = {c["name"]: predict_config(c, ms[c["name"]], rule) for c in cs}
    regret = {c["name"]: c["case"].regret(preds[c["name"]]["recommended"]) for c in cs}
    truth = [(t, o) for c in cs for t, o in zip(c["case"].achieved, preds[c["name"]]["outcomes"])]
    per_outcome = recalls(truth)
    hindsight = {}
    for group in by_sweep(cs).values():
        grid = group[0]["grid"]
        lr = min(grid, key=lambda x: statistics.mean(c["case"].loss_at(x) for c in group))
        hindsight.update({c["name"]: c["case"].regret(lr) for c in group})
    sweep_s = sum(r["wall_s"] for c in cs for r in c["runs"])
    sweep_passes = sum(r["steps_done"] for c in cs for r in c["runs"])
    sweep_steps_s = (sum(len(c["runs"]) * c["cfg"].train.steps * steps[c["name"]]["step_s"] for c in cs)
                     if steps else math.nan)
    out = {"configs": len(cs), "points": len(truth), "regret": regret, "hindsight": hindsight,
           "median_regret": statistics.median(regret.values()),
           "mean_regret": statistics.mean(regret.values()),
           "within_005": statistics.mean(v <= 0.05 for v in regret.values()),
           "hindsight_median": statistics.median(hindsight.values()),
           "hindsight_mean": statistics.mean(hindsight.values()),
           "hindsight_within_005": statistics.mean(v <= 0.05 for v in hindsight.values()),
           "accuracy": statistics.mean(t == p for t, p in truth), "recalls": per_outcome,
           "balanced": balanced_accuracy(truth),
           "truth_counts": {k: sum(t == k for t, _ in truth) for k in OUTCOMES},
           "spearman": {k: spearman([f(c) for c in cs], [c["case"].best_loss for c in cs]) for k, f in {
               "one-step loss at the recommended lr": lambda c: preds[c["name"]]["one_step"],
               **{k: (lambda c, f=f: f(ms[c["name"]])) for k, f in RANKERS.items()}}.items()},
           "cost": sum(ms[c["name"]]["cost_s"] for c in cs) / sweep_s,
           "cost_steps": sum(ms[c["name"]]["cost_s"] for c in cs) / sweep_steps_s,
           "cost_passes": sum(ms[c["name"]]["passes"] for c in cs) / sweep_passes,
           "preds": preds}
    if ranges is not None:
        for pick in ("steepest", "min_over_10"):
            rg = {c["name"]: c["case"].regret(ranges[c["name"]][pick]) for c in cs}
            out[f"range_{pick}"] = {"median": statistics.median(rg.values()), "mean": statistics.mean(rg.values()),
                                    "within_005": statistics.mean(v <= 0.05 for v in rg.values())}
        out["range_cost"] = sum(ranges[c["name"]]["cost_s"] for c in cs) / sweep_s
        out["range_cost_steps"] = (sum(ranges[c["name"]]["steps"] * steps[c["name"]]["step_s"] for c in cs)
                                   / sweep_steps_s if steps else math.nan)
        out["range_cost_passes"] = sum(ranges[c["name"]]["steps"] for c in cs) / sweep_passes
    return out


def context(cs: list[dict], ms: dict[str, dict], scored: dict) -> dict:
    """What a regret means on one set (module docstring), beside the figures `score` gave it (``scored``): the
    regret at √2 and 2 times the best lr, the tightest scale's spread, and the second seed's figures."""
    return {"neighbours": {f: statistics.median(v for c in cs for v in neighbour_regrets(c, f)) for f in (2 ** .5, 2)},
            "scale_spread": scale_spread(cs, ms), "seed_floor": seed_floor(cs, scored["regret"], scored["preds"])}


def neighbour_regrets(c: dict, factor: float) -> list[float]:
    """Regret at ``factor`` × and ÷ ``factor`` the config's best grid lr (within the grid), if its best run trains:
    how much missing the optimum by that factor costs, i.e. how sharp the optimum of these runs is."""
    k = c["case"]
    if k.best_lr is None:
        return []
    return [k.regret(lr) for lr in (k.best_lr * factor, k.best_lr / factor) if k.runs[0].lr <= lr <= k.runs[-1].lr]


def scale_spreads(cs: list[dict], ms: dict[str, dict]) -> dict[str, float]:
    """Per lr scale (`limits`) measurable on all of them, over the configs whose best run trains: the standard
    deviation of log(best grid lr / scale), how tightly the scale follows the optimum up to a constant factor (a
    factor e^sd)."""
    pairs = [(k.best_lr, k.scales) for k in cases(cs, ms)]
    pairs = [(lr, scales) for lr, scales in pairs if lr is not None]
    return {k: float(np.std([math.log(lr / scales[k]) for lr, scales in pairs])) for k in LIMITS
            if all(math.isfinite(scales[k]) and scales[k] > 0 for _, scales in pairs)}


def scale_spread(cs: list[dict], ms: dict[str, dict]) -> tuple[str, float]:
    """The lr scale that follows the best grid lr most tightly (`scale_spreads`): its name and its spread."""
    spreads = scale_spreads(cs, ms)
    return min(spreads.items(), key=lambda kv: kv[1]) if spreads else ("", math.nan)


def attach_replicates(cs: list[dict]) -> None:
    """Give every config of a `REPLICATES` sweep the same config's runs under another seed (``replicate``), when
    that grid has finished."""
    by_name = {c["name"]: c for c in cs}
    for sweep, path in REPLICATES.items():
        for r in configs(path):
            c = by_name.get(sweep + ":" + r["name"].partition(":")[2])
            if c is not None and r["complete"] and r["grid"] == c["grid"]:
                c["replicate"] = r


def seed_floor(cs: list[dict], regret: dict[str, float], preds: dict[str, dict]) -> dict:
    """Over the configs with a `replicate`: the regret of the replicate's best grid lr on the config's own runs (an
    oracle that knows the optimum of another seed: the floor under any advice scored against one seed), advise's
    ``regret`` and outcome accuracy (``preds``) on the same configs, the median |final loss difference| between the
    seeds at the lrs where both train, and how often the replicate's achieved outcome is the config's (plain and
    balanced, as the outcome accuracy: the ceiling of an outcome prediction scored against one seed)."""
    reps = [c for c in cs if "replicate" in c]
    if not reps:
        return {"configs": 0}
    pairs = [(c["case"], replace(c["case"], runs=grid_runs(c["replicate"]["runs"]))) for c in reps]
    oracle = [k.regret(min(r.runs, key=lambda x: x.loss).lr) for k, r in pairs]
    noise = [abs(a.loss - b.loss) for k, r in pairs for a, b, ta, tb in zip(k.runs, r.runs, k.achieved, r.achieved)
             if ta == tb == "trains"]
    seeds = [pair for k, r in pairs for pair in zip(k.achieved, r.achieved)]
    ours = [pair for c in reps for pair in zip(c["case"].achieved, preds[c["name"]]["outcomes"])]
    return {"configs": len(reps), "oracle_median": statistics.median(oracle),
            "oracle_within_005": statistics.mean(v <= 0.05 for v in oracle),
            "advise_median": statistics.median(regret[c["name"]] for c in reps),
            "advise_within_005": statistics.mean(regret[c["name"]] <= 0.05 for c in reps),
            "noise_median": statistics.median(noise) if noise else math.nan,
            "agreement": statistics.mean(t == p for t, p in seeds),
            "agreement_balanced": balanced_accuracy(seeds),
            "advise_accuracy": statistics.mean(t == p for t, p in ours),
            "advise_balanced": balanced_accuracy(ours)}


def bases_table(cal: list[dict], held: dict[str, list[dict]], ms: dict[str, dict]) -> str:
    """Each lr scale as the recommendation's basis, its multiplier fitted on ``cal`` (`fitted_best`, the rest of
    the shipped rule kept), scored on ``cal`` and on each held-out set: median / mean regret; with the s.d. of
    log(best grid lr / scale) on ``cal`` (how tightly the scale follows the optimum there)."""
    spreads = scale_spreads(cal, ms)
    sets = {"calibration": cal, **held}
    lines = ["| basis | s.d. of log(best lr / scale), calibration | fitted best | "
             + " | ".join(f"{k}: median / mean regret" for k in sets) + " |", "|---|---|---|" + "---|" * len(sets)]
    for k in (*usable_scales(cases(cal, ms)), WINDOW):
        r = fitted_best(cases(cal, ms), Rule(), k)
        marks = " (shipped)" if k == Rule().basis else ""
        cells = [f"{x['median_regret']:.3f} / {x['mean_regret']:.3f}" for x in (score(v, ms, r, None)
                                                                                for v in sets.values())]
        lines.append(f"| {k}{marks} | {f'{spreads[k]:.2f}' if k in spreads else ''} | {r.best:.3g} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(sets: dict[str, list[dict]], ms, ranges, steps, rule_cal: Rule, rule_rev: Rule) -> str:
    lines = []
    for label, rule in (("fitted on calibration", rule_cal), ("fitted on scoring (reverse)", rule_rev)):
        lines.append(f"**Rule {label}**: " + ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v!r}"
                                                      for k, v in asdict(rule).items() if k != "caveat"))
        lines.append("")
        lines.append("| figure | target | calibration set | scoring set |")
        lines.append("|---|---|---|---|")
        s = {k: score(v, ms, rule, ranges, steps) for k, v in sets.items()}
        for k, v in sets.items():
            s[k] |= context(v, ms, s[k])
        fitted_on = "calibration" if rule is rule_cal else "scoring"
        ranker = max(s[fitted_on]["spearman"], key=s[fitted_on]["spearman"].get)
        f = lambda key, fmt="{:.3f}", s=s: " | ".join(fmt.format(s[k][key]) for k in ("calibration", "scoring"))
        rg = lambda pick, key, s=s: " | ".join(f"{s[k][f'range_{pick}'][key]:.3f}" for k in ("calibration", "scoring"))
        lines += [
            f"| configs / (config, lr) points | | {s['calibration']['configs']} / {s['calibration']['points']} | "
            f"{s['scoring']['configs']} / {s['scoring']['points']} |",
            f"| advise median regret (nats) | ≤ 0.02 | {f('median_regret')} |",
            f"| hindsight single lr, median regret | | {f('hindsight_median')} |",
            f"| range test steepest, median regret | | {rg('steepest', 'median')} |",
            f"| range test min/10, median regret | | {rg('min_over_10', 'median')} |",
            f"| advise share of configs with regret ≤ 0.05 | ≥ 0.80 | {f('within_005')} |",
            f"| hindsight single lr, share ≤ 0.05 | | {f('hindsight_within_005')} |",
            f"| range test steepest, share ≤ 0.05 | | {rg('steepest', 'within_005')} |",
            f"| advise mean regret | < hindsight mean | {f('mean_regret')} |",
            f"| hindsight single lr, mean regret | | {f('hindsight_mean')} |",
            f"| range test steepest, mean regret | | {rg('steepest', 'mean')} |",
            f"| range test min/10, mean regret | | {rg('min_over_10', 'mean')} |",
            "| regret at ×÷√2 / ×÷2 the best grid lr, median | | " + " | ".join(
                " / ".join(f"{v:.3f}" for v in s[k]["neighbours"].values()) for k in ("calibration", "scoring")) + " |",
            "| s.d. of log(best grid lr / scale), the tightest lr scale | | " + " | ".join(
                "{1:.2f} ({0})".format(*s[k]["scale_spread"]) for k in ("calibration", "scoring")) + " |",
            *_floor_rows(s),
            f"| outcome accuracy | ≥ 0.90 | {f('accuracy')} |",
            f"| outcome balanced accuracy | ≥ 0.80 | {f('balanced')} |",
            "| achieved outcomes (diverges/stalls/trains) | | " + " | ".join(
                "/".join(str(s[k]['truth_counts'][o]) for o in OUTCOMES) for k in ("calibration", "scoring")) + " |",
            "| per-outcome recall (diverges/stalls/trains) | | " + " | ".join(
                "/".join(f"{s[k]['recalls'].get(o, math.nan):.2f}" for o in OUTCOMES)
                for k in ("calibration", "scoring")) + " |",
            f"| Spearman(predicted, achieved best loss): {ranker} (of {len(s[fitted_on]['spearman'])} init "
            f"quantities, the best on the {fitted_on} set) | | "
            + " | ".join(f"{s[k]['spearman'][ranker]:.3f}" for k in ("calibration", "scoring")) + " |",
            f"| advise cost / sweep compute (wall, side by side) | ≤ 0.02 | {f('cost_steps', '{:.4f}')} |",
            f"| range test cost / sweep compute (wall, side by side) | | {f('range_cost_steps', '{:.4f}')} |",
            f"| advise cost / sweep compute (wall, as logged) | | {f('cost', '{:.4f}')} |",
            f"| range test cost / sweep compute (wall, as logged) | | {f('range_cost', '{:.4f}')} |",
            f"| advise forward+backward passes / sweep's | | {f('cost_passes', '{:.4f}')} |",
            f"| range test steps / sweep's | | {f('range_cost_passes', '{:.4f}')} |",
            "",
        ]
        misses = [(k, n, v) for k in ("calibration", "scoring") for n, v in s[k]["regret"].items() if v > 0.05]
        if misses:
            lines.append("Configs with regret > 0.05 nats: " + "; ".join(
                f"{n} ({k}, {v:.3f}, recommended {s[k]['preds'][n]['recommended']:.3g}, "
                f"decided by {s[k]['preds'][n]['decider']})" for k, n, v in sorted(misses, key=lambda x: -x[2])))
            lines.append("")
    return "\n".join(lines)


def _floor_rows(s: dict) -> list[str]:
    """The table's rows on the seed-to-seed floor (`seed_floor`) of the calibration and scoring sets."""
    fl = [s[k]["seed_floor"] for k in ("calibration", "scoring")]
    cell = lambda key, fmt="{:.3f}": " | ".join(fmt.format(x[key]) if x["configs"] else "–" for x in fl)
    return [f"| configs with a second seed | | {cell('configs', '{}')} |",
            f"| second seed's best lr, median regret | | {cell('oracle_median')} |",
            f"| second seed's best lr, share ≤ 0.05 | | {cell('oracle_within_005')} |",
            "| advise on those configs, median regret / share ≤ 0.05 | | " + " | ".join(
                f"{x['advise_median']:.3f} / {x['advise_within_005']:.3f}" if x["configs"] else "–"
                for x in fl) + " |",
            f"| final loss, seed 0 against seed 1, median abs. difference (lrs where both train) | | "
            f"{cell('noise_median')} |",
            "| outcome of seed 1 as a prediction of seed 0's: accuracy / balanced | | " + " | ".join(
                f"{x['agreement']:.3f} / {x['agreement_balanced']:.3f}" if x["configs"] else "–" for x in fl) + " |",
            "| advise on those configs, outcome accuracy / balanced | | " + " | ".join(
                f"{x['advise_accuracy']:.3f} / {x['advise_balanced']:.3f}" if x["configs"] else "–" for x in fl) + " |"]


def _splice(path: Path, text: str, marker: str = MARKER) -> None:
    doc = path.read_text()
    if doc.count(marker) != 2:
        raise ValueError(f"{path} needs two {marker} markers around the evaluation table")
    head, _, rest = doc.partition(marker)
    _, _, tail = rest.partition(marker)
    path.write_text(f"{head}{marker}\n{text}\n{marker}{tail}")


def claims_table(cs: list[dict], ms: dict[str, dict], ranges: dict[str, dict], steps: dict[str, dict],
                 refused: dict[str, str]) -> str:
    """The shipped rule and the range test on the claims' lr grids: per config, then each claim's figures and,
    for several claims, those of all their configs together; then the configs advise refused, with its reason."""
    sets = by_sweep(cs)
    if len(sets) > 1:
        sets["all"] = cs
    scores = {k: score(v, ms, Rule(), ranges, steps) for k, v in sets.items()}
    s = scores["all" if len(sets) > 1 else cs[0]["sweep"]]
    lines = ["| config | lr grid | best grid lr | advise lr [interval] | advise regret | range test steepest / "
             "min/10: lr (regret) | outcomes achieved | outcomes predicted |", "|---|---|---|---|---|---|---|---|"]
    for c in cs:
        p, r = s["preds"][c["name"]], ranges[c["name"]]
        lo, hi = p["decision"].interval
        picks = " / ".join(f"{r[k]:.3g} ({c['case'].regret(r[k]):.3f})" for k in ("steepest", "min_over_10"))
        lines.append(f"| {c['name']} | {', '.join(f'{x:g}' for x in c['grid'])} | "
                     f"{min(c['case'].runs, key=lambda x: x.loss).lr:g} | {p['recommended']:.3g} "
                     f"[{lo:.3g}, {hi:.3g}] | {s['regret'][c['name']]:.3f} | {picks} | "
                     f"{' '.join(o[0] for o in c['case'].achieved)} | {' '.join(o[0] for o in p['outcomes'])} |")
    rows = {"configs / (config, lr) points": lambda x: f"{x['configs']} / {x['points']}",
            "advise median / mean regret (nats)": lambda x: f"{x['median_regret']:.3f} / {x['mean_regret']:.3f}",
            "hindsight single lr, median / mean regret":
                lambda x: f"{x['hindsight_median']:.3f} / {x['hindsight_mean']:.3f}",
            **{f"range test {name}, median / mean regret":
               (lambda x, k=k: f"{x[f'range_{k}']['median']:.3f} / {x[f'range_{k}']['mean']:.3f}")
               for k, name in (("steepest", "steepest"), ("min_over_10", "min/10"))},
            "advise share of configs with regret ≤ 0.05": lambda x: f"{x['within_005']:.3f}",
            "outcome accuracy / balanced": lambda x: f"{x['accuracy']:.3f} / {x['balanced']:.3f}",
            "advise cost / sweep compute (wall, side by side)": lambda x: f"{x['cost_steps']:.4f}",
            "range test cost / sweep compute (wall, side by side)": lambda x: f"{x['range_cost_steps']:.4f}"}
    lines += ["", "| figure | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
    lines += [f"| {name} | " + " | ".join(f(scores[k]) for k in sets) + " |" for name, f in rows.items()]
    if refused:
        lines += ["", "Refused by advise, so not scored: " + "; ".join(f"{k} ({v})" for k, v in refused.items())]
    return "\n".join(lines)


def measure_all(cs: list[dict]) -> tuple[dict, dict, dict]:
    """advise's probe, one training step's time and the range test of every config (each cached)."""
    ms, ranges, steps = {}, {}, {}
    for i, c in enumerate(cs):
        ms[c["name"]] = measured(c)
        steps[c["name"]] = step_time(c)
        ranges[c["name"]] = ranged(c)
        print(f"[{i + 1}/{len(cs)}] {c['name']}", file=sys.stderr)
    return ms, ranges, steps


def judged_claims() -> tuple[list[dict], dict[str, str]]:
    """The configs of the claims' lr grids (`CLAIMS`) that advise judges, and those it refuses with its reason."""
    cs = list(itertools.chain.from_iterable(claim_configs(p) for p in CLAIMS))
    if not cs:
        raise SystemExit(f"no lr grid in {', '.join(CLAIMS)}: run `sigprop reproduce NAME --out runs/reproduce`")
    refused = {}
    for c in cs:
        try:
            measured(c)
        except NotImplementedError as e:
            refused[c["name"]] = str(e)
    return [c for c in cs if c["name"] not in refused], refused


def sweep_configs() -> list[dict]:
    """The configs of `SWEEPS` whose every grid lr finished, with their second seed's runs where there is one."""
    found = list(itertools.chain.from_iterable(configs(p) for p in SWEEPS))
    cs = [c for c in found if c["complete"]]
    attach_replicates(cs)
    print(f"{len(cs)} configs with every grid lr finished; left out: "
          f"{[c['name'] for c in found if not c['complete']]}", file=sys.stderr)
    return cs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="splice the table into docs/advise.md and bench/RESULTS.md")
    ap.add_argument("--claims", action="store_true", help="score the shipped rule on the claims' lr grids")
    ap.add_argument("--bases", action="store_true", help="each lr scale as the basis, fitted on the balanced "
                    "calibration set, scored on its scoring set and the claims' lr grids")
    args = ap.parse_args()
    if args.claims or args.bases:
        claims, refused = judged_claims()
        if args.claims:
            text, marker = claims_table(claims, *measure_all(claims), refused), CLAIMS_MARKER
        else:
            cs = sweep_configs()
            ms = {c["name"]: measured(c) for c in cs + claims}           # no range test or step time needed
            held = {"scoring": [c for c in cs if c["set"]["balanced"] == "scoring"], **by_sweep(claims)}
            text = bases_table([c for c in cs if c["set"]["balanced"] == "calibration"], held, ms)
            marker = BASES_MARKER
        print(text)
        if args.write:
            for path in (Path("docs/advise.md"), Path("bench/RESULTS.md")):
                _splice(path, text, marker)
        return 0
    cs = sweep_configs()
    ms, ranges, steps = measure_all(cs)
    texts, rules = [], {}
    for name in SPLITS:
        sets = {k: [c for c in cs if c["set"][name] == k] for k in ("calibration", "scoring")}
        rules[name] = fit(cases(sets["calibration"], ms))
        texts.append(f"#### Split: {SPLITS[name]}\n\n" + table(sets, ms, ranges, steps, rules[name],
                                                                 fit(cases(sets["scoring"], ms))))
    text = "\n".join(texts)
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "table.md").write_text(text + "\n")
    (CACHE / "rule.json").write_text(json.dumps({k: asdict(r) for k, r in rules.items()}))
    print(text)
    if args.write:
        _splice(Path("docs/advise.md"), text)
        _splice(Path("bench/RESULTS.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
