"""Attention entropy collapse at a large learning rate: Pre-LN vs shaped (Noci et al. 2023, App. D, Fig. 6).

Claim: at a large learning rate the attention entropy of the Pre-LN baseline collapses during training
(the softmax rows degenerate toward point masses; Zhai et al. 2023), while the shaped Transformer's does
not, neither with "Recover" (which ends as a LayerNorm-free softmax Transformer) nor with "Learn".

Setup (`shaped_setup`): encoders of 4 layers, width 64, MLP width 256; 300 steps, batch 16. Shaped: γ = 0.1,
in both parametrizations: the paper's training form (``qk_scaling="weights"``) and τ = √(n·n_k)
(``"temperature"``; identical at init, logits n^{1/4}× slower under Adam). Every model runs at every lr of
a grid of large lrs for seeds 0, 1, 2: the claim is about a regime, so no lr is chosen and no seed is
spent on tuning. While Pre-LN's seed-mean entropy stays above the threshold at every lr, the grid grows
upward by one step (`sigprop.train.lr_grid.step_beyond`), at most ``max_extend`` times.

Measured every 15 steps by the trainer's `Diagnostics` callback on a fixed validation batch: per attention
sublayer the softmax row entropy averaged over rows, heads and batch (the paper's measure); its mean over
layers is judged, its minimum reported, beside the largest attention logit per layer and the
residual-stream RMS after every sublayer (`tuning.layer_stats`).

Verdict rule: `sigprop.experiments.verdicts.entropy_collapse` on the final layer-mean entropy, threshold
10 % of log T (uniform attention over T = 64 keys): 0.42 nats; for a diverged run its last measurement
counts. The verdict is on the paper's parametrization; the same rule on the τ = √(n·n_k) models is
reported beside (``verdicts["temperature"]``). Runs: 5 models × 3 lrs × 3 seeds = 45, up to 75.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..nn.shaped_attention import DEPRECATED_QK_SCALINGS
from ..train.lr_grid import best_lr, step_beyond
from ..train.seed_stats import seed_stats
from ..train.sweep_report import log_ticks
from . import verdicts
from .claim import Claim, Model, stat_text
from .report import Table
from .shaped_setup import DATA, run_config, shaped_model
from .tuning import MAX_EXTEND, TUNING_SEED, layer_stats

BASELINE = "preln"
COLLAPSE_FRACTION = 0.1
FF_MULT = 4
GAMMA = 0.1
MODELS = {BASELINE: ("Pre-LN", {"scheme": "preln"}),
          "shaped-recover": ("shaped recover", shaped_model("recover", GAMMA)),
          "shaped-learn": ("shaped learn", shaped_model("learn", GAMMA)),
          "shaped-recover-temperature": ("shaped recover (τ=√(n·n_k))", shaped_model("recover", GAMMA, "temperature")),
          "shaped-learn-temperature": ("shaped learn (τ=√(n·n_k))", shaped_model("learn", GAMMA, "temperature"))}
FULL = {"steps": 300, "batch_size": 16, "n_layers": 4, "d_model": 64, "eval_batches": 4, "jobs": 2,
        "max_extend": MAX_EXTEND, "seeds": (0, 1, 2), "tuning_seed": TUNING_SEED, "lrs": (1e-2, 3e-2, 1e-1)}
QUICK = {**FULL, "steps": 12, "batch_size": 8, "n_layers": 2, "d_model": 32, "eval_batches": 2, "jobs": 1,
         "max_extend": 0, "seeds": (0,), "lrs": (3e-2,)}


def threshold(seq_len: int) -> float:
    """Collapse threshold: ``COLLAPSE_FRACTION`` · log T, T = keys per row (uniform attention's entropy)."""
    return COLLAPSE_FRACTION * math.log(seq_len)


LIMIT = threshold(DATA["seq_len"])


def models(s: Mapping[str, Any]) -> list[Model]:
    """Every model at every lr of one grid (not tuned), diagnostics 20 times per run."""
    diag_every = max(1, s["steps"] // 20)
    return [Model(key, label, run_config(s, o, FF_MULT, diag_every), s["lrs"], tune=False,
                  attrs={"qk_scaling": o.get("qk_scaling")}) for key, (label, o) in MODELS.items()]


def final_state(run: Mapping[str, Any]) -> dict[str, Any]:
    """Logged per run: its last diagnostics measurement (its last before a divergence): layer-mean and minimum
    attention entropy, and per layer the entropy, largest logit and stream RMS (`tuning.layer_stats`)."""
    if not run["diag_layers"]:
        return {"entropy": math.nan, "min_entropy": math.nan, "attn_entropy": [], "max_logit": [], "stream_rms": []}
    stats = layer_stats(run["diag_layers"][-1][1])
    e = stats["attn_entropy"]
    return {"entropy": float(np.mean(e)), "min_entropy": float(np.min(e)), **stats}


def extend(grid: list[float], points: list[dict[str, Any]]) -> tuple[list[float], str] | None:
    """One lr above the grid while Pre-LN's seed-mean entropy stays at or above the threshold at every lr."""
    pre = [[p["logged"]["entropy"] for p in points if p["model"] == BASELINE and p["lr"] == lr] for lr in grid]
    if not all(np.nanmean(v) >= LIMIT for v in pre):
        return None
    new = step_beyond(grid, "up")
    return [new], f"Pre-LN did not collapse up to lr {grid[-1]:g}: added {new:g}"


def entropies(e: Mapping[str, Any]) -> dict[float, list[float]]:
    """lr → per-seed final layer-mean entropy of a model entry."""
    return {b["lr"]: b["logged"]["entropy"] for b in e["scored"]}


def _qk_scaling(e: Mapping[str, Any]) -> str | None:
    """A model entry's qk_scaling (a summary written under its deprecated name reads as the current one)."""
    q = e["attrs"]["qk_scaling"]
    return DEPRECATED_QK_SCALINGS.get(q, q)


def _rule(qk_scaling: str) -> Any:
    def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
        m = summary["models"]
        shaped = {e["label"]: entropies(e) for e in m.values() if _qk_scaling(e) == qk_scaling}
        return verdicts.entropy_collapse(entropies(m[BASELINE]), shaped, summary["results"]["threshold"])
    rule.__doc__ = f"`verdicts.entropy_collapse`: Pre-LN against the shaped models with qk_scaling {qk_scaling!r}."
    return rule


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The threshold; per model the lr of its lowest seed-mean final loss and the collapsed seeds per lr."""
    out: dict[str, Any] = {"threshold": LIMIT, "models": {}}
    for key, e in summary["models"].items():
        lrs = [b["lr"] for b in e["scored"]]
        out["models"][key] = {"best_lr": best_lr(lrs, [b["final_val_loss"]["mean"] for b in e["scored"]])[0],
                              "collapsed_seeds": [int(sum(not x >= LIMIT for x in b["logged"]["entropy"]))
                                                  for b in e["scored"]]}
    return out


def table(summary: Mapping[str, Any]) -> Table:
    """One row per model and lr: final layer-mean and minimum entropy, collapsed seeds, largest logit, stream
    RMS at the last sublayer, final loss."""
    ms = lambda v, f: stat_text(seed_stats(v), f)
    rows = []
    for key, e in summary["models"].items():
        for b, n in zip(e["scored"], summary["results"]["models"][key]["collapsed_seeds"]):
            lg = b["logged"]
            logits, rms = [max(x) for x in lg["max_logit"] if x], [x[-1] for x in lg["stream_rms"] if x]
            rows.append([e["label"], f"{b['lr']:g}", ms(lg["entropy"], ".2f"), ms(lg["min_entropy"], ".2f"),
                         f"{n}/{len(b['seeds'])}", ms(logits, ".3g") if logits else "–", ms(rms, ".3g") if rms else "–",
                         ms(b["final_loss"], ".3f")])
    return Table(["model", "lr", "final entropy (layer mean)", "final min entropy", "collapsed seeds",
                  "largest logit", "stream RMS (last)", "final val loss"], rows)


def setup(summary: Mapping[str, Any]) -> str:
    s, grid = summary["sizes"], summary["models"][BASELINE]["lr_grid"]
    ext = summary["models"][BASELINE]["extended"]
    return (f"Masked LM on the `pydoc` corpus (vocab 512, seq 64); encoder, {s['n_layers']} layers, width "
            f"{s['d_model']}, MLP width {FF_MULT * s['d_model']}, 4 heads; {s['steps']} steps, batch "
            f"{s['batch_size']}, "
            f"AdamW (no weight decay), every model at every lr of {', '.join(f'{x:g}' for x in grid)}, 10 % warmup "
            f"(= Recover length); shaped γ = {GAMMA}, τ₀ = 1. Attention entropy every {max(1, s['steps'] // 20)} "
            f"steps on a fixed validation batch (judged: its mean over layers); collapse = final entropy < "
            f"{COLLAPSE_FRACTION:g}·log T = {summary['results']['threshold']:.2f} nats. Seeds {summary['seeds']}."
            + (f" Grid extended: {'; '.join(ext)}." if ext else ""))


def plot(summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """Left: final layer-mean entropy vs lr (seeds as dots); middle: layer-mean entropy vs step at the largest
    lr (seed mean); right: final largest attention logit vs lr (mean over layers and seeds)."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.5))
    grid = summary["models"][BASELINE]["lr_grid"]
    for i, (key, e) in enumerate(summary["models"].items()):
        color, ls = f"C{i}", "--" if e["attrs"]["qk_scaling"] == "temperature" else "-"
        lrs = [blk["lr"] for blk in e["scored"]]
        a.plot(lrs, [np.nanmean(blk["logged"]["entropy"]) for blk in e["scored"]], ls=ls, color=color, label=e["label"])
        for blk in e["scored"]:
            a.scatter([blk["lr"]] * len(blk["seeds"]), blk["logged"]["entropy"], s=8, color=color)
        top = [r["diag"] for r in data[key] if r["lr"] == grid[-1] and not r["diverged"] and r["diag"]]
        if top:
            n = min(map(len, top))
            b.plot([row[0] for row in top[0][:n]], np.mean([[row[1] for row in d[:n]] for d in top], 0), ls=ls,
                   color=color, label=e["label"])
        logit = lambda blk: [np.mean(x) for x in blk["logged"]["max_logit"] if x]
        c.plot(lrs, [np.nanmean(logit(blk)) if logit(blk) else np.nan for blk in e["scored"]], ls=ls, color=color,
               marker="o", ms=3, label=e["label"])
    for ax in (a, b):
        ax.axhline(summary["results"]["threshold"], color="grey", ls=":", label="collapse threshold")
    log_ticks(a, grid)
    log_ticks(c, grid)
    a.set(xlabel="peak lr", ylabel="final attention entropy (layer mean, nats)", title="entropy at the end of training")
    b.set(xlabel="step", ylabel="attention entropy (layer mean, nats)", title=f"entropy vs step, lr {grid[-1]:g}")
    c.set(yscale="log", xlabel="peak lr", ylabel="largest attention logit (layer mean)",
          title="the cause: attention logits")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    return fig


CLAIM = Claim(
    name="entropy-collapse", title="Pre-LN attention entropy collapses at a large lr, shaped does not",
    claim=("(Shaped Transformer, App. D, Fig. 6): \"for the large learning rate regime … the entropy collapses for "
           "the baseline model, but not for the proposed shaped Transformer\", including the Recover variant, which "
           "ends as a softmax Transformer without LayerNorm. Judged on the paper's training parametrization (τ = "
           "√n_k, W_Q, W_K ~ N(0, n^-3/2)); the rows marked τ=√(n·n_k) are the same models with the whole "
           "temperature in the logit scale (identical at init), judged beside."),
    full=FULL, quick=QUICK, models=models, rule=_rule("weights"), rules={"temperature": _rule("temperature")},
    setup=setup, table=table, plot=plot, log=final_state, extend=extend, derive=derive)
