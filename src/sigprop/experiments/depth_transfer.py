"""Does the optimal learning rate transfer across depth (and width)? Every (scheme, size) at every lr of its panel's
grid, bracketed for every size (`sigprop.experiments.claim.bracket`); η*(size): the grid lr of the lowest seed-mean
final loss (`sigprop.experiments.claim.sweep_summary`); a scheme *transfers* if η* at the largest size is within a
factor 2 of η* at the smallest (`verdicts.transfer_status`). Rule: `sigprop.experiments.verdicts.depth_transfer`."""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Mapping

import numpy as np

from ..train.schedules import default_warmup
from ..train.sweep import SweepSpec, point_tables
from ..train.sweep_report import plot_best_lr
from . import verdicts
from .claim import Claim, Model, blocks_panel, bracket, by_group, explain_log, sweep_summary
from .report import Table

# panel key -> (display label, name the rule reads, overrides); depth panels, then width panels
DEPTH = {"preln": ("Pre-LN", {"model.scheme": "preln"}),
         "preln-qk-norm-z-loss": ("Pre-LN + qk-norm + z-loss", {"model.scheme": "preln", "model.qk_norm": True,
                                                                "optim.z_loss": 1e-4}),
         "dslm-preln": ("DSLM (Pre-LN)", {"model.scheme": "dslm", "model.norm_placement": "pre"}),
         "shaped": ("shaped", {"model.scheme": "shaped"}),
         "depth-mup": ("depth-μP", {"model.scheme": "depth_mup"}),
         "completep": ("CompleteP", {"model.scheme": "completep"})}
WIDTH = {"width-standard": ("standard", {"model.parametrization": "standard"}),
         "width-mup": ("μP", {"model.parametrization": "mup"})}
FULL = {"depths": (2, 8, 32), "width": 64, "widths": (32, 64, 128, 256), "width_depth": 2,
        "lrs": tuple(5e-4 * 2 ** k for k in range(7)), "seeds": (0,), "steps": 200, "batch": 8, "seq": 32,
        "vocab": 512, "max_chars": 200000}
QUICK = {"depths": (1, 2), "width": 16, "widths": (16, 32), "width_depth": 1, "lrs": (1e-3, 1e-2), "steps": 2,
         "batch": 2, "seq": 8, "vocab": 300, "max_chars": 20000, "max_extend": 1}


def base_run_config(s: Mapping[str, Any]) -> dict[str, Any]:
    """The run config every point starts from."""
    return {"model": {"arch": "decoder", "vocab_size": s["vocab"], "d_model": s["width"], "n_heads": 4,
                      "max_seq_len": s["seq"], "base_depth": s["depths"][0], "base_width": s["widths"][0]},
            "data": {"source": "pydoc", "seq_len": s["seq"], "max_chars": s["max_chars"]},
            "optim": {"warmup_steps": default_warmup(s["steps"])},
            "train": {"steps": s["steps"], "batch_size": s["batch"], "eval_every": 0, "eval_batches": 4}}


