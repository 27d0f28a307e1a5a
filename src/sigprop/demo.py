"""`sigprop demo`, the main job: the two papers' central pictures on the embedded data, in minutes on a CPU.

1. Rank collapse (The Shaped Transformer, Fig. 1): token correlation over depth for softmax attention
   without LayerNorm, Pre-LN and shaped attention, finite networks with the covariance SDE overlaid
   (`shaped_figs.fig1`).
2. Moments at initialization (DeepScaleLM): standard init vs DSLM, Pre-LN and Post-LN decoders of depth
   96, measured per sublayer and predicted by `sigprop.models.predict` (`dslm_moments.run`).
3. Training: a deep shaped model (no LayerNorm, Recover schedule), a Pre-LN model, the GPT-2-style init
   (scheme "gpt2": std 0.02, output projections 0.02/√(2L)) and a DSLM model of the same size, trained for
   the same steps on the embedded corpus (causal LM); validation loss curves. One rule sets every model's lr:
   `sigprop advise` on the run's own config, before it trains (successive halving on the run itself,
   `sigprop.advice.halving`: three lrs around the rule's lr at init, the best kept at 10 % and 30 % of the run;
   the rule at init in the smoke run); each model's run is the survivor, continued to the end. Beside
   it, the Pre-LN model (`SWEPT`) also trains at every lr of a small fixed grid (`SWEEP_LRS`), so the advised lr
   can be read against the loss-vs-lr curve it was meant to hit (``training/advice.json`` holds each advice, the
   grid's losses and the command that reproduces them).

The parts run as independent tasks on two worker processes with one torch thread each
(`sigprop.train.sweep.worker_pool`, `run_parts`), so the two cores stay busy from start to end. Each finished
task's result is kept in ``out_dir/parts``: after Ctrl-C or SIGTERM (which end the workers too), ``resume``
runs only the rest.

Writes into ``out_dir``: ``report.html`` (self-contained: plots embedded), ``demo.json`` (every summary and
curve), one subfolder per part with its own JSON/PNG/Markdown, and returns the summary table. Each part is
measure → table → plot; `sections` turns the parts' tables and figures into the report.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import re
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from .advice import advise
from .advice.halving import advise_by_halving
from .console import UserError
from .experiments import dslm_moments, shaped_figs
from .experiments.outputs import plt, write_figure, write_json, write_outputs
from .experiments.report import Figure, Section, Table, write_html
from .models.build import param_count
from .train.config import RunConfig, from_mapping
from .train.one_run import run_once, train_run
from .train.sweep import worker_pool
from .train.sweep_report import log_ticks

# the training comparison: one size, four schemes (label -> ModelConfig overrides)
TRAIN_MODELS = {
    "shaped (no LN, recover)": {"scheme": "shaped", "shaping": "recover", "tau0": 1.0, "qk_scaling": "weights"},
    "Pre-LN": {"scheme": "preln"},
    "GPT-2 style (Pre-LN)": {"scheme": "gpt2"},
    "DSLM (Pre-LN)": {"scheme": "dslm", "norm_placement": "pre"},
}
SWEPT = "Pre-LN"                                 # the model whose advised lr is shown beside a small lr grid
SWEEP_LRS = {"full": (1e-3, 3e-3, 1e-2, 3e-2), "quick": (1e-3, 1e-2)}
# advice_budget: `sigprop advise --budget` for each model's lr (0 in the smoke run: the rule at init alone)
FULL = {"moments_depth": 96, "moments_seeds": 16, "depth": 24, "width": 64, "steps": 200, "batch": 16,
        "advice_budget": 0.5}
JOBS = 2                                         # worker processes for the training runs (2 cores)
PARTS = "parts"                                  # each finished task's result, so an interrupted demo can resume
QUICK = {"moments_depth": 4, "moments_seeds": 2, "depth": 2, "width": 32, "steps": 6, "batch": 4, "advice_budget": 0.0}


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
                "steps, each at the lr that sigprop advise chose for it: successive halving on the model's own run "
                "(three peak lrs ×3 apart around the lr its signal-propagation rule reads off the first step at "
                "init; the two with the lowest training loss at 10 % of the run go on, the better of them at 30 % "
                "is the run, continued to the end; the two cut arms cost 0.4 of a run). Table: the advised lr, the "
                "rule's largest stable lr and how the lr was decided; the smoke run --quick uses the rule at init "
                "instead. The second table and figure check the advice on one model: its loss "
                "over a small lr grid beside the loss at the advised lr. The shaped model has no LayerNorm at all; "
                "similar curves mean shaping replaces normalization. One seed: an illustration, not a claim (the "
                "claims and their rules: docs/RESULTS.md; advise's evaluation: docs/advise.md).",
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


def run_config(out_dir: str | Path, label: str, size: dict[str, Any], lr: float, seed: int) -> RunConfig:
    """The `RunConfig` of ``label``'s run at the demo's ``size`` (`demo_tables`) at ``lr`` in ``out_dir``."""
    t = demo_tables(label, size["depth"], size["width"], size["steps"], size["batch"])
    return from_mapping(RunConfig, {**t, "optim": {**t["optim"], "lr": lr},
                                    "train": {**t["train"], "seed": seed, "out_dir": str(out_dir)}})


def advise_lr(out_dir: str | Path, label: str, size: dict[str, Any], seed: int = 0,
              lrs: Sequence[float] = ()) -> dict[str, Any]:
    """`sigprop advise` on ``label``'s run config at ``size["advice_budget"]`` (the run's own seed and data):
    the recommended lr, its interval (the rule at init only, else None), the largest stable lr, how it was
    decided, the predicted outcome at each of ``lrs``, the advice's cost (wall seconds; with halving also in
    training runs of the model besides the run it leaves) and, with halving, the survivor's ``run_dir`` (its arms
    go to ``out_dir/advise-halving``), else None."""
    cfg = run_config(Path(out_dir) / "runs" / _slug(label), label, size, max(lrs, default=1e-3), seed)
    budget = size["advice_budget"]
    if budget > 0:
        h = advise_by_halving(cfg, budget, lrs=list(lrs) or None, out=Path(out_dir) / "advise-halving",
                              progress=False)
        return {"lr": h.recommended_lr, "interval": None, "max_stable_lr": h.target.max_stable_lr,
                "decided_by": f"halving, {h.cost:.2g} run", "predictions": h.predictions if lrs else [],
                "cost_s": round(h.cost_s, 2), "cost_runs": h.cost, "caveat": h.target.caveat, "run_dir": h.run_dir}
    a = advise(cfg, lrs=list(lrs) or None)
    return {"lr": a.recommended_lr, "interval": list(a.lr_interval), "max_stable_lr": a.max_stable_lr,
            "decided_by": f"rule at init: {a.decided_by}", "predictions": a.predictions if lrs else [],
            "cost_s": round(a.cost_s, 2), "cost_runs": 0.0, "caveat": a.caveat, "run_dir": None}


def train_model(out_dir: str | Path, label: str, size: dict[str, Any], lr: float, seed: int = 0,
                run_dir: str | Path | None = None, **train: Any) -> dict[str, Any]:
    """Train ``label`` of `TRAIN_MODELS` (`demo_tables`, ``train`` laid over its train table) at ``lr`` in
    ``run_dir`` (default ``out_dir/runs/<label>``); the `train_run` record with ``lr``."""
    t = demo_tables(label, size["depth"], size["width"], size["steps"], size["batch"])
    r = train_run(run_dir or Path(out_dir) / "runs" / _slug(label), t["model"], data=t["data"],
                  optim={**t["optim"], "lr": lr}, train_cfg={**t["train"], "progress": False, **train}, seed=seed)
    return {**r, "lr": lr}


def continue_model(label: str, size: dict[str, Any], lr: float, seed: int, run_dir: str | Path) -> dict[str, Any]:
    """Continue ``label``'s run in ``run_dir`` (halving's survivor, stopped at its last rung) to the end at ``lr``;
    `train_model`'s record (its ``wall_s``: the continuation alone)."""
    raw = run_config(run_dir, label, size, lr, seed).to_dict()
    raw["train"].update(resume=True, progress=False)
    cfg = from_mapping(RunConfig, raw)
    return {"seed": seed, "params": param_count(cfg.model), **run_once(cfg), "lr": lr}


