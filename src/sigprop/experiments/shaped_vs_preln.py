"""Shaped Transformer vs a tuned Pre-LN baseline (Noci et al. 2023, App. D, Table 1) at CPU scale.

Claim: the shaped Transformer *without LayerNorm* (shaped attention, shaped ReLU, trainable λ/γ
residual) trains about as fast as a Pre-LN Transformer whose learning rate was tuned.

Setup (masked LM on the embedded ``pydoc`` corpus, BPE vocab 512, seq 64, 15 % masking; encoder of
8 layers, width 64, MLP width 128, 4 heads; AdamW without weight decay, betas (0.9, 0.999) as in the
paper, linear warmup over the first 10 % of steps, cosine decay, grad clip 1; equal steps and batch for all runs):

* Pre-LN;
* shaped (``scheme="shaped"``, τ₀ = 1, λ and γ trained, the paper's training parametrization
  ``qk_scaling="init"``: τ = √n_k and W_Q, W_K ~ N(0, n^{-3/2}), equal at init to τ = √(n·n_k), but
  Adam then moves the logits n^{1/4}× faster) with γ ∈ {0.05, 0.1, 0.2} and the two training variants:
  "recover" (γ₁, γ₂, s₋ decay linearly to 0 over the warmup, as the paper's 4000 of its 100K steps) and
  "learn" (γ₁, γ₂, s₋ trained).

Learning rates (`sigprop.experiments.tuning`): every one of the seven models gets its own lr, chosen on
tuning seed `TUNING_SEED` (never scored) from its grid (`GRIDS`, ×2 apart; the paper tunes Pre-LN on
{1e-4, 5e-4, 1e-3, 5e-3}, whose top was the best lr at this size, so the grid starts there and goes up),
extended by one step past an edge that holds the optimum (at most twice, recorded in the JSON). Scored:
seeds 0, 1, 2 at each model's chosen lr.

Verdict rule: `sigprop.experiments.verdicts.shaped_vs_preln` (every shaped variant within +5 % of the
tuned Pre-LN seed-mean final validation loss: reproduced; one within +5 % or all within +10 %: partly;
inconclusive if a chosen lr is still at its grid's edge).

Runs: 7 models × (4 tuning lrs + ≤ 2 extensions + 3 seeds) = 49–63 training runs.

    from sigprop.experiments import shaped_vs_preln
    summary = shaped_vs_preln.run("runs/claims")       # shaped-vs-preln.json / .png / .md
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..train.sweep_report import log_ticks
from . import verdicts
from .outputs import WallClock, write_outputs
from .report import Table
from .training import finished, mean_curve, param_count, resolve_sizes, seed_stats, unigram_by_seed
from .tuning import MAX_EXTEND, TUNING_SEED, lr_summary, numbers, tune_all

NAME = "shaped-vs-preln"
BASELINE = "Pre-LN"
GAMMAS = (0.05, 0.1, 0.2)
SHAPINGS = ("recover", "learn")
GRIDS = {"preln": (2.5e-3, 5e-3, 1e-2, 2e-2), "shaped": (1.25e-3, 2.5e-3, 5e-3, 1e-2)}
SEEDS = (0, 1, 2)
FF_MULT = 2                      # MLP width / model width (BERT uses 4; 2 fits the CPU budget)
MODEL = {"arch": "encoder", "vocab_size": 512, "n_heads": 4, "max_seq_len": 64}
DATA = {"source": "pydoc", "seq_len": 64, "mask_prob": 0.15}
OPTIM = {"weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999, "grad_clip": 1.0}   # the paper's Adam
FULL = {"steps": 450, "batch_size": 16, "n_layers": 8, "d_model": 64, "eval_batches": 8, "jobs": 2,
        "max_extend": MAX_EXTEND}
QUICK = {"steps": 16, "batch_size": 8, "n_layers": 2, "d_model": 32, "eval_batches": 4, "jobs": 1, "max_extend": 0}


def shaped_model(shaping: str, gamma: float, qk_scaling: str = "init") -> dict[str, Any]:
    """ModelConfig fields of the paper's trained shaped Transformer: no LayerNorm, τ₀ = 1, λ/γ trained,
    and (App. D) τ = √n_k with W_Q, W_K ~ N(0, n^{-3/2}) (``qk_scaling="init"``)."""
    return {"scheme": "shaped", "shaping": shaping, "residual_gamma": gamma, "learn_residual": True, "tau0": 1.0,
            "qk_scaling": qk_scaling}


def warmup(steps: int) -> int:
    """Warmup (and Recover) length: the first 10 % of the run."""
    return max(1, steps // 10)


def models(gammas: Sequence[float] = GAMMAS, qk_scaling: str = "init") -> dict[str, tuple[dict[str, Any], str]]:
    """label → (ModelConfig overrides, grid name in `GRIDS`) of the compared models, the baseline first."""
    out = {BASELINE: ({"scheme": "preln"}, "preln")}
    out.update({f"shaped {shaping} γ={g:g}": (shaped_model(shaping, g, qk_scaling), "shaped")
                for shaping in SHAPINGS for g in gammas})
    return out


def tables(size: dict[str, Any], overrides: dict[str, Any], ff_mult: int = FF_MULT, diag_every: int = 0
           ) -> dict[str, Any]:
    """The run-config sections of one masked-LM encoder at ``size`` (steps, batch_size, n_layers, d_model,
    eval_batches), MLP width ``ff_mult``·d, diagnostics every ``diag_every`` steps (0: none); Recover
    lasts the warmup."""
    n = size["steps"]
    extra = {"recover_steps": warmup(n)} if overrides.get("shaping") == "recover" else {}
    return {"model": {**MODEL, "n_layers": size["n_layers"], "d_model": size["d_model"],
                      "d_ff": ff_mult * size["d_model"], **overrides},
            "data": DATA, "optim": {**OPTIM, "warmup_steps": warmup(n)},
            "train": {"steps": n, "batch_size": size["batch_size"], "eval_every": max(1, n // 10),
                      "eval_batches": size["eval_batches"], "diag_every": diag_every, **extra}}


def judge(summary: dict[str, Any]) -> tuple[str, str]:
    """(verdict, reason): `verdicts.shaped_vs_preln` on a summary's numbers (as saved in shaped-vs-preln.json)."""
    return verdicts.shaped_vs_preln(summary["models"], BASELINE)


