"""Evaluation of `sigprop advise` and of the LR range test on the lr sweeps that exist here.

    OMP_NUM_THREADS=1 python bench/advise.py            # after the three sweeps below have run

Sweeps (`sigprop sweep --config FILE --jobs 2`): configs/sweep/depth_lr.toml, configs/sweep/width_mup.toml and
configs/sweep/advise_eval.toml. A *config* is a sweep point without its lr; its runs over the lr grid give the
achieved outcome of every (config, lr) and the grid's best loss. Achieved outcome of a run: ``diverges`` if its
loss became non-finite or it ended above its own initial loss minus 0.1 nats or more than 0.1 nats above its
best evaluation (the loss went back up); else ``stalls`` if it ended within 0.1 nats of the unigram loss of its
data or above it; else ``trains``.

Calibration and scoring sets are disjoint: calibration = depth_lr, width_mup and the d_model = 32 configs of
advise_eval; scoring = the d_model = 64 configs of advise_eval. The `Rule` constants are fitted on one set
(`fit`) and every figure is reported on both; the reverse fit (on the scoring set, scored on calibration) is
reported too. Per config: regret = final loss at the recommended lr (linear in log lr between grid points, the
nearest grid point outside the grid; a diverged run counts its initial loss) − the grid's best loss; the
hindsight baseline is the one grid lr with the lowest mean loss over the set's configs of each sweep. Cost =
advise's wall seconds / the sweep's training wall seconds of the config's runs (both measured on this machine).

Advise and range-test results are cached per config under runs/advise-bench/ (delete it to re-measure).
Writes the table to stdout, runs/advise-bench/table.md and, with --write, into docs/advise.md and
bench/RESULTS.md between their ``<!-- advise-eval -->`` markers.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from sigprop.advice.advise import advise
from sigprop.advice.probe import Probe
from sigprop.advice.range_test import run_range_test
from sigprop.advice.rule import OUTCOMES, STALL_MARGIN, Rule, limits, outcome, schedule_area
from sigprop.experiments.training import unigram_loss
from sigprop.train.config import RunConfig, from_mapping
from sigprop.train.schedules import lr_at
from sigprop.train.sweep import load_spec, logged_records

SWEEPS = ("configs/sweep/depth_lr.toml", "configs/sweep/width_mup.toml", "configs/sweep/advise_eval.toml")
CACHE = Path("runs/advise-bench")
MARKER = "<!-- advise-eval -->"
LIMITS = ("edge of stability", "output change", "attention logits", "one-step loss")


def achieved(r: dict, unigram: float) -> str:
    """The achieved outcome of a sweep record (module docstring)."""
    final, first, best = r["final_val_loss"], r["initial_val_loss"], r["best_val_loss"]
    if r["diverged"] or not math.isfinite(final) or final > first - STALL_MARGIN or final > best + STALL_MARGIN:
        return "diverges"
    return "stalls" if final >= unigram - STALL_MARGIN else "trains"


def run_loss(r: dict) -> float:
    """A run's final loss, its initial loss if it diverged."""
    return r["final_val_loss"] if math.isfinite(r["final_val_loss"]) else r["initial_val_loss"]


def configs(path: str) -> list[dict]:
    """Every config of a sweep with at least one finished run: name, set, RunConfig (its first run's, lr aside),
    the sweep's lr grid, its finished runs (``complete`` when every grid lr has one), unigram loss."""
    spec = load_spec(path)
    records, _ = logged_records(spec)
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
        fold = "scoring" if sweep == "advise_eval" and cfg.model.d_model == 64 else "calibration"
        out.append({"name": name, "sweep": sweep, "set": fold, "cfg": cfg, "runs": runs, "unigram": unigram,
                    "grid": grid, "complete": len(runs) == len(grid)})
    return out


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


def _probe(m: dict, records: tuple = ()) -> Probe:
    p = dict(m["probe"])
    p["line"] = tuple(tuple(x) for x in p["line"])
    return Probe(records=records, **p)


class _Last:
    """The one record `outcome` reads: the last block's token correlation."""

    def __init__(self, corr: float) -> None:
        self.layer, self.stack, self.token_corr = 1, "dec", corr


def predict_config(c: dict, m: dict, rule: Rule) -> dict:
    """The rule applied to a config's cached measurements: η_max, recommended lr, outcome per grid lr."""
    p = _probe(m, (_Last(m["last_corr"]),))
    beta1 = c["cfg"].optim.beta1
    raw = limits(p, beta1)
    mult = dict(zip(LIMITS, (rule.c_eos, rule.c_out, rule.c_att, rule.c_line)))
    scaled = {k: mult[k] * v for k, v in raw.items()}
    decider = min(scaled, key=scaled.get)
    eta = scaled[decider]
    steps = c["cfg"].train.steps
    area = schedule_area([lr_at(t, steps, replace(c["cfg"].optim, lr=1.0)) for t in range(steps)])
    outs = [outcome(lr, p, eta, decider, area, c["unigram"], rule)[0] for lr in c["grid"]]
    return {"eta_max": eta, "decider": decider, "recommended": rule.ratio * eta, "outcomes": outs,
            "one_step": _interp(p.line, rule.ratio * eta)}