def sweep_model(out_dir: str | Path, size: dict[str, Any], lr: float, seed: int = 0) -> dict[str, Any]:
    """`SWEPT` at one lr of `SWEEP_LRS` (evaluated at the end only), in ``out_dir/sweep/lr<lr>``."""
    r = train_model(out_dir, SWEPT, size, lr, seed, Path(out_dir) / "sweep" / f"lr{lr:g}", eval_every=0)
    return {k: r[k] for k in ("lr", "final_val_loss", "diverged", "wall_s")}


def _write_advice(out_dir: str | Path, advice: dict[str, Any], sweep: list[dict[str, Any]], quick: bool
                  ) -> dict[str, Any]:
    """``out_dir/advice.json``: {label: `advise_lr` numbers}, the `SWEPT` grid's losses and the command that
    reproduces the advice."""
    out = Path(out_dir)
    doc = {"command": f"python -c \"from sigprop import demo; print(demo.advise_lr('{out}', LABEL, "
                      f"demo.{'QUICK' if quick else 'FULL'}))\"",
           "advice": advice, "sweep": {"model": SWEPT, "points": sweep}}
    write_json(out / "advice.json", doc)
    return doc


def _rank_collapse(out: Path, quick: bool) -> dict[str, Any]:
    return shaped_figs.fig1(out / "rank_collapse", quick=quick, show_progress=False)