def models(s: Mapping[str, Any]) -> list[Model]:
    """One model per (panel, size), every lr of the panel's grid for every seed."""
    out = []
    for axis, variants, key, values, fixed in (("depth", DEPTH, "model.n_layers", s["depths"], {}),
                                               ("width", WIDTH, "model.d_model", s["widths"],
                                                {"model.n_layers": s["width_depth"]})):
        for panel, (name, over) in variants.items():
            label = name if axis == "depth" else f"width {name}"
            spec = SweepSpec(base_run_config(s), {}, ".", None, {**over, **fixed})
            out += [Model(f"{panel}/{n}", f"{label}, {axis} {n}", point_tables(spec, {key: n}), s["lrs"],
                          group=panel, tune=False, attrs={"axis": axis, "panel": label, "name": name, "size": n})
                    for n in values]
    return out


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per panel: η* and edge per size, status, regret, sensitivity and best loss at the largest size, and per size
    what the runs at the largest lr ended with; and the unigram level."""
    panels = {}
    for key, entries in by_group(summary).items():
        rep = sweep_summary(entries)
        (p,), groups, a = rep["panels"], rep["groups"], entries[0]
        top = [[b for b in e["scored"] if b["lr"] == g["lrs"][-1]] for e, g in zip(entries, groups)]
        panels[key] = {**{k: a["attrs"][k] for k in ("panel", "name", "axis")},
                       **{k: p[k] for k in ("sizes", "best_lr", "edge", "transfer_regret", "best_lr_ratio")},
                       "status": verdicts.transfer_status(p["best_lr"], p["edge"]),
                       "sensitivity_largest": groups[-1]["sensitivity"], "best_loss_largest": groups[-1]["best_loss"],
                       "lr_grid": a["lr_grid"], "extended": a["extended"], "seeds": a["scored"][0]["seeds"],
                       "explain": {str(e["attrs"]["size"]): {"largest_lr": [
                           {"lr": b["lr"], "seed": seed, "diverged": not math.isfinite(x),
                            **{k: v[i] for k, v in b["logged"].items()}}
                           for b in bs for i, (seed, x) in enumerate(zip(b["seeds"], b["final_loss"]))]}
                           for e, bs in zip(entries, top)}}
    first = next(iter(summary["models"].values()))["scored"][0]["unigram"]
    return {"panels": panels, "unigram_val_loss": float(np.mean(first))}


def table(summary: Mapping[str, Any]) -> Table:
    """One row per panel: η* by size, its ratio and status; best loss, sensitivity and regret at the largest size."""
    u, panels = summary["results"]["unigram_val_loss"], summary["results"]["panels"].values()
    ext = " — ".join(f"{p['panel']}: {'; '.join(p['extended'])}" for p in panels if p["extended"])
    return Table(["sweep", "scheme", "η* by size", "η* largest/smallest", "status", "best loss, largest (− unigram)",
                  "LR sensitivity (largest)", "transfer regret"],
                 [[p["axis"], p["name"], " → ".join("div." if v is None else f"{v:.3g}" + "⚠" * e
                                                    for v, e in zip(p["best_lr"], p["edge"])),
                   p["best_lr_ratio"], p["status"], f"{p['best_loss_largest']:.3f} ({p['best_loss_largest'] - u:+.3f})",
                   f"{p['sensitivity_largest']:.3f}", f"{p['transfer_regret']:.3f}"] for p in panels],
                 caption=f"⚠ = η* at the grid's edge. Grid extensions: {ext or 'none'}.")


def eta_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any], axis: str) -> None:
    """η* against ``axis`` ("depth" | "width"), one line per panel (hollow: at the grid's edge)."""
    plot_best_lr({"size": axis, "panels": [p for p in summary["results"]["panels"].values() if p["axis"] == axis]}, ax)


def largest_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """Final loss against lr at each panel's largest size."""
    blocks_panel(ax, summary, data, models=[f"{g}/{es[-1]['attrs']['size']}" for g, es in by_group(summary).items()],
                 title="largest size of each panel")


CLAIM = Claim(
    name="depth-transfer", title="does the best learning rate transfer across depth and width?",
    claim=("(Yang et al. TP-VI 2024; Bordelon et al. 2024; Dey et al. 2025, CompleteP; Yang et al. TP-V, μP): with "
           "the depth-μP or CompleteP rules the best lr of a shallow model is the best lr of a deep one, with μP the "
           "best lr of a narrow model is that of a wide one; under the standard rules it moves."),
    full=FULL, quick=QUICK, models=models, log=explain_log, extend=bracket, derive=derive, table=table,
    rule=lambda s: verdicts.depth_transfer(*({p["name"]: p["status"] for p in s["results"]["panels"].values()
                                             if p["axis"] == axis} for axis in ("depth", "width"))),
    setup=("decoder, causal LM on `pydoc` (BPE {s[vocab]}), seq {s[seq]}, batch {s[batch]}, {s[steps]} AdamW steps "
           "(10 % warmup, cosine, clip 1.0, weight decay 0.1), seeds {s[seeds]}; lr grid {s[lrs]} (up to "
           "{s[max_extend]} extensions). Depth: width {s[width]}, depths {s[depths]}. Width: depth {s[width_depth]}, "
           "widths {s[widths]}, 4 heads. Unigram loss: {r[unigram_val_loss]:.3f} nats (a best loss close to it: η* "
           "weakly determined)."),
    plot=[partial(eta_panel, axis="depth"), partial(eta_panel, axis="width"), largest_panel])
