"""DeepScaleLM's Post-LN at 192 layers in the regime its papers train in: a long warmup, small peak lrs, a long
horizon.

At 300 steps with 10 % warmup and a constant lr (`dslm-depth`) no 192-layer Post-LN model trains here. This claim
asks whether that was the horizon: the models of `dslm-depth` at its sizes (width 64, 4 heads, seq 32, batch 8),
2000 steps with linear warmup over 25 % of them and a cosine decay to 0.1 × the peak; each model tuned on the
tuning seed over a ×3 grid of peak lrs from 3e-5 (extended past an edge that holds the optimum) and scored at its
own lr; seed 1 is added (``--set seeds=[0,1]``) where the verdict hinges on one seed. Every run logs, at each
evaluation, each block's gradient norm and each post-norm sublayer's shortcut factor (``train.block_grads``).
Rule: `sigprop.experiments.verdicts.postln_horizon`, beside it `verdicts.horizon_cause`.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ..train.levels import TRAIN_MARGIN
from . import dslm_depth, verdicts
from .claim import Claim, Model, lr_text, tuned
from .report import Table
from .tuning import MAX_EXTEND, TUNING_SEED

FULL = {"depth": 192, "width": 64, "heads": 4, "seq": 32, "batch": 8, "steps": 2000, "warmup": 500,
        "lrs": (3e-5, 1e-4, 3e-4, 1e-3), "seeds": (0,), "eval_every": 100, "jobs": 1, "max_extend": MAX_EXTEND,
        "tuning_seed": TUNING_SEED}
QUICK = {**FULL, "depth": 6, "width": 16, "heads": 2, "seq": 16, "batch": 4, "steps": 16, "warmup": 4,
         "lrs": (1e-3, 1e-2), "eval_every": 4, "max_extend": 0}
MODELS = {"dslm-postln": ("DSLM Post-LN", "dslm", "postln"), "standard-postln": ("standard Post-LN", "postln", None),
          "admin-profile": ("Admin Post-LN (profile)", "admin", None), "dslm-preln": ("DSLM Pre-LN", "dslm", "preln")}


def models(s: Mapping[str, Any]) -> list[Model]:
    """The four 192-layer decoders of `MODELS`, each tuned and scored at its own lr."""
    out = []
    for key, (label, scheme, norm) in MODELS.items():
        t = dslm_depth.admin_run_config(s, "profile") if scheme == "admin" else \
            dslm_depth.run_config(s, scheme, norm, s["depth"])
        t = {**t, "optim": {"warmup_steps": s["warmup"], "decay": "cosine"}}
        out.append(Model(key, label, t, s["lrs"], attrs={"scheme": scheme, "norm": norm or scheme}))
    return out


def log(r: Mapping[str, Any]) -> dict[str, Any]:
    """`dslm_depth.grad_stats`, whether the run is still improving (`verdicts.improving`), and log10 of the product
    of all shortcut factors (top to bottom) at the first and the last evaluation."""
    factors = r.get("shortcut_factors") or []
    product = lambda fs: sum(math.log10(f) for f in fs)
    return {**dslm_depth.grad_stats(r), "improving": verdicts.improving(r["val_curve"], r["steps_done"]),
            "shortcut_log10": [[step, product(fs)] for step, fs in (factors[:1] + factors[-1:])]}


def _entry(e: Mapping[str, Any]) -> dict[str, Any]:
    return {**tuned(e), "improving": e["scored"][0]["logged"]["improving"] if e["scored"] else []}


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    m, s = {k: _entry(e) for k, e in summary["models"].items()}, summary["sizes"]
    return verdicts.postln_horizon(m["dslm-postln"], m["standard-postln"], {"Admin Post-LN": m["admin-profile"]},
                                   m["dslm-preln"], s["steps"], s["warmup"])


def table(summary: Mapping[str, Any]) -> Table:
    """One row per model: lr, final loss against unigram, still improving, shortcut attenuation, gradient norms."""
    rows = []
    for e in summary["models"].values():
        b = e["scored"][0] if e["scored"] else None
        lg = b["logged"] if b else {}
        att = " · ".join(" → ".join(f"{x[1]:.1f}" for x in run) or "–" for run in lg.get("shortcut_log10", []))
        rows.append([e["label"], lr_text(e), " · ".join(f"{x:.3f}" for x in b["final_loss"]) if b else "–",
                     " · ".join(f"{u:.3f}" for u in b["unigram"]) if b else "–",
                     " · ".join("yes" if x else "no" for x in lg.get("improving", [])) or "–", att or "–",
                     " · ".join(f"{g['first']:.3g} → {g['last']:.3g}" for g in lg.get("grad_norm", [])) or "–"])
    return Table(["model", "lr (tuning seed)", "final loss", "unigram", "still improving",
                  "log10 Π shortcut factors first → last", "grad norm first → last"], rows)


def setup(summary: Mapping[str, Any]) -> str:
    s = summary["sizes"]
    return (f"decoder of {s['depth']} layers, width {s['width']}, {s['heads']} heads, seq {s['seq']}, batch "
            f"{s['batch']}, causal LM on the embedded corpus; {s['steps']} steps, warmup {s['warmup']}, cosine decay, "
            f"clip 1.0; each model at its own lr, tuned on seed {summary['tuning_seed']}, scored on seeds "
            f"{s['seeds']}; a run trains if it ends ≥ {TRAIN_MARGIN} nats below its unigram loss.")


def plot(summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """Tuning loss vs lr; scored validation curves; each block's gradient norm at the last evaluation."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, (key, e) in enumerate(summary["models"].items()):
        a.plot(e["lr_grid"], e["tuning"]["loss"], "o-", ms=3, color=f"C{i}", label=e["label"])
        for r in (x for x in data[key] if x["role"] == "scored"):
            if r["val_curve"]:
                b.plot(*zip(*r["val_curve"]), color=f"C{i}", label=f"{e['label']}, lr {r['lr']:g}")
        g = e["scored"][0]["logged"]["block_grads"][0] if e["scored"] else None
        if g:
            c.semilogy(g["last"], color=f"C{i}", label=f"{e['label']}, step {g['last_step']}")
    a.set(xscale="log", xlabel="peak lr", ylabel="final val loss, tuning seed")
    b.set(xlabel="step", ylabel="validation loss (nats/token)")
    c.set(xlabel="block (bottom → top)", ylabel="gradient norm, last evaluation")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    return fig


CLAIM = Claim(
    name="dslm-postln-horizon", title="192-layer Post-LN in the papers' regime: long warmup, long horizon",
    claim=("(DeepScaleLM, Kedia et al. 2024; Admin, Liu et al. 2020): trained as these papers train Post-LN — "
           "thousands of steps, a long warmup, small peak lrs — a 192-layer Post-LN model trains with DSLM's "
           "initialization where the standard one does not."),
    full=FULL, quick=QUICK, models=models, rule=rule, setup=setup, table=table, plot=plot, log=log,
    rules={"horizon-cause": lambda s: verdicts.horizon_cause(
        {k: _entry(e) for k, e in s["models"].items() if k != "dslm-preln"})})
