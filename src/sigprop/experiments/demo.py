"""`sigprop demo`, the main job: the two papers' central pictures on the embedded data, in minutes on a CPU.

1. Rank collapse (The Shaped Transformer, Fig. 1): token correlation over depth for softmax attention
   without LayerNorm, Pre-LN and shaped attention, finite networks with the covariance SDE overlaid
   (`shaped_figs.fig1`).
2. Moments at initialization (DeepScaleLM): standard init vs DSLM, Pre-LN and Post-LN decoders of depth
   96, measured per sublayer and predicted by `sigprop.models.predict` (`dslm_moments.run`).
3. Training: a deep shaped model (no LayerNorm, Recover schedule), a Pre-LN model, the GPT-2-style init
   (scheme "gpt2": std 0.02, output projections 0.02/√(2L)) and a DSLM model of the same size, trained for
   the same steps on the embedded corpus (causal LM); validation loss curves. The two baselines (Pre-LN,
   GPT-2 style) get a tuned lr: `tune_baseline` trains each on its 3-point grid (`LR_GRID`, ×√10-spaced
   around where its optimum lies) on a tuning seed (not the demo's seed), extends it past an edge that holds
   the optimum (`sigprop.experiments.tuning`) and stores the choice with the command that reproduces it
   (``training/lr_choice.json``); shaped and DSLM keep `FIXED_LR`, so the comparison is, if anything,
   tilted toward the baselines.

The parts run as independent tasks on two worker processes with one torch thread each
(`sigprop.train.sweep.worker_pool`, `run_parts`), so the two cores stay busy from start to end.

Writes into ``out_dir``: ``report.html`` (self-contained: plots embedded), ``demo.json`` (every summary and
curve), one subfolder per part with its own JSON/PNG/Markdown, and returns the summary table. Each part is
measure → table → plot; `sections` turns the parts' tables and figures into the report.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from ..train.sweep import worker_pool
from . import dslm_moments, shaped_figs
from .outputs import progress, write_outputs
from .report import Figure, Section, Table, write_html
from .training import train_run
from .tuning import TUNING_SEED, numbers, tune

# the training comparison: one size, four schemes (label -> ModelConfig overrides)
TRAIN_MODELS = {
    "shaped (no LN, recover)": {"scheme": "shaped", "shaping": "recover", "tau0": 1.0, "qk_scaling": "weights"},
    "Pre-LN": {"scheme": "preln"},
    "GPT-2 style (Pre-LN)": {"scheme": "gpt2"},
    "DSLM (Pre-LN)": {"scheme": "dslm", "norm_placement": "pre"},
}
TUNED = ("Pre-LN", "GPT-2 style (Pre-LN)")       # the baselines whose lr `tune_baseline` picks
FIXED_LR = 1e-3                                  # the other models' lr
LR_GRID = {"full": {"Pre-LN": (3e-3, 1e-2, 3e-2), "GPT-2 style (Pre-LN)": (3e-4, 1e-3, 3e-3)},
           "quick": {"Pre-LN": (1e-3, 1e-2), "GPT-2 style (Pre-LN)": (1e-3, 1e-2)}}
FULL = {"moments_depth": 96, "moments_seeds": 16, "depth": 24, "width": 64, "steps": 200, "batch": 16}
JOBS = 2                                         # worker processes for the training runs (2 cores)
QUICK = {"moments_depth": 4, "moments_seeds": 2, "depth": 2, "width": 32, "steps": 6, "batch": 4}


READ = {
    "summary": "One row per measured quantity, grouped by part. Token correlation near 1 means the tokens' "
               "representations have collapsed onto one direction; a forward-variance range near 1 – 1 means the "
               "signal keeps its scale through depth; lower validation loss is better.",
    "rank": "Each band is the 5–95 % range of the correlation ρ between two tokens over many random networks at "
            "initialization, plotted against t = layer / width; the dashed black band is the neural covariance "
            "SDE, the networks' limit. A band pinned at ρ = 1 is rank collapse. The right panel compares the "
            "final correlation of the finite shaped networks with the SDE; KS is the largest gap between their "
            "distribution functions (0 = identical).",
    "moments": "Ranges run over every sublayer output: measured, then predicted by sigprop.theory.moments in "
               "brackets. Gradients are relative to the model output, so 1 means no growth or decay. In the "
               "figures solid lines are measured and dashed lines predicted; the closer they sit, the better the "
               "theory. The median error is |predicted / measured − 1| over sublayers, beside its Monte-Carlo "
               "standard error.",
    "training": "Validation loss (nats per token) of four models of the same size trained with the same data and "
                "steps. Pre-LN and the GPT-2-style init each train at the lr a small grid chose for them on another "
                "seed (table: grid, choice, and the command that made it); shaped and DSLM at one fixed lr. The "
                "shaped model has no LayerNorm at all; similar curves mean shaping replaces normalization. One "
                "seed: an illustration, not a claim (the claims and their rules: docs/RESULTS.md).",
}


def demo_tables(label: str, depth: int, width: int, steps: int, batch: int, seq: int = 64, vocab: int = 512
                ) -> dict[str, Any]:
    """Run-config sections of one model of the comparison (decoder, ``depth`` × ``width``, causal LM on
    "pydoc", warmup 10 %, Recover over the whole run), without the lr."""
    return {"model": {"arch": "decoder", "d_model": width, "n_layers": depth, "n_heads": 4, "vocab_size": vocab,
                      "max_seq_len": seq, **TRAIN_MODELS[label]},
            "data": {"source": "pydoc", "seq_len": seq}, "optim": {"warmup_steps": max(1, steps // 10)},
            "train": {"steps": steps, "batch_size": batch, "eval_every": max(1, steps // 10), "recover_steps": steps,
                      "diag_every": 0}}


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", label.split()[0].lower())


def tune_baseline(out_dir: str | Path, label: str, quick: bool = False) -> dict[str, Any]:
    """The lr of the `TUNED` baseline ``label`` at the demo's size: `tuning.tune` over its ``LR_GRID`` on
    `TUNING_SEED` (never the demo's seed), extended past an edge (not in quick mode), in
    ``out_dir/sweeps/<label>``; returns its numbers (lr_grid, tuning_loss, best_lr, extended, ...)."""
    size = QUICK if quick else FULL
    grid, max_extend = (LR_GRID["quick"][label], 0) if quick else (LR_GRID["full"][label], 2)
    t = demo_tables(label, size["depth"], size["width"], size["steps"], size["batch"])
    t["train"]["eval_every"] = 0                       # the choice reads the final validation loss only
    return numbers(tune(Path(out_dir) / "sweeps" / _slug(label), t, grid, TUNING_SEED, [], max_extend=max_extend))


def _write_choice(out_dir: str | Path, tuned: dict[str, Any], quick: bool) -> dict[str, Any]:
    """``out_dir/lr_choice.json``: {label: `tune_baseline` numbers} plus the command that reproduces them."""
    out = Path(out_dir)
    choice = {"command": f"python -c \"from sigprop.experiments import demo; demo.choose_lrs('{out}', quick={quick})\"",
              **{label: tuned[label] for label in TUNED}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "lr_choice.json").write_text(json.dumps(choice, indent=1))
    return choice


def choose_lrs(out_dir: str | Path, quick: bool = False, show_progress: bool = True) -> dict[str, Any]:
    """`tune_baseline` for every `TUNED` baseline, one after the other; writes and returns ``lr_choice.json``."""
    tuned = {label: tune_baseline(out_dir, label, quick)
             for label in progress(TUNED, "demo: lr grid", enabled=show_progress)}
    return _write_choice(out_dir, tuned, quick)


def train_model(out_dir: str | Path, label: str, depth: int, width: int, steps: int, batch: int, lr: float,
                seed: int = 0) -> dict[str, Any]:
    """Train ``label`` of `TRAIN_MODELS` (`demo_tables`) at ``lr`` in ``out_dir/runs/<label>``; the
    `train_run` record with ``lr``."""
    t = demo_tables(label, depth, width, steps, batch)
    r = train_run(Path(out_dir) / "runs" / _slug(label), t["model"], data=t["data"], optim={**t["optim"], "lr": lr},
                  train_cfg={**t["train"], "progress": False}, seed=seed)
    return {**r, "lr": lr}


def _rank_collapse(out: Path, quick: bool) -> dict[str, Any]:
    return shaped_figs.fig1(out / "rank_collapse", quick=quick, show_progress=False)


def _moments(out: Path, size: dict[str, Any], quick: bool) -> dict[str, Any]:
    return dslm_moments.run(out / "dslm_moments", depth=size["moments_depth"], seeds=range(size["moments_seeds"]),
                            quick=quick, show_progress=False)


def run_parts(out: Path, size: dict[str, Any], quick: bool = False, seed: int = 0, jobs: int = 1,
              show_progress: bool = True) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The three parts as independent tasks on ``jobs`` worker processes (`sigprop.train.sweep.worker_pool`),
    longest first: the baselines' lr tunings (`tune_baseline`), the two measurements at init, the untuned models
    at `FIXED_LR`, and each baseline at its chosen lr as soon as it is known (`train_model`, same data, steps and
    batch for every model). Returns (rank collapse, moments, {label: run}, the lr choice)."""
    shape = (size["depth"], size["width"], size["steps"], size["batch"])
    training = out / "training"
    results: dict[tuple[str, str], Any] = {}
    with worker_pool(jobs) as pool, tqdm(total=2 * len(TUNED) + len(TRAIN_MODELS) - len(TUNED) + 2,
                                         desc="demo", disable=not show_progress) as bar:
        pending = {pool.submit(tune_baseline, training, label, quick): ("tune", label) for label in TUNED}
        pending[pool.submit(_moments, out, size, quick)] = ("moments", "")
        pending[pool.submit(_rank_collapse, out, quick)] = ("rank", "")
        pending |= {pool.submit(train_model, training, label, *shape, FIXED_LR, seed): ("train", label)
                    for label in TRAIN_MODELS if label not in TUNED}
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for future in done:
                key = pending.pop(future)
                results[key] = future.result()
                bar.update()
                if key[0] == "tune":
                    lr = results[key]["best_lr"] if results[key]["best_lr"] is not None else FIXED_LR
                    pending[pool.submit(train_model, training, key[1], *shape, lr, seed)] = ("train", key[1])
    choice = _write_choice(training, {label: results["tune", label] for label in TUNED}, quick)
    runs = {label: results["train", label] for label in TRAIN_MODELS}
    return results["rank", ""], results["moments", ""], runs, choice


def training_table(runs: dict[str, Any], choice: dict[str, Any]) -> Table:
    """One row per model: lr (and the grid that chose it), parameters, validation loss at step 0 and at the
    end, wall time."""
    lr = lambda k: (f"{runs[k]['lr']:g} (best of {', '.join(f'{x:g}' for x in choice[k]['lr_grid'])})"
                    if k in TUNED and choice[k]["best_lr"] is not None else f"{runs[k]['lr']:g} (fixed)")
    return Table(["model", "lr", "params", "val loss at step 0", "final val loss", "wall s"],
                 [[k, lr(k), r["params"], _fmt(r["initial_val_loss"]), _fmt(r["final_val_loss"]), f"{r['wall_s']:.0f}"]
                  for k, r in runs.items()],
                 caption="Validation loss in nats per token (embedded corpus, causal LM). Tuned lrs chosen by "
                         f"`{choice['command']}` on seed {TUNING_SEED}.")


def plot_training(runs: dict[str, Any], title: str) -> Any:
    """Validation loss against step, one line per model."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, r in runs.items():
        x, y = zip(*r["val_curve"])
        ax.plot(x, y, "o-", ms=3, label=label)
    ax.set(xlabel="step", ylabel="validation loss (nats/token)", title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _fmt(x: float) -> str:
    return "diverged" if not math.isfinite(x) else f"{x:.3f}"


def summary_table(rank: dict[str, Any], moments: dict[str, Any], runs: dict[str, Any]) -> Table:
    """The demo's findings, one row per measured quantity."""
    fc = rank["final_mean_corr"]
    rows = [["rank collapse", f"final token correlation, {b}", fc[k]]
            for b, k in (("softmax (no LN)", "softmax"), ("Pre-LN", "preln"), ("shaped", "shaped"),
                         ("shaped SDE", "sde"))]
    rows.append(["rank collapse", "KS(shaped finite vs SDE)", rank["ks_shaped_vs_sde"]["statistic"]])
    for name, s in moments["summary"].items():
        f, g = s["fwd_var"]["measured_range"], s["grad_var"]["measured_range"]
        rows.append(["moments at init", f"{name}: forward variance range", f"{f[0]:.3g} – {f[1]:.3g}"])
        rows.append(["moments at init", f"{name}: gradient/output range", f"{g[0]:.3g} – {g[1]:.3g}"])
        rows.append(["moments at init", f"{name}: median |pred/meas − 1| fwd, grad",
                     f"{s['fwd_var']['median_rel_error']:.1%}, {s['grad_var']['median_rel_error']:.1%}"])
    for label, r in runs.items():
        rows.append(["training", f"{label}: val loss start → end",
                     f"{_fmt(r['initial_val_loss'])} → {_fmt(r['final_val_loss'])}"])
    return Table(["part", "quantity", "value"], rows)


def sections(out: Path, table: Table, rank: dict[str, Any], moments: dict[str, Any], runs: dict[str, Any],
             choice: dict[str, Any], meta: dict[str, Any]) -> list[Section]:
    """The report's parts, from the three parts' results and the files they wrote under ``out``."""
    depth = moments["meta"]["depth"]
    return [
        Section("Summary", READ["summary"], [f"Wall time {meta['wall_s']:.0f} s. Data beside this file: demo.json; "
                                             "each part's JSON, PNG and Markdown in its folder."], [table]),
        Section("1. Rank collapse and the covariance SDE", READ["rank"], tables=[shaped_figs.table_fig1(rank)],
                figures=[Figure(out / "rank_collapse/fig1.png",
                                f"Token correlation through depth = width = {rank['width']} networks at "
                                "initialization (left) and the distribution of the final correlation, shaped "
                                "networks vs the SDE (right).")]),
        Section(f"2. Moments at initialization, depth {depth}: standard vs DSLM", READ["moments"],
                tables=[dslm_moments.table(moments["summary"], moments["meta"])],
                figures=[Figure(out / f"dslm_moments/dslm_moments_{p.lower().replace('-', '')}.png",
                                f"{p} decoder, depth {depth}: forward variance, gradient relative to the output and "
                                "token correlation per sublayer, standard init and DSLM, measured (solid) and "
                                "predicted (dashed).") for p in ("Pre-LN", "Post-LN")]),
        Section("3. Training: shaped vs tuned Pre-LN and GPT-2-style vs DSLM", READ["training"],
                tables=[training_table(runs, choice)],
                figures=[Figure(out / "training/training.png",
                                f"Validation loss against step, decoder of {meta['depth']} layers × width "
                                f"{meta['width']}.")]),
    ]


def run(out_dir: str | Path = "runs/demo", quick: bool = False, seed: int = 0, show_progress: bool = True
        ) -> dict[str, Any]:
    """Run the three parts into ``out_dir`` and write the report; returns {"table", "meta"}."""
    size = QUICK if quick else FULL
    out, start = Path(out_dir), time.time()
    rank, moments, runs, choice = run_parts(out, size, quick, seed, jobs=1 if quick else JOBS,
                                            show_progress=show_progress)
    write_outputs(out / "training", "training",
                  {k: {"val_curve": r["val_curve"], "train_curve": r["train_curve"]} for k, r in runs.items()},
                  {**{k: {f: r[f] for f in ("lr", "final_val_loss", "initial_val_loss", "diverged", "params", "wall_s")}
                      for k, r in runs.items()}, "lr_choice": choice},
                  training_table(runs, choice).markdown(),
                  plot_training(runs, f"decoder, {size['depth']} layers × width {size['width']}"))
    table = summary_table(rank, moments, runs)
    meta = {**size, "quick": quick, "seed": seed, "wall_s": round(time.time() - start, 1)}
    (out / "demo.json").write_text(json.dumps(
        {"meta": meta, "table": {"header": list(table.header), "rows": table.rows}, "rank_collapse": rank,
         "dslm_moments": moments, "training": runs, "lr_choice": choice}, indent=1))
    write_html(out / "report.html", "sigprop demo: signal propagation in deep transformers",
               sections(out, table, rank, moments, runs, choice, meta),
               intro="Three measurements at initialization and in training, on the data embedded in the package. "
                     "Background: The Shaped Transformer (Noci et al., NeurIPS 2023) and DeepScaleLM (Kedia et "
                     "al., ICML 2024).")
    print(table.text())
    print(f"report: {out / 'report.html'}")
    return {"table": table.rows, "meta": meta}
