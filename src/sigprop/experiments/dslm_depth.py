"""DeepScaleLM's depth claim at CPU scale: very deep decoders train with DSLM, the standard init fails.

Claims (Kedia et al., ICML 2024): (a) at 192 layers DSLM trains stably where the standard Pre-LN /
Post-LN init diverges or stalls; (b) a 1000-layer thin model trains with DSLM.

Setup: causal LM on the embedded corpus (data.source "pydoc", BPE vocabulary 512), width 64, 4 heads,
seq 32, batch 8, 300 steps for every run: scheme "preln" and "postln" (standard init), "dslm" with norm
"preln" and "postln"; AdamW, linear warmup over 10 % of the steps, then a constant lr (no decay that
could rescue a run late), global gradient-norm clip 1.0 (the trainer's default, kept for every run).

Learning rates (`sigprop.experiments.tuning`): each of the four 192-layer models is trained on tuning
seed `TUNING_SEED` (not scored) at every lr of `FULL["lrs"]`, the grid extended past an edge that holds
its lowest final loss. From those runs: each model's *largest stable lr* (the largest lr whose run trains,
rule below) and each DSLM model's chosen lr (lowest final loss). Scored (seeds 0, 1): each DSLM model at
its chosen lr, and the standard model of the same norm at that same lr ("does the standard init train at
DSLM's lr?"). The 1000-layer DSLM Pre-LN model runs at the chosen lr of 192-layer DSLM Pre-LN (seeds 0,
1; not tuned at 1000 layers, which the budget does not allow).

Rule: a run *trains* if its final held-out loss is at least 0.1 nats below U, the cross-entropy on the
run's own evaluation tokens of the add-one-smoothed unigram distribution of its training split (the loss
of a model that learned token frequencies and ignores the context, which a short run reaches without
learning anything else). Verdict: `sigprop.experiments.verdicts.dslm_depth` (every DSLM run trains and
every standard run at DSLM's lr fails: reproduced; DSLM trains and some standard runs fail, or a
standard model's largest stable lr is below DSLM's: partly).

Cost: ``deep_seeds=(0,)`` halves the 1000-layer runs; ``train.flush_denormal`` speeds up the standard
Post-LN runs, whose trained gradients are subnormal floats, but changes their numbers.

    from sigprop.experiments import dslm_depth
    summary = dslm_depth.run("runs/dslm-depth")            # dslm-depth.{json,png,md}
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..train.sweep_report import log_ticks
from . import verdicts
from .dslm_moments import CONFIGS
from .outputs import WallClock, write_outputs
from .report import Table
from .training import param_count, resolve_sizes, seed_stats, unigram_by_seed
from .tuning import MAX_EXTEND, TUNING_SEED, lr_summary, numbers, sweep_runs, tune_all

NAME = "dslm-depth"
VOCAB = 512
FULL = {"depth": 192, "deep_depth": 1000, "width": 64, "heads": 4, "seq": 32, "batch": 8, "steps": 300,
        "lrs": (3e-3, 1e-2, 3e-2), "seeds": (0, 1), "deep_seeds": (0, 1), "deep_norms": ("preln",),
        "eval_every": 50, "jobs": 2, "max_extend": MAX_EXTEND}
QUICK = {**FULL, "depth": 6, "deep_depth": 16, "width": 16, "heads": 2, "seq": 16, "batch": 4, "steps": 12,
         "lrs": (3e-3, 1e-2), "seeds": (0,), "deep_seeds": (0,), "eval_every": 4, "jobs": 1, "max_extend": 0}


def tables(s: dict[str, Any], scheme: str, norm: str | None, depth: int) -> dict[str, Any]:
    """Run-config sections of one decoder (``depth`` × ``s["width"]``): constant lr after a 10 % warmup."""
    return {"model": {"arch": "decoder", "scheme": scheme, "vocab_size": VOCAB, "d_model": s["width"],
                      "n_layers": depth, "n_heads": s["heads"], "max_seq_len": s["seq"],
                      **({"norm": norm} if norm else {})},
            "data": {"source": "pydoc", "seq_len": s["seq"]},
            "optim": {"warmup_steps": max(1, s["steps"] // 10), "decay": "constant"},
            "train": {"steps": s["steps"], "batch_size": s["batch"], "eval_every": s["eval_every"], "eval_batches": 4,
                      "diag_every": 0}}


def norm_of(label: str) -> str:
    """"preln" | "postln" for a `CONFIGS` label."""
    scheme, norm = CONFIGS[label]
    return norm or scheme


def _grad_stats(curve: Sequence[Sequence[float]]) -> dict[str, float]:
    """Median pre-clip gradient norm over the first and the last tenth of the steps, and the maximum."""
    g = np.array([row[2] for row in curve], dtype=float)
    if not len(g):                                      # diverged at the first step
        return {"first": math.nan, "last": math.nan, "max": math.nan}
    k = max(1, len(g) // 10)
    return {"first": float(np.median(g[:k])), "last": float(np.median(g[-k:])), "max": float(np.nanmax(g))}


def scored(runs: Sequence[dict[str, Any]], unigram: dict[int, float]) -> dict[str, Any]:
    """What the JSON keeps of scored runs: seeds, final losses, their unigram levels, each run's status."""
    return {"seeds": [r["seed"] for r in runs], "final_loss": [r["final_val_loss"] for r in runs],
            "unigram": [unigram[r["seed"]] for r in runs],
            "trains": [verdicts.trains(r["final_val_loss"], unigram[r["seed"]]) for r in runs],
            "initial_val_loss": seed_stats(r["initial_val_loss"] for r in runs),
            "final_val_loss": seed_stats(r["final_val_loss"] for r in runs),
            "grad_norm": [_grad_stats(r["train_curve"]) for r in runs], "diverged": [r["diverged"] for r in runs]}


