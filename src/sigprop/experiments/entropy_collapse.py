"""Attention entropy collapse at a large learning rate, Pre-LN vs shaped, on the encoder of `shaped_vs_preln`. A
claim about a regime: every model at every lr of a grid of large lrs for every seed (no lr chosen), the grid grown
upward while Pre-LN's seed-mean entropy stays above the threshold. Judged: the layer mean of the final attention
entropy (`layer_stats`). Rule: `sigprop.experiments.verdicts.entropy_collapse`, per qk_scaling.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Mapping

import numpy as np

from ..nn.shaped_attention import DEPRECATED_QK_SCALINGS
from ..train.lr_grid import best_lr, step_beyond
from ..train.seed_stats import mean_curve
from . import verdicts
from .claim import FINAL, MODEL, Claim, Model, blocks_panel, stat_cell
from .shaped_vs_preln import DATA, run_config, shaped_model
from .tuning import layer_stats

BASELINE = "preln"
COLLAPSE_FRACTION, FF_MULT, GAMMA = 0.1, 4, 0.1     # threshold / log T, MLP width / width, the shaped models' γ
MODELS = {BASELINE: ("Pre-LN", {"scheme": "preln"}),
          "shaped-recover": ("shaped recover", shaped_model("recover", GAMMA)),
          "shaped-learn": ("shaped learn", shaped_model("learn", GAMMA)),
          "shaped-recover-temperature": ("shaped recover (τ=√(n·n_k))", shaped_model("recover", GAMMA, "temperature")),
          "shaped-learn-temperature": ("shaped learn (τ=√(n·n_k))", shaped_model("learn", GAMMA, "temperature"))}
FULL = {"steps": 300, "batch_size": 16, "n_layers": 4, "d_model": 64, "eval_batches": 4, "seeds": (0, 1, 2),
        "lrs": (1e-2, 3e-2, 1e-1)}
QUICK = {"steps": 12, "batch_size": 8, "n_layers": 2, "d_model": 32, "eval_batches": 2, "lrs": (3e-2,)}
LIMIT = COLLAPSE_FRACTION * math.log(DATA["seq_len"])    # collapse: below this fraction of uniform attention's log T


def models(s: Mapping[str, Any]) -> list[Model]:
    """Every model at every lr of one grid (not tuned), diagnostics 20 times per run."""
    return [Model(key, label, run_config(s, o, FF_MULT, max(1, s["steps"] // 20)), s["lrs"], tune=False,
                  attrs={"qk_scaling": o.get("qk_scaling")}) for key, (label, o) in MODELS.items()]


def final_state(run: Mapping[str, Any]) -> dict[str, Any]:
    """Logged per run: its last diagnostics measurement (its last before a divergence): layer-mean and minimum
    attention entropy, and per layer the entropy, largest logit and stream RMS (`tuning.layer_stats`)."""
    stats = layer_stats(run["diag_layers"][-1][1] if run["diag_layers"] else [])
    e = stats["attn_entropy"] or [math.nan]
    return {"entropy": float(np.mean(e)), "min_entropy": float(np.min(e)), **stats}


def extend(grid: list[float], points: list[dict[str, Any]]) -> tuple[list[float], str] | None:
    """One lr above the grid while Pre-LN's seed-mean entropy stays at or above the threshold at every lr."""
    pre = [[p["logged"]["entropy"] for p in points if p["model"] == BASELINE and p["lr"] == lr] for lr in grid]
    new = step_beyond(grid, "up")
    return ([new], f"Pre-LN did not collapse up to lr {grid[-1]:g}: added {new:g}") if all(
        np.nanmean(v) >= LIMIT for v in pre) else None


def entropies(e: Mapping[str, Any]) -> dict[float, list[float]]:
    """lr → per-seed final layer-mean entropy of a model entry."""
    return {b["lr"]: b["logged"]["entropy"] for b in e["scored"]}


def _qk_scaling(e: Mapping[str, Any]) -> str | None:
    """A model entry's qk_scaling (a summary written under its deprecated name reads as the current one)."""
    return DEPRECATED_QK_SCALINGS.get(e["attrs"]["qk_scaling"], e["attrs"]["qk_scaling"])


