"""DeepScaleLM's depth claim at CPU scale: very deep decoders train with DSLM, the standard init fails.

Claims (Kedia et al., ICML 2024): (a) at 192 layers DSLM trains stably where the standard Pre-LN /
Post-LN init diverges or stalls; (b) a 1000-layer thin model trains with DSLM. Beside them (Liu et al. 2020,
Admin): with Admin's shortcut weights a 192-layer Post-LN model trains.

Setup: causal LM on the embedded corpus ("pydoc", BPE vocabulary 512), width 64, 4 heads, seq 32, batch 8,
300 steps for every run: scheme "preln" and "postln" (standard init), "dslm" with norm placement "pre"
and "post", "admin" (Post-LN) with ``admin_mode`` "profile" and "constant"; AdamW, linear warmup over 10 % of
the steps, then a constant lr (no decay that could rescue a run late), global gradient-norm clip 1.0; subnormal
floats are flushed to zero (``train.flush_denormal``: a Post-LN stack whose gradients vanish through depth
otherwise spends most of its step on them; numbers change only where a value is below 1.2e-38).

Learning rates: each 192-layer model is tuned on the tuning seed over ``lrs``; from those runs each model's
*largest stable lr* (the largest lr whose run trains) and each DSLM model's chosen lr. Scored (seeds 0, 1):
each DSLM model at its chosen lr and the standard model of the same norm at that same lr ("does the
standard init train at DSLM's lr?"); each Admin model at its own chosen lr; the 1000-layer DSLM Pre-LN model
at 192-layer DSLM Pre-LN's lr (not tuned at 1000 layers, which the budget does not allow).

Rule: a run *trains* if its final held-out loss is at least 0.1 nats below its unigram level (token
frequencies of its training split on its own evaluation tokens). Verdict:
`sigprop.experiments.verdicts.dslm_depth`; beside it `sigprop.experiments.verdicts.admin_postln` (does an
Admin model, or any Post-LN model, train at 192 layers?). Every run logs each block's gradient norm at its
evaluations (``train.block_grads``), the quantity that shows a Post-LN stack's gradient vanishing through
depth during training. ``deep_seeds=[0]`` halves the 1000-layer runs.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..schemes import get_scheme
from ..train.levels import TRAIN_MARGIN, trains
from ..train.schedules import default_warmup
from ..train.seed_stats import seed_stats
from ..train.sweep_report import log_ticks
from . import verdicts
from .claim import Claim, Model, lr_text, stat_text, tuned
from .report import Table
from .tuning import MAX_EXTEND, TUNING_SEED

VOCAB = 512
NORMS = {"preln": "Pre-LN", "postln": "Post-LN"}
FULL = {"depth": 192, "deep_depth": 1000, "width": 64, "heads": 4, "seq": 32, "batch": 8, "steps": 300,
        "lrs": (3e-3, 1e-2, 3e-2), "seeds": (0, 1), "deep_seeds": (0, 1), "deep_norms": ("preln",),
        "eval_every": 50, "jobs": 2, "max_extend": MAX_EXTEND, "tuning_seed": TUNING_SEED,
        "admin_modes": ("profile", "constant")}
QUICK = {**FULL, "depth": 6, "deep_depth": 16, "width": 16, "heads": 2, "seq": 16, "batch": 4, "steps": 12,
         "lrs": (3e-3, 1e-2), "seeds": (0,), "deep_seeds": (0,), "eval_every": 4, "jobs": 1, "max_extend": 0}


def run_config(s: Mapping[str, Any], scheme: str, norm: str | None, depth: int) -> dict[str, Any]:
    """Run-config sections of one decoder (``depth`` × ``s["width"]``): constant lr after a 10 % warmup; ``norm``
    (a key of `NORMS`): the norm placement of that scheme (None: the scheme's own)."""
    placement = {"norm_placement": get_scheme(norm).norm_placements[0]} if norm else {}
    return {"model": {"arch": "decoder", "scheme": scheme, "vocab_size": VOCAB, "d_model": s["width"],
                      "n_layers": depth, "n_heads": s["heads"], "max_seq_len": s["seq"], **placement},
            "data": {"source": "pydoc", "seq_len": s["seq"]},
            "optim": {"warmup_steps": default_warmup(s["steps"]), "decay": "constant"},
            "train": {"steps": s["steps"], "batch_size": s["batch"], "eval_every": s["eval_every"], "eval_batches": 4,
                      "diag_every": 0, "block_grads": True, "flush_denormal": True}}


def admin_run_config(s: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """An Admin Post-LN decoder (`sigprop.schemes.admin`, ``admin_mode`` ``mode``) of ``s["depth"]`` blocks."""
    t = run_config(s, "admin", None, s["depth"])
    return {**t, "model": {**t["model"], "admin_mode": mode}}


def models(s: Mapping[str, Any]) -> list[Model]:
    """DSLM per norm (tuned), the standard init per norm (tuned, scored at DSLM's lr), Admin Post-LN per mode
    (tuned, scored at its own lr), the deep DSLM models."""
    out = [Model(f"dslm-{n}", f"{label} DSLM", run_config(s, "dslm", n, s["depth"]), s["lrs"],
                 attrs={"scheme": "dslm", "norm": n, "depth": s["depth"]}) for n, label in NORMS.items()]
    out += [Model(f"standard-{n}", f"{label} standard", run_config(s, n, None, s["depth"]), s["lrs"],
                  score_at=f"dslm-{n}", attrs={"scheme": n, "norm": n, "depth": s["depth"]})
            for n, label in NORMS.items()]
    out += [Model(f"admin-{mode}", f"Post-LN Admin ({mode})", admin_run_config(s, mode), s["lrs"],
                  attrs={"scheme": "admin", "norm": "postln", "depth": s["depth"], "admin_mode": mode})
            for mode in s["admin_modes"]]
    out += [Model(f"dslm-{n}-deep", f"{NORMS[n]} DSLM depth {s['deep_depth']}",
                  run_config(s, "dslm", n, s["deep_depth"]), (), tune=False, score_at=f"dslm-{n}",
                  seeds=s["deep_seeds"],
                  attrs={"scheme": "dslm", "norm": n, "depth": s["deep_depth"]}) for n in s["deep_norms"]]
    return out


def grad_stats(r: Mapping[str, Any]) -> dict[str, Any]:
    """Logged per run: median pre-clip gradient norm over the first and the last tenth of the steps, and the max;
    each block's gradient norm (bottom to top) at the first and the last evaluating step (``block_grads``)."""
    g = np.array([row[2] for row in r["train_curve"]], dtype=float)
    blocks = r.get("block_grads") or []
    per_block = {"first_step": blocks[0][0], "first": blocks[0][1], "last_step": blocks[-1][0],
                 "last": blocks[-1][1]} if blocks else None
    if not len(g):                                      # diverged at the first step
        return {"grad_norm": {"first": math.nan, "last": math.nan, "max": math.nan}, "block_grads": per_block}
    k = max(1, len(g) // 10)
    return {"grad_norm": {"first": float(np.median(g[:k])), "last": float(np.median(g[-k:])),
                          "max": float(np.nanmax(g))}, "block_grads": per_block}


def _scored(e: Mapping[str, Any]) -> dict[str, Any]:
    b = e["scored"][0] if e["scored"] else {"seeds": [], "final_loss": [], "unigram": []}
    return {"seeds": b["seeds"], "final_loss": b["final_loss"], "unigram": b["unigram"]}


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.dslm_depth` on the 192-layer DSLM and standard models and the deep DSLM models."""
    m, s = summary["models"], summary["sizes"]
    at = lambda *schemes: {e["attrs"]["norm"]: tuned(e) for e in m.values()
                           if e["attrs"]["scheme"] in schemes and e["attrs"]["depth"] == s["depth"]}
    deep = {e["label"]: _scored(e) for e in m.values() if e["attrs"]["depth"] == s["deep_depth"]}
    return verdicts.dslm_depth(at("dslm"), at("preln", "postln"), deep, s["steps"])


def admin_rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.admin_postln`: Admin's Post-LN models at their own lr, beside the other Post-LN runs at depth."""
    m, s = summary["models"], summary["sizes"]
    admin = {e["label"]: tuned(e) for e in m.values() if e["attrs"]["scheme"] == "admin" and e["tuning"]}
    others = {e["label"]: _scored(e) for e in m.values() if e["attrs"]["scheme"] != "admin"
              and e["attrs"]["norm"] == "postln" and e["attrs"]["depth"] == s["depth"]}
    return verdicts.admin_postln(admin, others, s["steps"])


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per model: whether each scored run trains; per tuned model its largest stable lr and which tuning runs train."""
    out = {}
    for key, e in summary["models"].items():
        sc = _scored(e)
        r: dict[str, Any] = {"trains": [trains(x, u) for x, u in zip(sc["final_loss"], sc["unigram"])]}
        if e["tuning"]:
            t = tuned(e)
            r["largest_stable_lr"], r["largest_stable_at_top"] = verdicts.largest_stable_lr(t)
            r["tuning_trains"] = [trains(x, t["tuning_unigram"]) for x in t["tuning_loss"]]
        out[key] = r
    return out


def _ms(values: Sequence[float]) -> str:
    return stat_text(seed_stats(values)) if len(values) > 1 else f"{values[0]:.3f}"


def table(summary: Mapping[str, Any]) -> Table:
    """One row per model: lr grid and largest stable lr, scored losses vs unigram, status, gradients."""
    rows = []
    for key, e in summary["models"].items():
        r, b = summary["results"][key], e["scored"][0] if e["scored"] else None
        stable = ("–" if "largest_stable_lr" not in r else "none" if r["largest_stable_lr"] is None else
                  f"{r['largest_stable_lr']:g}" + (" (grid top)" if r["largest_stable_at_top"] else ""))
        g = " · ".join(f"{x['first']:.3g} → {x['last']:.3g} ({x['max']:.3g})"
                       for x in (b["logged"]["grad_norm"] if b else []))
        rows.append([e["label"], e["attrs"]["depth"], lr_text(e) if e["tuning"] else "–", stable,
                     f"{b['lr']:g}" if b else "–", f"{e['params'] / 1e6:.2f} M",
                     _ms(b["initial_val_loss"]["per_seed"]) if b else "–", _ms(b["final_loss"]) if b else "–",
                     f"{np.mean(b['unigram']):.3f}" if b else "–",
                     ", ".join("trains" if t else "fails" for t in r["trains"]), g])
    return Table(["config", "depth", "lr grid (tuning seed)", "largest stable lr", "scored lr", "params",
                  "initial loss", "final loss", "unigram", "scored runs", "grad norm first → last (max)"], rows)


def setup(summary: Mapping[str, Any]) -> str:
    s = summary["sizes"]
    return (f"decoder, causal LM on the embedded corpus (`pydoc`, BPE vocabulary {VOCAB}), width {s['width']}, "
            f"{s['heads']} heads, seq {s['seq']}, batch {s['batch']}, {s['steps']} steps, AdamW, 10 % warmup then a "
            f"constant lr, gradient clip 1.0. Every {s['depth']}-layer model is trained at every lr of its grid on "
            f"tuning seed {summary['tuning_seed']} (not scored); DSLM's chosen lr is its lowest final loss. Scored "
            f"seeds {s['seeds']}: each DSLM model at its lr and the standard model of the same norm at that lr, "
            f"each Admin Post-LN model (admin_mode {', '.join(s['admin_modes'])}) at its own lr; depth "
            f"{s['deep_depth']} (seeds {s['deep_seeds']}) at DSLM's lr. Unigram = loss of the training split's token "
            f"frequencies on the same evaluation tokens; a run *trains* if it ends ≥ {TRAIN_MARGIN} nats "
            "below it.")


def plot(summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """Left: tuning-seed final loss vs lr (dashed: the tuning seed's unigram − 0.1, the *trains* line); middle:
    scored validation curves (deep models dotted); right: pre-clip gradient norm of the scored runs."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    s = summary["sizes"]
    for i, (key, e) in enumerate(summary["models"].items()):
        color = f"C{i}"
        if e["tuning"]:
            a.plot(e["lr_grid"], e["tuning"]["loss"], "o-", ms=3, color=color, label=e["label"])
        deep = e["attrs"]["depth"] != s["depth"]
        for j, r in enumerate(x for x in data[key] if x["role"] == "scored"):
            if r["val_curve"]:
                b.plot(*zip(*r["val_curve"]), ":" if deep else "-", color=color,
                       label=f"{e['label']}, lr {r['lr']:g}" if j == 0 else None)
            if r["train_curve"] and not deep:
                c.plot([x[0] for x in r["train_curve"]], [x[2] for x in r["train_curve"]], color=color, lw=0.8,
                       label=e["label"] if j == 0 else None)
    tuned_models = [e for e in summary["models"].values() if e["tuning"]]
    if tuned_models:
        a.axhline(tuned_models[0]["tuning"]["unigram"] - TRAIN_MARGIN, color="k", ls="--", lw=0.8,
                  label="unigram − 0.1")
        log_ticks(a, [lr for e in tuned_models for lr in e["lr_grid"]])
    a.set(xlabel="peak lr", ylabel="final val loss, tuning seed", title=f"{s['depth']} layers: lr grid")
    b.set(xlabel="step", ylabel="validation loss (nats/token)", title="scored runs (standard: at DSLM's lr)")
    c.set(xlabel="step", ylabel="gradient norm (before clip 1.0)", yscale="log", title=f"{s['depth']} layers")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    return fig


CLAIM = Claim(
    name="dslm-depth", title="192- and 1000-layer models train with DSLM",
    claim=("(DeepScaleLM, Kedia et al. 2024): with the DSLM initialization and residual scaling a 192-layer model "
           "trains stably where the standard Pre-LN / Post-LN initialization diverges or stalls, and models of 1000 "
           "layers train."),
    full=FULL, quick=QUICK, models=models, rule=rule, setup=setup, table=table, plot=plot, log=grad_stats,
    derive=derive, rules={"admin-postln": admin_rule})