def measure(out_dir: str | Path, quick: bool = False, show_progress: bool = True, **sizes: Any
            ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Tune, score and run the deep model (runs in ``out_dir/sweeps``); return (curves per configuration,
    summary with the verdict, the resolved sizes).

    ``sizes`` override `FULL` (or `QUICK` when ``quick``): depth, deep_depth, width, heads, seq, batch, steps,
    lrs, seeds, deep_seeds, deep_norms (DSLM norms at deep_depth), eval_every, jobs, max_extend.
    """
    s = resolve_sizes(QUICK if quick else FULL, sizes)
    sweeps, clock = Path(out_dir) / "sweeps", WallClock(out_dir, NAME)
    dslm = [k for k, (scheme, _) in CONFIGS.items() if scheme == "dslm"]
    standard = [k for k in CONFIGS if k not in dslm]
    grid = lambda k: (tables(s, *CONFIGS[k], s["depth"]), s["lrs"])
    tuned = tune_all(sweeps, {k: grid(k) for k in dslm}, s["seeds"], s["jobs"], s["max_extend"],
                     desc=f"{NAME}: DSLM", show_progress=show_progress)
    tuned |= tune_all(sweeps, {k: grid(k) for k in standard}, [], s["jobs"], s["max_extend"],
                      desc=f"{NAME}: standard", show_progress=show_progress)
    lr = {norm_of(k): tuned[k]["best_lr"] for k in dslm}                  # norm -> DSLM's chosen lr
    plan = {k: (CONFIGS[k], s["depth"]) for k in CONFIGS}
    plan |= {f"{k} depth {s['deep_depth']}": (CONFIGS[k], s["deep_depth"])
             for k in dslm if norm_of(k) in s["deep_norms"]}
    runs = {k: tuned[k]["runs"] for k in dslm}
    for k, (cfg, depth) in plan.items():
        if k not in runs:          # standard at DSLM's lr, and the deep model (nothing to run if DSLM never trained)
            seeds = s["seeds"] if depth == s["depth"] else s["deep_seeds"]
            chosen = lr[norm_of(k.split(" depth")[0])]
            runs[k] = sweep_runs(sweeps, tables(s, *cfg, depth), [chosen], seeds, s["jobs"]) if chosen else []
    unigram = unigram_by_seed([*(r for k in CONFIGS for r in tuned[k]["tuning_runs"]),
                               *(r for rs in runs.values() for r in rs)])
    configs: dict[str, Any] = {}
    for k, rs in runs.items():
        (scheme, _), depth = plan[k]
        norm = norm_of(k.split(" depth")[0])
        entry = {"scheme": scheme, "norm": norm, "depth": depth, "lr": lr[norm],
                 "params": param_count(tables(s, *plan[k][0], depth)["model"]), **scored(rs, unigram)}
        if k in tuned:
            t = tuned[k]
            entry.update({**numbers(t), "seeds": entry["seeds"], "final_loss": entry["final_loss"],
                          "tuning_unigram": unigram[TUNING_SEED]})
            entry["largest_stable_lr"], entry["largest_stable_at_top"] = verdicts.largest_stable_lr(entry)
            entry["tuning_trains"] = [verdicts.trains(x, unigram[TUNING_SEED]) for x in t["tuning_loss"]]
        configs[k] = entry
    summary = {"configs": configs, "seeds": list(s["seeds"]), "deep_seeds": list(s["deep_seeds"]),
               "tuning_seed": TUNING_SEED, "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in s.items()},
               "wall_s": clock.seconds()}
    name, reason = judge(summary)
    summary = {"verdict": name, "verdict_reason": reason, **summary}
    curves = {k: [{"seed": r["seed"], "lr": r["lr"], "val_curve": r["val_curve"],
                   "grad_curve": [[row[0], row[2]] for row in r["train_curve"]]} for r in rs] for k, rs in runs.items()}
    curves["tuning"] = {k: [{"lr": r["lr"], "val_curve": r["val_curve"]} for r in tuned[k]["tuning_runs"]]
                        for k in CONFIGS}
    return curves, summary, s


def judge(summary: dict[str, Any]) -> tuple[str, str]:
    """(verdict, reason): `verdicts.dslm_depth` on a summary's numbers (as saved in dslm-depth.json)."""
    configs, s = summary["configs"], summary["sizes"]
    at = lambda scheme: {c["norm"]: c for k, c in configs.items()
                         if (c["scheme"] == "dslm") == (scheme == "dslm") and c["depth"] == s["depth"]}
    deep = {k: c for k, c in configs.items() if c["depth"] == s["deep_depth"]}
    return verdicts.dslm_depth(at("dslm"), at("standard"), deep, s["steps"])


def plot(curves: dict[str, Any], summary: dict[str, Any], s: dict[str, Any]) -> Any:
    """Left: tuning-seed final loss vs lr at depth ``s["depth"]`` (dashed: that seed's unigram loss − 0.1,
    the *trains* line); middle: scored validation curves (192 layers solid, 1000 layers dotted); right:
    pre-clip gradient norm vs step of the scored 192-layer runs."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = dict(zip(CONFIGS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    cfgs = summary["configs"]
    for k in CONFIGS:
        if "lr_grid" in cfgs.get(k, {}):
            a.plot(cfgs[k]["lr_grid"], cfgs[k]["tuning_loss"], "o-", ms=3, color=colors[k], label=k)
    u = cfgs[next(iter(CONFIGS))].get("tuning_unigram")
    if u is not None:
        a.axhline(u - verdicts.TRAIN_MARGIN, color="k", ls="--", lw=0.8, label="unigram − 0.1")
    for key, rs in curves.items():
        if key == "tuning":
            continue
        label = key.split(" depth")[0]
        for i, r in enumerate(rs):
            if r["val_curve"]:
                x, y = zip(*r["val_curve"])
                b.plot(x, y, ":" if " depth" in key else "-", color=colors[label],
                       label=f"{key}, lr {r['lr']:g}" if i == 0 else None)
            if " depth" not in key and r["grad_curve"]:
                gx, gy = zip(*r["grad_curve"])
                c.plot(gx, gy, color=colors[label], lw=0.8, label=label if i == 0 else None)
    if u is not None:
        b.axhline(u, color="k", ls="--", lw=0.8, label="unigram loss (tuning seed)")
    log_ticks(a, [lr for c in cfgs.values() for lr in c.get("lr_grid", ())])
    a.set(xlabel="peak lr", ylabel="final val loss, tuning seed", title=f"{s['depth']} layers: lr grid")
    b.set(xlabel="step", ylabel="validation loss (nats/token)", title="scored runs at DSLM's lr")
    c.set(xlabel="step", ylabel="gradient norm (before clip 1.0)", yscale="log", title=f"{s['depth']} layers")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    return fig


def table(summary: dict[str, Any]) -> Table:
    """One row per configuration: lr grid and largest stable lr, scored losses vs unigram, status, gradients."""
    rows = []
    ms = lambda d, spread: f"{d['mean']:.3f}" + (f" ± {d['std']:.3f}" if spread else "")
    for key, c in summary["configs"].items():
        spread = len(c["seeds"]) > 1
        g = " · ".join(f"{x['first']:.3g} → {x['last']:.3g} ({x['max']:.3g})" for x in c["grad_norm"])
        stable = ("–" if "lr_grid" not in c else "none" if c["largest_stable_lr"] is None else
                  f"{c['largest_stable_lr']:g}" + (" (grid top)" if c["largest_stable_at_top"] else ""))
        grid = lr_summary(c) if "lr_grid" in c else "–"
        rows.append([key.split(" depth")[0], c["depth"], grid, stable, "–" if c["lr"] is None else f"{c['lr']:g}",
                     f"{c['params'] / 1e6:.2f} M", ms(c["initial_val_loss"], spread),
                     ms(c["final_val_loss"], spread), f"{np.mean(c['unigram']):.3f}",
                     ", ".join("trains" if t else "fails" for t in c["trains"]), g])
    return Table(["config", "depth", "lr grid (tuning seed)", "largest stable lr", "scored lr", "params",
                  "initial loss", "final loss", "unigram", "scored runs", "grad norm first → last (max)"], rows)


def markdown(summary: dict[str, Any], s: dict[str, Any]) -> str:
    """The section: claim, setup, table (mean ± std over seeds), verdict."""
    lines = [f"## {NAME} — 192- and 1000-layer models train with DSLM", "",
             "**Claim** (DeepScaleLM, Kedia et al. 2024): with the DSLM initialization and residual scaling a "
             "192-layer model trains stably where the standard Pre-LN / Post-LN initialization diverges or stalls, "
             "and models of 1000 layers train.", "",
             f"**Setup:** decoder, causal LM on the embedded corpus (`pydoc`, BPE vocabulary {VOCAB}), width "
             f"{s['width']}, {s['heads']} heads, seq {s['seq']}, batch {s['batch']}, {s['steps']} steps, AdamW, 10 % "
             "warmup then a constant lr, gradient clip 1.0. Every 192-layer model is trained at every lr of its grid "
             f"on tuning seed {summary['tuning_seed']} (not scored); DSLM's chosen lr is its lowest final loss. Scored "
             f"seeds {list(s['seeds'])}: each DSLM model at its lr and the standard model of the same norm at that "
             f"lr; depth {s['deep_depth']} (seeds {list(s['deep_seeds'])}) at DSLM Pre-LN's lr. Unigram = loss of "
             "the training split's token frequencies on the same evaluation tokens; a run *trains* if it ends "
             f"≥ {verdicts.TRAIN_MARGIN} nats below it.", "", table(summary).markdown()]
    lines += ["", f"**Verdict: {summary['verdict']}.** {summary['verdict_reason']}", ""]
    return "\n".join(lines)


def run(out_dir: str | Path, quick: bool = False, show_progress: bool = True, **sizes: Any) -> dict[str, Any]:
    """`measure` → `markdown` (with `table`) + `plot`, written as dslm-depth.{json,png,md}; returns the summary
    (verdict included). Arguments as for `measure`."""
    curves, summary, s = measure(out_dir, quick, show_progress, **sizes)
    return write_outputs(out_dir, NAME, curves, summary, markdown(summary, s), plot(curves, summary, s))
