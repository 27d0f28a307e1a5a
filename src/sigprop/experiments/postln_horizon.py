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

from typing import Any, Mapping

from ..diagnostics.shortcut import shortcut_deficit
from ..train.levels import TRAIN_MARGIN
from . import dslm_depth, verdicts
from .claim import LR, MODEL, Claim, Model, grad_stats, lr_panel, seeds_cell, tuned, val_panel

FULL = {"depth": 192, "width": 64, "heads": 4, "seq": 32, "batch": 8, "steps": 2000, "warmup": 500,
        "lrs": (3e-5, 1e-4, 3e-4, 1e-3), "seeds": (0,), "eval_every": 100, "jobs": 1}
QUICK = {"depth": 6, "width": 16, "heads": 2, "seq": 16, "batch": 4, "steps": 16, "warmup": 4, "lrs": (1e-3, 1e-2),
         "eval_every": 4}
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
    """`grad_stats`, whether the run is still improving (`verdicts.improving`), and log10 of the product
    of all shortcut factors (top to bottom, −`shortcut_deficit`) at the first and the last evaluation."""
    factors = r.get("shortcut_factors") or []
    return {**grad_stats(r), "improving": verdicts.improving(r["val_curve"], r["steps_done"]),
            "shortcut_log10": [[step, -shortcut_deficit(fs)] for step, fs in (factors[:1] + factors[-1:])]}


def _entry(e: Mapping[str, Any]) -> dict[str, Any]:
    """A model entry as `verdicts.postln_horizon` reads it: `tuned`, with ``improving`` per scored seed."""
    return {**tuned(e), "improving": e["scored"][0]["logged"]["improving"] if e["scored"] else []}


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.postln_horizon` on the four models (Admin as the further Post-LN model, DSLM Pre-LN the reference)."""
    m, s = {k: _entry(e) for k, e in summary["models"].items()}, summary["sizes"]
    return verdicts.postln_horizon(m["dslm-postln"], m["standard-postln"], {"Admin Post-LN": m["admin-profile"]},
                                   m["dslm-preln"], s["steps"], s["warmup"])


def block_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """Each block's gradient norm at the last evaluation of each model's first scored run."""
    for i, e in enumerate(summary["models"].values()):
        g = e["scored"][0]["logged"]["block_grads"][0] if e["scored"] else None
        if g:
            ax.semilogy(g["last"], color=f"C{i}", label=f"{e['label']}, step {g['last_step']}")
    ax.set(xlabel="block (bottom → top)", ylabel="gradient norm, last evaluation")


CLAIM = Claim(
    name="dslm-postln-horizon", title="192-layer Post-LN in the papers' regime: long warmup, long horizon",
    claim=("(DeepScaleLM, Kedia et al. 2024; Admin, Liu et al. 2020): trained as these papers train Post-LN — "
           "thousands of steps, a long warmup, small peak lrs — a 192-layer Post-LN model trains with DSLM's "
           "initialization where the standard one does not."),
    full=FULL, quick=QUICK, models=models, rule=rule, log=log, plot=[lr_panel, val_panel, block_panel],
    setup=("decoder of {s[depth]} layers, width {s[width]}, {s[heads]} heads, seq {s[seq]}, batch {s[batch]}, causal "
           "LM on the embedded corpus; {s[steps]} steps, warmup {s[warmup]}, cosine decay, clip 1.0; each model at its "
           "own lr, tuned on seed {t}, scored on seeds {s[seeds]}; a run trains if it ends ≥ " + f"{TRAIN_MARGIN}"
           " nats below its unigram loss."),
    table=[MODEL, LR, ("final loss", seeds_cell("final_loss")), ("unigram", seeds_cell("unigram")),
           ("still improving", seeds_cell("improving", lambda x: "yes" if x else "no")),
           ("log10 Π shortcut factors first → last", seeds_cell("shortcut_log10", lambda run: " → ".join(
               f"{x[1]:.1f}" for x in run) or "–")),
           ("grad norm first → last", seeds_cell("grad_norm", lambda g: f"{g['first']:.3g} → {g['last']:.3g}"))],
    rules={"horizon-cause": lambda s: verdicts.horizon_cause(
        {k: _entry(e) for k, e in s["models"].items() if k != "dslm-preln"})})