def _interp(points, lr: float) -> float:
    """Linear interpolation in log lr of (lr, value) points; the nearest point outside their range."""
    pts = sorted((a, b) for a, b in points)
    x = np.log([a for a, _ in pts])
    y = np.asarray([b for _, b in pts], dtype=float)
    y = np.where(np.isfinite(y), y, np.nanmax(np.where(np.isfinite(y), y, np.nan)))
    return float(np.interp(math.log(lr), x, y))


def loss_at(c: dict, lr: float) -> float:
    return _interp([(r["point"]["optim.lr"], run_loss(r)) for r in c["runs"]], lr)


def best_loss(c: dict) -> float:
    return min(run_loss(r) for r in c["runs"])


def spearman(a, b) -> float:
    ra, rb = (np.argsort(np.argsort(np.asarray(x))) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else math.nan


def score(cs: list[dict], ms: dict[str, dict], rule: Rule, ranges: dict[str, dict] | None) -> dict:
    """Every figure of one set under ``rule``."""
    preds = {c["name"]: predict_config(c, ms[c["name"]], rule) for c in cs}
    regret = {c["name"]: loss_at(c, preds[c["name"]]["recommended"]) - best_loss(c) for c in cs}
    truth = [(achieved(r, c["unigram"]), o) for c in cs for r, o in zip(c["runs"], preds[c["name"]]["outcomes"])]
    recalls = {k: statistics.mean(p == k for t, p in truth if t == k)
               for k in OUTCOMES if any(t == k for t, _ in truth)}
    hindsight = {}
    for sweep in {c["sweep"] for c in cs}:
        group = [c for c in cs if c["sweep"] == sweep]
        grid = group[0]["grid"]
        lr = min(grid, key=lambda x: statistics.mean(loss_at(c, x) for c in group))
        hindsight.update({c["name"]: loss_at(c, lr) - best_loss(c) for c in group})
    sweep_s = sum(r["wall_s"] for c in cs for r in c["runs"])
    out = {"configs": len(cs), "points": len(truth), "regret": regret, "hindsight": hindsight,
           "median_regret": statistics.median(regret.values()),
           "mean_regret": statistics.mean(regret.values()),
           "within_005": statistics.mean(v <= 0.05 for v in regret.values()),
           "hindsight_median": statistics.median(hindsight.values()),
           "hindsight_mean": statistics.mean(hindsight.values()),
           "hindsight_within_005": statistics.mean(v <= 0.05 for v in hindsight.values()),
           "accuracy": statistics.mean(t == p for t, p in truth), "recalls": recalls,
           "balanced": statistics.mean(recalls.values()),
           "truth_counts": {k: sum(t == k for t, _ in truth) for k in OUTCOMES},
           "spearman": spearman([preds[c["name"]]["one_step"] for c in cs], [best_loss(c) for c in cs]),
           "cost": sum(ms[c["name"]]["cost_s"] for c in cs) / sweep_s,
           "preds": preds}
    if ranges is not None:
        for pick in ("steepest", "min_over_10"):
            rg = {c["name"]: loss_at(c, ranges[c["name"]][pick]) - best_loss(c) for c in cs}
            out[f"range_{pick}"] = {"median": statistics.median(rg.values()), "mean": statistics.mean(rg.values()),
                                    "within_005": statistics.mean(v <= 0.05 for v in rg.values())}
        out["range_cost"] = sum(ranges[c["name"]]["cost_s"] for c in cs) / sweep_s
    return out


def _log2_grid(lo: float, hi: float, step: float = 0.25) -> list[float]:
    return [2.0 ** (lo + step * i) for i in range(int((hi - lo) / step) + 1)]


def fit(cs: list[dict], ms: dict[str, dict]) -> Rule:
    """The rule's constants on one set. The limit multipliers maximise the outcome balanced accuracy: first one
    common scale of all four (powers of 2^¼ from 2^-8 to 2^12), then each multiplier and κ in turn (three
    rounds; a tie keeps the current value). Then r minimises the mean regret (r ≤ 1: never above the largest
    stable lr), and [r_lo, r_hi] are the 10 % and 90 % quantiles of best-grid-lr / η_max, widened to hold r."""
    def bal(r: Rule) -> float:
        s = score(cs, ms, r, None)
        return s["balanced"] + 1e-3 * s["accuracy"]

    def best_of(rules: list[Rule], current: Rule) -> Rule:
        top = max(rules, key=bal)
        return current if bal(current) >= bal(top) else top

    rule = Rule()
    rule = best_of([replace(rule, c_eos=v, c_out=v, c_att=v, c_line=v) for v in _log2_grid(-8, 12)], rule)
    for _ in range(3):
        for name in ("c_eos", "c_out", "c_att", "c_line", "kappa"):
            now = getattr(rule, name)
            rule = best_of([replace(rule, **{name: now * f}) for f in _log2_grid(-6, 6)], rule)
    ratios = []
    for c in cs:
        eta = predict_config(c, ms[c["name"]], rule)["eta_max"]
        best = min(c["runs"], key=run_loss)["point"]["optim.lr"]
        ratios.append(best / eta)
    lo, hi = (min(float(math.exp(v)), 1.0) for v in np.quantile(np.log(ratios), [0.1, 0.9]))
    mean_regret = lambda r: score(cs, ms, replace(rule, ratio=r, ratio_lo=min(r, lo), ratio_hi=max(r, hi)),
                                  None)["mean_regret"]
    mid = min(_log2_grid(-10, 0), key=mean_regret)
    return replace(rule, ratio=mid, ratio_lo=min(lo, mid), ratio_hi=max(hi, mid))


def table(sets: dict[str, list[dict]], ms, ranges, rule_cal: Rule, rule_rev: Rule) -> str:
    lines = []
    for label, rule in (("fitted on calibration", rule_cal), ("fitted on scoring (reverse)", rule_rev)):
        lines.append(f"**Rule {label}**: " + ", ".join(f"{k} = {v:.4g}" for k, v in asdict(rule).items()))
        lines.append("")
        lines.append("| figure | target | calibration set | scoring set |")
        lines.append("|---|---|---|---|")
        s = {k: score(v, ms, rule, ranges) for k, v in sets.items()}
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
            f"| outcome accuracy | ≥ 0.90 | {f('accuracy')} |",
            f"| outcome balanced accuracy | ≥ 0.80 | {f('balanced')} |",
            "| achieved outcomes (diverges/stalls/trains) | | " + " | ".join(
                "/".join(str(s[k]['truth_counts'][o]) for o in OUTCOMES) for k in ("calibration", "scoring")) + " |",
            "| per-outcome recall (diverges/stalls/trains) | | " + " | ".join(
                "/".join(f"{s[k]['recalls'].get(o, math.nan):.2f}" for o in OUTCOMES)
                for k in ("calibration", "scoring")) + " |",
            f"| Spearman(predicted, achieved best loss) | | {f('spearman')} |",
            f"| advise cost / sweep compute | ≤ 0.02 | {f('cost', '{:.4f}')} |",
            f"| range test cost / sweep compute | | {f('range_cost', '{:.4f}')} |",
            "",
        ]
        misses = [(k, n, v) for k in ("calibration", "scoring") for n, v in s[k]["regret"].items() if v > 0.05]
        if misses:
            lines.append("Configs with regret > 0.05 nats: " + "; ".join(
                f"{n} ({k}, {v:.3f}, recommended {s[k]['preds'][n]['recommended']:.3g}, "
                f"decided by {s[k]['preds'][n]['decider']})" for k, n, v in sorted(misses, key=lambda x: -x[2])))
            lines.append("")
    return "\n".join(lines)


