"""Shaped Transformer vs a tuned Pre-LN baseline (Noci et al. 2023, App. D, Table 1) at CPU scale.

Claim: the shaped Transformer *without LayerNorm* (shaped attention, shaped ReLU, trainable λ/γ residual)
trains about as fast as a Pre-LN Transformer whose learning rate was tuned.

Setup (`shaped_setup`): encoders of 8 layers, width 64, MLP width 128; Pre-LN, and shaped with γ ∈ {0.05,
0.1, 0.2} in both training variants ("recover", "learn"). Every model gets its own lr on the tuning seed
from its grid (×2 apart; the paper tunes Pre-LN on {1e-4, 5e-4, 1e-3, 5e-3}, whose top was the best lr
at this size, so the grid starts there and goes up); scored: seeds 0, 1, 2 at each model's lr.
Runs: 7 models × (4 tuning lrs + ≤ 2 extensions + 3 seeds) = 49–63.

Verdict rule: `sigprop.experiments.verdicts.shaped_vs_preln` (every shaped variant within +5 % of the tuned
Pre-LN seed-mean final validation loss: reproduced; one within +5 % or all within +10 %: partly).

    from sigprop.experiments.claim import run_claim
    from sigprop.experiments.shaped_vs_preln import CLAIM
    summary = run_claim(CLAIM, "runs/reproduce/shaped-vs-preln", sizes={"seeds": [0, 1, 2]})
"""
from __future__ import annotations

from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..train.schedules import default_warmup
from ..train.sweep_report import log_ticks
from . import verdicts
from .claim import Claim, Model, lr_text, stat_text, tuned
from .report import Table
from .shaped_setup import run_config, shaped_model
from .training import mean_curve, undiverged_curves
from .tuning import MAX_EXTEND, TUNING_SEED

BASELINE = "preln"
FF_MULT = 2                      # MLP width / model width (BERT uses 4; 2 fits the CPU budget)
FULL = {"steps": 450, "batch_size": 16, "n_layers": 8, "d_model": 64, "eval_batches": 8, "jobs": 2,
        "max_extend": MAX_EXTEND, "seeds": (0, 1, 2), "tuning_seed": TUNING_SEED, "gammas": (0.05, 0.1, 0.2),
        "shapings": ("recover", "learn"), "qk_scaling": "weights",
        "preln_lrs": (2.5e-3, 5e-3, 1e-2, 2e-2), "shaped_lrs": (1.25e-3, 2.5e-3, 5e-3, 1e-2)}
QUICK = {**FULL, "steps": 16, "batch_size": 8, "n_layers": 2, "d_model": 32, "eval_batches": 4, "jobs": 1,
         "max_extend": 0, "seeds": (0,), "gammas": (0.05,), "preln_lrs": (5e-3, 1e-2), "shaped_lrs": (2.5e-3, 5e-3)}


