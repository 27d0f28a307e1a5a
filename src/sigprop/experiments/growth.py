"""Growing depth during training (Staged Training, Shen et al. 2022; LLaMA Pro, Wu et al. 2024) at CPU scale.

Claim: a model grown in depth during training reaches the loss of the same deep model trained from scratch
for less compute (Staged Training reports up to 22 % of the compute saved).

Setup: causal LM on the embedded corpus ("pydoc", BPE vocabulary 512), Pre-LN decoders of width 64, 4 heads,
seq 32, batch 16; AdamW, 10 % warmup then cosine decay over each run's steps, grad clip 1. *Scratch*: ``depth``
blocks for ``steps`` steps. *Grown*: ``small_depth`` blocks grown to ``depth`` after the fraction
``grow_fraction`` of its steps (fixed before the run) by `sigprop.train.growth` in mode ``mode`` (default
``identity``: copies of the neighbouring block with zeroed output projections, so the function is unchanged at
the growth; ``every`` = 1: new blocks after every block), for as many steps as make its training FLOPs equal to
scratch's (`sigprop.models.flops`; the shallow steps are cheaper, so it takes more of them). Compute is
counted per step at the depth of that step; both evaluate every ``eval_every`` steps.

Learning rates: each model is tuned on the tuning seed over ``lrs`` (extended past an edge that holds its
optimum); scored: ``seeds`` at each model's lr.

Measured per scored seed: the compute at which the grown run's validation loss first reaches scratch's final
validation loss on the same seed (linear in compute between evaluations), as a fraction of scratch's compute.
Verdict rule: `sigprop.experiments.verdicts.growth`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..models.flops import train_flops_per_token
from ..train.sweep_report import log_ticks
from . import verdicts
from .claim import Claim, Model, lr_text, stat_text, tuned
from .report import Table
from .training import meta_model
from .tuning import MAX_EXTEND, TUNING_SEED

VOCAB = 512
FULL = {"small_depth": 4, "depth": 16, "width": 64, "heads": 4, "seq": 32, "batch": 16, "steps": 600,
        "grow_fraction": 0.25, "mode": "identity", "every": 1, "lrs": (1e-3, 3e-3, 1e-2), "seeds": (0, 1, 2),
        "eval_every": 20, "eval_batches": 4, "jobs": 2, "max_extend": MAX_EXTEND, "tuning_seed": TUNING_SEED}
QUICK = {**FULL, "small_depth": 1, "depth": 2, "width": 16, "heads": 2, "seq": 16, "batch": 4, "steps": 16,
         "lrs": (3e-3, 1e-2), "seeds": (0,), "eval_every": 4, "jobs": 1, "max_extend": 0}


def _model(s: Mapping[str, Any], depth: int) -> dict[str, Any]:
    return {"arch": "decoder", "scheme": "preln", "vocab_size": VOCAB, "d_model": s["width"], "n_layers": depth,
            "n_heads": s["heads"], "max_seq_len": s["seq"]}


def flops_per_token(s: Mapping[str, Any], depth: int) -> float:
    return train_flops_per_token(meta_model(_model(s, depth)), s["seq"])


def grown_schedule(s: Mapping[str, Any]) -> tuple[int, int]:
    """(steps, grow_at) of the grown run: grow_at = round(f · steps) and, with F_small, F_deep the FLOPs per token,
    grow_at · F_small + (steps − grow_at) · F_deep = scratch's steps · F_deep, so steps = T F_deep / (f F_small +
    (1 − f) F_deep), rounded to a whole step."""
    small, deep, f = flops_per_token(s, s["small_depth"]), flops_per_token(s, s["depth"]), s["grow_fraction"]
    steps = round(s["steps"] * deep / (f * small + (1 - f) * deep))
    return steps, max(1, round(f * steps))


def run_config(s: Mapping[str, Any], depth: int, steps: int, grow_at: int = 0) -> dict[str, Any]:
    """Run-config sections of one run: ``depth`` blocks (grown to ``s["depth"]`` after ``grow_at`` steps)."""
    growth = {"grow_at": grow_at, "grow_to": s["depth"], "grow_mode": s["mode"], "grow_every": s["every"]}
    return {"model": _model(s, depth), "data": {"source": "pydoc", "seq_len": s["seq"]},
            "optim": {"warmup_steps": max(1, steps // 10)},
            "train": {"steps": steps, "batch_size": s["batch"], "eval_every": s["eval_every"],
                      "eval_batches": s["eval_batches"], "diag_every": 0, **(growth if grow_at else {})}}


def models(s: Mapping[str, Any]) -> list[Model]:
    """Scratch (the deep model for ``steps``) and grown (equal FLOPs), each tuned on its own grid."""
    steps, grow_at = grown_schedule(s)
    deep, small = flops_per_token(s, s["depth"]), flops_per_token(s, s["small_depth"])
    return [Model("scratch", f"{s['depth']} blocks from scratch", run_config(s, s["depth"], s["steps"]), s["lrs"],
                  attrs={"steps": s["steps"], "grow_at": None, "flops_before": deep, "flops_after": deep}),
            Model("grown", f"{s['small_depth']} → {s['depth']} blocks at step {grow_at}",
                  run_config(s, s["small_depth"], steps, grow_at), s["lrs"],
                  attrs={"steps": steps, "grow_at": grow_at, "flops_before": small, "flops_after": deep})]


def log(r: Mapping[str, Any]) -> dict[str, Any]:
    """Kept per run: the validation curve [[step, loss]], from which the rule reads the compute to a loss."""
    return {"val_curve": r["val_curve"]}


def compute_at(attrs: Mapping[str, Any], step: float) -> float:
    """Training FLOPs per token-of-a-step after ``step`` steps: F_before per step up to the growth, F_after after."""
    g = attrs["grow_at"] or 0
    return attrs["flops_before"] * min(step, g) + attrs["flops_after"] * max(step - g, 0)


def compute_to_reach(attrs: Mapping[str, Any], curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The compute at which ``curve`` (validation [[step, loss]]) first reaches ``target``, linear in compute
    between the evaluations around the crossing; None if it never does."""
    prev = None
    for step, loss in curve:
        c = compute_at(attrs, step)
        if loss <= target:
            if prev is None or prev[1] == loss:
                return c
            return prev[0] + (c - prev[0]) * (prev[1] - target) / (prev[1] - loss)
        prev = (c, loss)
    return None


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per scored seed: the grown run's compute to scratch's final loss, as a fraction of scratch's compute (None:
    never reached); and both totals."""
    m = summary["models"]
    out: dict[str, Any] = {"fractions": [], "seeds": []}
    if not (m["scratch"]["scored"] and m["grown"]["scored"]):
        return out
    sc, gr = m["scratch"]["scored"][0], m["grown"]["scored"][0]
    total = compute_at(m["scratch"]["attrs"], m["scratch"]["attrs"]["steps"])
    out["scratch_compute"] = total
    out["grown_compute"] = compute_at(m["grown"]["attrs"], m["grown"]["attrs"]["steps"])
    for seed, final in zip(sc["seeds"], sc["final_loss"]):
        if seed not in gr["seeds"]:
            continue
        reached = compute_to_reach(m["grown"]["attrs"], gr["logged"]["val_curve"][gr["seeds"].index(seed)], final)
        out["seeds"].append(seed)
        out["fractions"].append(None if reached is None else reached / total)
    return out


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    m = summary["models"]
    return verdicts.growth(tuned(m["scratch"]), tuned(m["grown"]), summary["results"]["fractions"])


def table(summary: Mapping[str, Any]) -> Table:
    rows = []
    for e in summary["models"].values():
        a = e["attrs"]
        for b in e["scored"]:
            rows.append([e["label"], lr_text(e), a["steps"], "–" if a["grow_at"] is None else a["grow_at"],
                         f"{compute_at(a, a['steps']) / summary['results'].get('scratch_compute', 1):.3f}",
                         stat_text(b["final_val_loss"]), f"{np.mean(b['unigram']):.3f}"])
    return Table(["model", "lr (tuning seed)", "steps", "grown at", "compute / scratch's", "final val loss",
                  "unigram"], rows)


def notes(summary: Mapping[str, Any]) -> str:
    r = summary["results"]
    parts = [f"seed {s}: " + ("never" if f is None else f"{f:.3f}") for s, f in zip(r["seeds"], r["fractions"])]
    return ("Compute at which the grown run first reaches scratch's final loss on the same seed, as a fraction of "
            "scratch's compute: " + ("; ".join(parts) or "no scored pair") + ".")


def setup(summary: Mapping[str, Any]) -> str:
    s, m = summary["sizes"], summary["models"]
    g = m["grown"]["attrs"]
    where = "every block" if s["every"] == 1 else f"every {s['every']}th block"
    return (f"Causal LM on the `pydoc` corpus, BPE vocab {VOCAB}, seq {s['seq']}, batch {s['batch']}; Pre-LN "
            f"decoders of width {s['width']}, {s['heads']} heads. Scratch: {s['depth']} blocks "
            f"({m['scratch']['params']:,} parameters), {s['steps']} steps. Grown: {s['small_depth']} blocks "
            f"({m['grown']['params']:,} parameters) for {g['grow_at']} steps, then {s['depth']} blocks (mode "
            f"`{s['mode']}`, new blocks after {where}) to step {g['steps']}: equal training FLOPs "
            f"({g['flops_before']:.3g} and {g['flops_after']:.3g} FLOPs per token before and after the growth). "
            f"AdamW, 10 % warmup then cosine decay over each run, grad clip 1; each model at its own lr from "
            f"{list(s['lrs'])} on tuning seed {summary['tuning_seed']} (not scored); scored seeds {summary['seeds']}.")


def plot(summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """Left: tuning-seed final loss vs lr; right: scored validation loss vs training compute (the growth marked)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.3))
    for i, (key, e) in enumerate(summary["models"].items()):
        a.plot(e["lr_grid"], e["tuning"]["loss"], "o-", ms=3, color=f"C{i}", label=e["label"])
        for j, r in enumerate(x for x in data[key] if x["role"] == "scored"):
            if r["val_curve"]:
                steps, loss = zip(*r["val_curve"])
                b.plot([compute_at(e["attrs"], t) for t in steps], loss, color=f"C{i}", lw=1,
                       label=e["label"] if j == 0 else None)
        if e["attrs"]["grow_at"]:
            b.axvline(compute_at(e["attrs"], e["attrs"]["grow_at"]), color=f"C{i}", ls=":", lw=0.8)
    log_ticks(a, [lr for e in summary["models"].values() for lr in e["lr_grid"]])
    a.set(xlabel="peak lr", ylabel="final val loss, tuning seed", title="lr grids")
    b.set(xlabel="training FLOPs per token, summed over the steps so far", ylabel="validation loss (nats)",
          title="scored runs (dotted: growth)")
    for ax in (a, b):
        ax.legend(fontsize=7)
    return fig


CLAIM = Claim(
    name="growth", title="growing depth during training saves compute",
    claim=("(Staged Training, Shen et al. 2022; LLaMA Pro, Wu et al. 2024): a model grown in depth during training "
           "reaches the loss of the same deep model trained from scratch for less compute."),
    full=FULL, quick=QUICK, models=models, rule=rule, setup=setup, table=table, plot=plot, derive=derive,
    log=log, notes=notes)