def plot(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """Left: tuning-seed final loss vs lr per model (the bracket; ring = chosen lr); middle: seed-mean
    validation curves at each model's chosen lr; right: scored final loss per model (seeds as dots)."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.5))
    for i, (label, m) in enumerate(summary["models"].items()):
        color, ls = ("k", "-") if label == BASELINE else (f"C{i}", "--" if "learn" in label else "-")
        a.plot(m["lr_grid"], m["tuning_loss"], "o", ls=ls, color=color, ms=3, label=label)
        if m["best_lr"] is not None:
            a.plot([m["best_lr"]], [min(x for x in m["tuning_loss"] if np.isfinite(x))], "o", mfc="none", ms=9,
                   color=color)
        curve = data[label]["val_curve"]
        b.plot(curve["step"], curve["mean"], ls=ls, color=color, lw=2.5 if label == BASELINE else 1.2, label=label)
        f = np.asarray(m["final_loss"], dtype=float)
        c.scatter(np.full(len(f), i), f, s=12, color=color, zorder=3)
    log_ticks(a, [lr for m in summary["models"].values() for lr in m["lr_grid"]])
    a.set(xlabel="peak lr", ylabel="final val loss, tuning seed", title="lr grids (ring: chosen)")
    b.axhline(summary["unigram_val_loss"], color="grey", ls=":", label="unigram level")
    b.set(xlabel="step", ylabel="validation MLM loss (nats)", title="validation loss at each model's lr")
    ref = summary["models"][BASELINE]["final_val_loss"]["mean"]
    c.axhspan(ref, ref * 1.05, color="green", alpha=0.12, label=f"{BASELINE} + 5 %")
    labels = list(summary["models"])
    c.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    c.set(ylabel="final validation loss (scored seeds)", title="final loss per model")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    return fig


CLAIM = ("**Claim** (Shaped Transformer, App. D, Table 1): the shaped Transformer without LayerNorm, in both "
         "training variants (Recover, Learn) and for γ ∈ {0.05, 0.1, 0.2}, reaches train/test losses "
         "comparable to a Pre-LN Transformer whose learning rate is tuned.")


def table(summary: dict[str, Any]) -> Table:
    """One row per model: its lr (grid, extensions), final and best validation loss over seeds, diverged seeds."""
    return Table(["model", "lr (tuning seed)", "final val loss (mean ± std)", "best val loss", "diverged seeds"],
                 [[k, lr_summary(v), f"{v['final_val_loss']['mean']:.3f} ± {v['final_val_loss']['std']:.3f}",
                   f"{v['best_val_loss']['mean']:.3f}", v["diverged"]] for k, v in summary["models"].items()])


def markdown(summary: dict[str, Any]) -> str:
    """The results section: claim, setup (from ``summary["setup"]``), `table`, verdict."""
    s, cfg = summary, summary["setup"]
    return (
        f"## {NAME} — shaped Transformer without LayerNorm trains like tuned Pre-LN\n\n{CLAIM}\n\n"
        f"**Setup.** Masked LM (15 % masking) on the `pydoc` corpus, BPE vocab {cfg['vocab_size']}, seq "
        f"{cfg['seq_len']}; encoder, {cfg['n_layers']} layers, width {cfg['d_model']}, MLP width "
        f"{FF_MULT * cfg['d_model']}, {cfg['n_heads']} heads "
        f"(Pre-LN {s['params']['preln']:,} / shaped {s['params']['shaped']:,} parameters); {cfg['steps']} steps, "
        f"batch {cfg['batch_size']}, AdamW (no weight decay, betas 0.9/0.999), warmup {cfg['warmup']} steps then "
        f"cosine decay, grad clip 1. Shaped: τ₀ = 1, λ and γ trained, "
        + ("τ = √n_k with W_Q, W_K ~ N(0, n^-3/2) (the paper's training form)" if cfg["qk_scaling"] == "init"
           else "τ = √(n·n_k) with W_Q, W_K ~ N(0, 1/n)") + "; Recover decays "
        f"γ₁, γ₂, s₋ to 0 over {cfg['warmup']} steps. Every model has its own lr, chosen on tuning seed "
        f"{s['tuning_seed']} (not scored) from its grid, extended past an edge that held the optimum. Scored "
        f"seeds {s['seeds']}; validation loss on {cfg['eval_examples']} held-out examples. Unigram level "
        f"(context-free predictor): {s['unigram_val_loss']:.3f} nats.\n\n"
        f"{table(s).markdown()}\n"
        f"**Verdict: {s['verdict']}.** {s['verdict_reason']}\n")


def measure(out_dir: str | Path, quick: bool = False, seeds: Sequence[int] = SEEDS, qk_scaling: str = "init",
            show_progress: bool = True, **sizes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tune and score every model (`sigprop.experiments.tuning`, runs in ``out_dir/sweeps``); return (data:
    seed-mean curves per model, summary: per-model numbers, the verdict and the setup).

    ``quick``: a smoke size (16 steps, 2 layers, width 32, batch 8, one γ, the first seed, no grid
    extension). ``sizes`` override the size's keys (steps, batch_size, n_layers, d_model, eval_batches,
    jobs, max_extend). ``qk_scaling``: the shaped models' parametrization ("init", the paper's training
    form, or "temperature"; identical at init).
    """
    clock = WallClock(out_dir, NAME)
    size = resolve_sizes(QUICK if quick else FULL, sizes)
    seeds = list(seeds[:1] if quick else seeds)
    chosen = models(GAMMAS[:1] if quick else GAMMAS, qk_scaling)
    grids = {k: GRIDS[g][1:3] if quick else GRIDS[g] for k, (_, g) in chosen.items()}
    tuned = tune_all(Path(out_dir) / "sweeps", {k: (tables(size, o), grids[k]) for k, (o, _) in chosen.items()},
                     seeds, size["jobs"], size["max_extend"], desc=NAME, show_progress=show_progress)
    per_model = {label: {**numbers(m), "final_val_loss": seed_stats(m["final_loss"]),
                         "best_val_loss": seed_stats(r["best_val_loss"] for r in m["runs"]),
                         "initial_val_loss": seed_stats(r["initial_val_loss"] for r in m["runs"]),
                         "diverged": sum(r["diverged"] for r in m["runs"])} for label, m in tuned.items()}
    baseline_runs = tuned[BASELINE]["runs"] or tuned[BASELINE]["tuning_runs"][:1]     # the scored seeds' splits
    unigram = list(unigram_by_seed(baseline_runs).values())
    shaped = next(o for k, (o, _) in chosen.items() if k != BASELINE)
    summary = {"seeds": seeds, "tuning_seed": TUNING_SEED,
               "wall_s": clock.seconds(), "unigram_val_loss": float(np.mean(unigram)),
               "params": {k: param_count(tables(size, o)["model"]) for k, o in (("preln", chosen[BASELINE][0]),
                                                                              ("shaped", shaped))},
               "setup": {**size, **MODEL, "seq_len": DATA["seq_len"], "warmup": warmup(size["steps"]),
                         "qk_scaling": qk_scaling, "eval_examples": size["eval_batches"] * size["batch_size"]},
               "models": per_model}
    name, reason = judge(summary)
    summary = {"verdict": name, "verdict_reason": reason, **summary}
    data = {label: {"val_curve": mean_curve(finished(m["runs"], "val_curve")),
                    "train_curve": mean_curve(finished(m["runs"], "train_curve")),
                    "tuning_val_curves": {r["lr"]: r["val_curve"] for r in m["tuning_runs"]},
                    "errors": [r["error"] for r in m["tuning_runs"] + m["runs"]]}
            for label, m in tuned.items()}
    return data, summary


def run(out_dir: str | Path, quick: bool = False, seeds: Sequence[int] = SEEDS, qk_scaling: str = "init",
        show_progress: bool = True, **sizes: Any) -> dict[str, Any]:
    """`measure` → `markdown` (with `table`) + `plot`, written as ``shaped-vs-preln.{json,md,png}``; returns the
    summary. Arguments as for `measure`."""
    data, summary = measure(out_dir, quick, seeds, qk_scaling, show_progress, **sizes)
    return write_outputs(out_dir, NAME, data, summary, markdown(summary), plot(data, summary))