_logit = lambda b: np.nanmean([np.mean(x) if x else np.nan for x in b["logged"]["max_logit"]])   # layers, seeds
_collapsed = lambda b: int(sum(not x >= LIMIT for x in b["logged"]["entropy"]))     # seeds below LIMIT (NaN too)
_ls = lambda e: "--" if _qk_scaling(e) == "temperature" else "-"      # a model's line: dashed for τ = √(n·n_k)


def _rule(qk_scaling: str) -> Any:
    """`verdicts.entropy_collapse`: Pre-LN against the shaped models with ``qk_scaling``."""
    return lambda s: verdicts.entropy_collapse(entropies(s["models"][BASELINE]), {e["label"]: entropies(e) for e in
                                               s["models"].values() if _qk_scaling(e) == qk_scaling},
                                               s["results"]["threshold"])


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The threshold; per model the lr of its lowest seed-mean final loss and the collapsed seeds per lr."""
    out: dict[str, Any] = {"threshold": LIMIT, "models": {}}
    for key, e in summary["models"].items():
        lrs = [b["lr"] for b in e["scored"]]
        out["models"][key] = {"best_lr": best_lr(lrs, [b["final_val_loss"]["mean"] for b in e["scored"]])[0],
                              "collapsed_seeds": [_collapsed(b) for b in e["scored"]]}
    return out


def step_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """Layer-mean entropy against step at the largest lr (seed mean of the runs that did not diverge)."""
    top = summary["models"][BASELINE]["lr_grid"][-1]
    for i, (key, e) in enumerate(summary["models"].items()):
        c = mean_curve([r["diag"] for r in data[key] if r["lr"] == top and not r["diverged"] and r["diag"]])
        ax.plot(c["step"], c["mean"], ls=_ls(e), color=f"C{i}", label=e["label"])
    ax.axhline(summary["results"]["threshold"], color="grey", ls=":", label="collapse threshold")
    ax.set(xlabel="step", ylabel="attention entropy (layer mean, nats)", title=f"entropy vs step, lr {top:g}")


CLAIM = Claim(
    name="entropy-collapse", title="Pre-LN attention entropy collapses at a large lr, shaped does not",
    claim=("(Shaped Transformer, App. D, Fig. 6): \"for the large learning rate regime … the entropy collapses for "
           "the baseline model, but not for the proposed shaped Transformer\", including the Recover variant, which "
           "ends as a softmax Transformer without LayerNorm. Judged on the paper's training parametrization (τ = "
           "√n_k, W_Q, W_K ~ N(0, n^-3/2)); the rows marked τ=√(n·n_k) are the same models with the whole "
           "temperature in the logit scale (identical at init), judged beside."),
    full=FULL, quick=QUICK, models=models, rule=_rule("weights"), rules={"temperature": _rule("temperature")},
    log=final_state, extend=extend, derive=derive,
    setup=("The encoder of shaped-vs-preln, {s[n_layers]} layers, width {s[d_model]}, " f"MLP width {FF_MULT}·d; "
           "{s[steps]} steps, batch {s[batch_size]}, every model at every lr of {m[preln][lr_grid]}; " f"shaped γ = "
           f"{GAMMA}. Attention entropy 20 times per run on a fixed validation batch (judged: its mean over layers); "
           f"collapse = final entropy < {COLLAPSE_FRACTION:g}·log T = " "{r[threshold]:.2f} nats. Seeds {s[seeds]}."),
    table=[MODEL, ("lr", lambda e, b, s: f"{b['lr']:g}"), ("final entropy (layer mean)", stat_cell("entropy", ".2f")),
           ("final min entropy", stat_cell("min_entropy", ".2f")),
           ("collapsed seeds", lambda e, b, s: f"{_collapsed(b)}/{len(b['seeds'])}"),
           ("largest logit", stat_cell("max_logit", ".3g", max)),
           ("stream RMS (last)", stat_cell("stream_rms", ".3g", lambda x: x[-1])), FINAL],
    plot=[partial(blocks_panel, value=lambda b: np.nanmean(b["logged"]["entropy"]), ls=_ls,
                  ylabel="final attention entropy (layer mean, nats)"), step_panel,
          partial(blocks_panel, value=_logit, ls=_ls, ylabel="largest attention logit (layer mean)", yscale="log")])