def models(s: Mapping[str, Any]) -> list[Model]:
    """Pre-LN first, then shaped per training variant and γ, each tuned on its own grid."""
    out = [Model(BASELINE, "Pre-LN", run_config(s, {"scheme": "preln"}, FF_MULT), s["preln_lrs"])]
    out += [Model(f"shaped-{v}-{g:g}", f"shaped {v} γ={g:g}",
                  run_config(s, shaped_model(v, g, s["qk_scaling"]), FF_MULT), s["shaped_lrs"],
                  attrs={"shaping": v, "gamma": g}) for v in s["shapings"] for g in s["gammas"]]
    return out


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.shaped_vs_preln` on every model at its own lr (display labels name them in the reason)."""
    m = summary["models"]
    return verdicts.shaped_vs_preln({e["label"]: tuned(e) for e in m.values()}, m[BASELINE]["label"])


def derive(summary: Mapping[str, Any]) -> dict[str, float]:
    """The unigram level on the baseline's scored splits (seed mean)."""
    return {"unigram_val_loss": float(np.mean(summary["models"][BASELINE]["scored"][0]["unigram"]))}


def unigram(summary: Mapping[str, Any]) -> float:
    return summary["results"]["unigram_val_loss"]


def table(summary: Mapping[str, Any]) -> Table:
    rows = [[e["label"], lr_text(e), stat_text(b["final_val_loss"]), f"{b['best_val_loss']['mean']:.3f}",
             sum(b["diverged"])]
            for e in summary["models"].values() for b in e["scored"]]
    return Table(["model", "lr (tuning seed)", "final val loss (mean ± std)", "best val loss", "diverged seeds"], rows)


def setup(summary: Mapping[str, Any]) -> str:
    s, m = summary["sizes"], summary["models"]
    shaped = next(e for k, e in m.items() if k != BASELINE)
    return (f"Masked LM (15 % masking) on the `pydoc` corpus, BPE vocab 512, seq 64; encoder, {s['n_layers']} "
            f"layers, width {s['d_model']}, MLP width {FF_MULT * s['d_model']}, 4 heads (Pre-LN "
            f"{m[BASELINE]['params']:,} / shaped {shaped['params']:,} parameters); {s['steps']} steps, batch "
            f"{s['batch_size']}, AdamW (no weight decay, betas 0.9/0.999), warmup {default_warmup(s['steps'])} steps "
            f"then cosine decay, grad clip 1. Shaped: τ₀ = 1, λ and γ trained, qk_scaling {s['qk_scaling']}; Recover "
            f"over the warmup. Every model has its own lr, chosen on tuning seed {summary['tuning_seed']} (not "
            f"scored). Scored seeds {summary['seeds']}; validation on {s['eval_batches'] * s['batch_size']} held-out "
            f"examples. Unigram level (context-free predictor): {unigram(summary):.3f} nats.")


def plot(summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """Left: tuning-seed final loss vs lr (ring: chosen lr); middle: seed-mean validation curves at each model's
    lr; right: scored final loss per model (seeds as dots)."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.5))
    for i, (key, e) in enumerate(summary["models"].items()):
        color = "k" if key == BASELINE else f"C{i}"
        t = e["tuning"]
        a.plot(e["lr_grid"], t["loss"], "o-", color=color, ms=3, label=e["label"])
        if t["best_lr"] is not None:
            a.plot([t["best_lr"]], [t["loss"][e["lr_grid"].index(t["best_lr"])]], "o", mfc="none", ms=9, color=color)
        curve = mean_curve(undiverged_curves([r for r in data[key] if r["role"] == "scored"], "val_curve"))
        b.plot(curve["step"], curve["mean"], color=color, lw=2.5 if key == BASELINE else 1.2, label=e["label"])
        for blk in e["scored"]:
            c.scatter(np.full(len(blk["final_loss"]), i), blk["final_loss"], s=12, color=color, zorder=3)
    log_ticks(a, [lr for e in summary["models"].values() for lr in e["lr_grid"]])
    a.set(xlabel="peak lr", ylabel="final val loss, tuning seed", title="lr grids (ring: chosen)")
    b.axhline(unigram(summary), color="grey", ls=":", label="unigram level")
    b.set(xlabel="step", ylabel="validation MLM loss (nats)", title="validation loss at each model's lr")
    labels = [e["label"] for e in summary["models"].values()]
    c.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    c.set(ylabel="final validation loss (scored seeds)", title="final loss per model")
    for ax in (a, b):
        ax.legend(fontsize=7)
    return fig


CLAIM = Claim(
    name="shaped-vs-preln", title="shaped Transformer without LayerNorm trains like tuned Pre-LN",
    claim=("(Shaped Transformer, App. D, Table 1): the shaped Transformer without LayerNorm, in both training "
           "variants (Recover, Learn) and for γ ∈ {0.05, 0.1, 0.2}, reaches train/test losses comparable to a "
           "Pre-LN Transformer whose learning rate is tuned."),
    full=FULL, quick=QUICK, models=models, rule=rule, setup=setup, table=table, plot=plot, derive=derive)