def _moments(out: Path, size: dict[str, Any], quick: bool) -> dict[str, Any]:
    return dslm_moments.run(out / "dslm_moments", quick=quick, show_progress=False, depth=size["moments_depth"],
                            seeds=size["moments_seeds"])


def _open_parts(folder: Path, meta: dict[str, Any], resume: bool) -> dict[tuple[str, Any], Any]:
    """The finished tasks' results kept in ``folder`` (one ``KIND-KEY.json`` each, written as the task finishes)
    when ``resume`` and its ``meta.json`` equals ``meta`` (size, seed); otherwise ``folder`` emptied, holding
    ``meta``. UserError for ``resume`` over a demo of another size or seed."""
    stored = folder / "meta.json"
    if resume and stored.exists():
        if json.loads(stored.read_text()) != meta:
            raise UserError(f"--resume: {folder} holds parts of a demo of another size or seed "
                            f"({stored.read_text().strip()}); run it without --resume to start afresh")
        docs = (json.loads(p.read_text()) for p in sorted(folder.glob("*-*.json")))
        return {tuple(d["key"]): d["result"] for d in docs}
    if folder.exists():
        shutil.rmtree(folder)
    write_json(stored, meta)
    return {}


def _keep_part(folder: Path, key: tuple[str, Any], result: Any) -> None:
    path = folder / f"{key[0]}-{_slug(str(key[1]) or 'all')}.json"
    write_json(path, {"key": list(key), "result": result})