def _splice(path: Path, text: str) -> None:
    doc = path.read_text()
    if doc.count(MARKER) != 2:
        raise ValueError(f"{path} needs two {MARKER} markers around the evaluation table")
    head, _, rest = doc.partition(MARKER)
    _, _, tail = rest.partition(MARKER)
    path.write_text(f"{head}{MARKER}\n{text}\n{MARKER}{tail}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="splice the table into docs/advise.md and bench/RESULTS.md")
    args = ap.parse_args()
    found = list(itertools.chain.from_iterable(configs(p) for p in SWEEPS))
    cs = [c for c in found if c["complete"]]
    print(f"{len(cs)} configs with every grid lr finished; left out: "
          f"{[c['name'] for c in found if not c['complete']]}", file=sys.stderr)
    ms, ranges = {}, {}
    for i, c in enumerate(cs):
        ms[c["name"]] = measured(c)
        ranges[c["name"]] = ranged(c)
        print(f"[{i + 1}/{len(cs)}] {c['name']}", file=sys.stderr)
    sets = {k: [c for c in cs if c["set"] == k] for k in ("calibration", "scoring")}
    rule_cal = fit(sets["calibration"], ms)
    rule_rev = fit(sets["scoring"], ms)
    text = table(sets, ms, ranges, rule_cal, rule_rev)
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "table.md").write_text(text + "\n")
    (CACHE / "rule.json").write_text(json.dumps(asdict(rule_cal)))
    print(text)
    if args.write:
        _splice(Path("docs/advise.md"), text)
        _splice(Path("bench/RESULTS.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