def run_parts(out: Path, size: dict[str, Any], quick: bool = False, seed: int = 0, jobs: int = 1,
              show_progress: bool = True, resume: bool = False
              ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The three parts as independent tasks on ``jobs`` worker processes (`sigprop.train.sweep.worker_pool`):
    every model's advice first (`advise_lr`), the two measurements at init, the `SWEPT` model at
    each lr of its grid (`sweep_model`), and each model at its advised lr as soon as that is known
    (`train_model`, or `continue_model` for halving's survivor; same data, steps, batch and seed for every
    model). Each task's result is kept in
    ``out/PARTS`` as it finishes; with ``resume`` the ones kept there (same size and seed) are not run again.
    Returns (rank collapse, moments, {label: run}, the advice document of `_write_advice`)."""
    training, folder = out / "training", out / PARTS
    grid = SWEEP_LRS["quick" if quick else "full"]
    results = _open_parts(folder, {"size": size, "quick": quick, "seed": seed}, resume)
    tasks = {("advise", label): (advise_lr, training, label, size, seed, grid if label == SWEPT else ())
             for label in TRAIN_MODELS}
    tasks |= {("moments", ""): (_moments, out, size, quick), ("rank", ""): (_rank_collapse, out, quick)}
    tasks |= {("sweep", lr): (sweep_model, training, size, lr, seed) for lr in grid}
    def train(label: str) -> tuple[Any, ...]:
        a = results["advise", label]
        if a.get("run_dir"):
            return continue_model, label, size, a["lr"], seed, a["run_dir"]
        return train_model, training, label, size, a["lr"], seed

    tasks |= {("train", label): train(label) for label in TRAIN_MODELS if ("advise", label) in results}
    with worker_pool(jobs) as pool, tqdm(total=2 * len(TRAIN_MODELS) + len(grid) + 2, initial=len(results),
                                         desc="demo", disable=not show_progress) as bar:
        pending = {pool.submit(*task): key for key, task in tasks.items() if key not in results}
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for future in done:
                key = pending.pop(future)
                results[key] = future.result()
                _keep_part(folder, key, results[key])
                bar.update()
                if key[0] == "advise":
                    pending[pool.submit(*train(key[1]))] = ("train", key[1])
    advice = _write_advice(training, {label: results["advise", label] for label in TRAIN_MODELS},
                           [results["sweep", lr] for lr in grid], quick)
    runs = {label: results["train", label] for label in TRAIN_MODELS}
    return results["rank", ""], results["moments", ""], runs, advice


def training_table(runs: dict[str, Any], advice: dict[str, Any]) -> Table:
    """One row per model: its advised lr with the interval and the limit that sets the largest stable lr,
    parameters, validation loss at step 0 and at the end, wall time."""
    a = advice["advice"]
    band = lambda i: f" [{i[0]:.2g}, {i[1]:.2g}]" if i else ""
    stable = lambda x: "none" if x is None else f"{x:.2g}"
    lr = lambda k: (f"{runs[k]['lr']:.3g}{band(a[k]['interval'])}, max stable {stable(a[k]['max_stable_lr'])} "
                    f"({a[k]['decided_by']})")
    return Table(["model", "advised lr, max stable lr", "params", "val loss at step 0", "final val loss", "wall s"],
                 [[k, lr(k), r["params"], _fmt(r["initial_val_loss"]), _fmt(r["final_val_loss"]), f"{r['wall_s']:.0f}"]
                  for k, r in runs.items()],
                 caption="Validation loss in nats per token (embedded corpus, causal LM). Every lr is chosen before "
                         f"the run goes on (`sigprop advise`; reproduce one with `{advice['command']}`); wall s is the "
                         "run after its advice (with halving, the survivor's first 30 % is in the advice's cost).")


def sweep_table(runs: dict[str, Any], advice: dict[str, Any]) -> Table:
    """The `SWEPT` model's grid: final loss and advise's predicted outcome at each lr, then the advised run."""
    a, pts = advice["advice"][SWEPT], advice["sweep"]["points"]
    said = {p["lr"]: p["outcome"] for p in a["predictions"]}
    rows = [[f"{p['lr']:g}", _fmt(p["final_val_loss"]), said.get(p["lr"], "–")] for p in pts]
    rows.append([f"{runs[SWEPT]['lr']:.3g} (advised)", _fmt(runs[SWEPT]["final_val_loss"]), "recommended"])
    best = min(pts, key=lambda p: p["final_val_loss"] if math.isfinite(p["final_val_loss"]) else math.inf)
    return Table(["lr", "final val loss", "advise predicted"], rows,
                 caption=f"{SWEPT}: the grid's best lr is {best['lr']:g} ({_fmt(best['final_val_loss'])}); the advised "
                         f"lr {runs[SWEPT]['lr']:.3g} ends at {_fmt(runs[SWEPT]['final_val_loss'])}.")


def plot_advice(runs: dict[str, Any], advice: dict[str, Any]) -> Any:
    """`SWEPT`'s final loss against lr (its grid), the advised lr (star: its run's loss) and, from the rule at init,
    its interval (band)."""
    a, pts = advice["advice"][SWEPT], advice["sweep"]["points"]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot([p["lr"] for p in pts], [p["final_val_loss"] for p in pts], "o-", label=f"{SWEPT}: lr grid")
    if a["interval"]:
        ax.axvspan(*a["interval"], color="C1", alpha=0.15, label="advised interval")
    ax.plot([runs[SWEPT]["lr"]], [runs[SWEPT]["final_val_loss"]], "*", color="C1", ms=14, label="advised lr")
    log_ticks(ax, [p["lr"] for p in pts] + [runs[SWEPT]["lr"]])
    ax.set(xlabel="peak lr", ylabel="final validation loss (nats/token)", title="advised lr against a sweep")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


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
             advice: dict[str, Any], meta: dict[str, Any]) -> list[Section]:
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
        Section("3. Training at the advised lr: shaped, Pre-LN, GPT-2-style and DSLM", READ["training"],
                tables=[training_table(runs, advice), sweep_table(runs, advice)],
                figures=[Figure(out / "training/training.png",
                                f"Validation loss against step, decoder of {meta['depth']} layers × width "
                                f"{meta['width']}, each model at the lr sigprop advise recommended for it."),
                         Figure(out / "training/advice.png",
                                f"{SWEPT}: final validation loss over a small lr grid, with the advised lr (star: its "
                                "run).")]),
    ]


def run(out_dir: str | Path = "runs/demo", quick: bool = False, seed: int = 0, show_progress: bool = True,
        jobs: int | None = None, resume: bool = False) -> dict[str, Any]:
    """Run the three parts into ``out_dir`` on ``jobs`` worker processes (default `JOBS`, 1 when ``quick``) and
    write the report; returns {"table", "meta"}. With ``resume`` the parts an interrupted run finished are kept
    (`run_parts`)."""
    size = QUICK if quick else FULL
    out, start = Path(out_dir), time.time()
    jobs = jobs or (1 if quick else JOBS)
    rank, moments, runs, advice = run_parts(out, size, quick, seed, jobs, show_progress, resume)
    write_outputs(out / "training", "training",
                  {k: {"val_curve": r["val_curve"], "train_curve": r["train_curve"]} for k, r in runs.items()},
                  {**{k: {f: r[f] for f in ("lr", "final_val_loss", "initial_val_loss", "diverged", "params", "wall_s")}
                      for k, r in runs.items()}, "advice": advice},
                  training_table(runs, advice).markdown() + "\n\n" + sweep_table(runs, advice).markdown(),
                  plot_training(runs, f"decoder, {size['depth']} layers × width {size['width']}"))
    write_figure(out / "training" / "advice.png", plot_advice(runs, advice))
    table = summary_table(rank, moments, runs)
    meta = {**size, "quick": quick, "seed": seed, "wall_s": round(time.time() - start, 1)}
    write_json(out / "demo.json", {"meta": meta, "table": {"header": list(table.header), "rows": table.rows},
                                   "rank_collapse": rank, "dslm_moments": moments, "training": runs, "advice": advice})
    write_html(out / "report.html", "sigprop demo: signal propagation in deep transformers",
               sections(out, table, rank, moments, runs, advice, meta),
               intro="Three measurements at initialization and in training, on the data embedded in the package. "
                     "Background: The Shaped Transformer (Noci et al., NeurIPS 2023) and DeepScaleLM (Kedia et "
                     "al., ICML 2024).")
    print(table.text())
    print(f"report: {out / 'report.html'}")
    return {"table": table.rows, "meta": meta}
