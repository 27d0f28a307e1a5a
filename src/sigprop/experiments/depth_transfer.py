"""Does the optimal learning rate transfer across depth (and width)? Per scheme, at CPU scale.

Claim (Yang et al., "Tensor Programs VI", ICLR 2024; Bordelon et al., ICLR 2024; Dey et al., "CompleteP",
arXiv 2505.01618; μP: Yang et al., "Tensor Programs V", arXiv 2203.03466): with the depth-μP (α = ½) or
CompleteP (α = 1) residual and Adam rules the best learning rate found on a shallow model is (close to)
the best one for a deep model, and with μP the best one at a narrow width is the best one at a wide
width, whereas under the standard parametrization it moves.

Setup: decoders on the embedded corpus ("pydoc", BPE 512), width 64, 4 heads, depths ``depths``, lr grid
``lrs`` (7 points, ×2 apart), schemes `DEPTH`: standard Pre-LN, Pre-LN + qk-norm + z-loss 1e-4 (Wortsman
et al. 2023, the fair stability baseline), DSLM with Pre-LN, shaped, depth-μP and CompleteP (base depth =
the shallowest depth). Width (`WIDTH`): depth ``width_depth``, widths ``widths`` (head count fixed),
standard vs μP (base width = the narrowest). AdamW, 10 % warmup, cosine decay, clip 1.0, weight decay 0.1;
every point has the same data, steps and batch. Every (scheme, size) runs at every lr of its panel's grid;
when a size's best lr sits at an edge, one lr one grid step beyond that edge is added for every size of the
panel (`sigprop.train.lr_grid.next_lr`), at most ``max_extend`` times.

Rule (fixed before the full run): `sigprop.experiments.verdicts.transfer_status` per panel — η*(size) is
the grid lr of the lowest seed-mean final validation loss (`sigprop.train.sweep_report.summarize`); the
scheme *transfers* if η* at the largest size is within a factor 2 of η* at the smallest, *moves* if further,
*undetermined* if either sits at its grid's edge — and `sigprop.experiments.verdicts.depth_transfer` on
those statuses. LR sensitivity (Wortsman et al.) and transfer regret are reported, not scored.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..train.lr_grid import next_lr
from ..train.schedules import default_warmup
from ..train.seed_stats import seed_stats
from ..train.sweep import SweepSpec, point_tables
from ..train.sweep_report import log_ticks, plot_best_lr, summarize
from . import verdicts
from .claim import Claim, Model
from .report import Table
from .tuning import MAX_EXTEND, TUNING_SEED

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
        "vocab": 512, "max_chars": 200000, "jobs": 2, "max_extend": MAX_EXTEND, "tuning_seed": TUNING_SEED}
QUICK = {**FULL, "depths": (1, 2), "width": 16, "widths": (16, 32), "width_depth": 1, "lrs": (1e-3, 1e-2),
         "steps": 2, "batch": 2, "seq": 8, "vocab": 300, "max_chars": 20000, "jobs": 1, "max_extend": 1}


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


def explain_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """Logged per run: what explains a curve (largest attention logit, smallest attention entropy, median and
    largest pre-clip gradient norm)."""
    return {"max_attn_logit": r["max_attn_logit"], "min_attn_entropy": r["min_attn_entropy"],
            "grad_norm_median": r["grad_norm"]["median"], "grad_norm_max": r["grad_norm"]["max"]}


def _records(entries: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The panel's points as `summarize` reads sweep records (size × lr × seed)."""
    return [{"point": {"size": e["attrs"]["size"], "optim.lr": b["lr"], "seed": seed},
             "config": {"optim": {"lr": b["lr"]}}, "final_val_loss": x,
             "initial_val_loss": init, "diverged": not math.isfinite(x)}
            for e in entries for b in e["scored"]
            for seed, x, init in zip(b["seeds"], b["final_loss"], b["initial_val_loss"]["per_seed"])]


def extend(grid: list[float], points: list[dict[str, Any]]) -> tuple[list[float], str] | None:
    """The lrs that bracket every size's optimum one grid step beyond its edge (None: all inside)."""
    new = set()
    for model in dict.fromkeys(p["model"] for p in points):
        loss = [seed_stats(p["final_val_loss"] for p in points if p["model"] == model and p["lr"] == lr)["mean"]
                for lr in grid]
        step = next_lr(grid, loss)
        if step is not None:
            new.add(step[0])
    if not new:
        return None
    return sorted(new), (f"best lr at an edge of {', '.join(f'{x:g}' for x in grid)}: "
                         f"added {', '.join(f'{x:g}' for x in sorted(new))}")


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per panel: η* and edge per size, status, regret, sensitivity and best loss at the largest size, the
    scored seeds' final losses at each size's η*, what explains the runs; and the unigram level."""
    by_panel: dict[str, list[Mapping[str, Any]]] = {}
    for e in summary["models"].values():
        by_panel.setdefault(e["group"], []).append(e)
    panels = {}
    for key, entries in by_panel.items():
        rep = summarize(_records(entries), "size")
        (p,), groups = rep["panels"], rep["groups"]
        at = lambda e, lr: next((b for b in e["scored"] if b["lr"] == lr), None)
        explain = {}
        for e, g in zip(entries, groups):
            explain[str(e["attrs"]["size"])] = {
                name: [{"lr": lr, "seed": seed, "diverged": not math.isfinite(x),
                        **{k: v[i] for k, v in b["logged"].items()}}
                       for i, (seed, x) in enumerate(zip(b["seeds"], b["final_loss"]))]
                for name, lr in (("largest_lr", g["lrs"][-1]), ("best_lr", g["best_lr"])) if lr is not None
                for b in [at(e, lr)]}
        panels[key] = {"panel": entries[0]["attrs"]["panel"], "name": entries[0]["attrs"]["name"],
                       "axis": entries[0]["attrs"]["axis"], **{k: p[k] for k in ("sizes", "best_lr", "edge")},
                       "transfer_regret": p["transfer_regret"], "best_lr_ratio": p["best_lr_ratio"],
                       "status": verdicts.transfer_status(p["best_lr"], p["edge"]),
                       "sensitivity_largest": groups[-1]["sensitivity"], "best_loss_largest": groups[-1]["best_loss"],
                       "final_loss": {str(e["attrs"]["size"]): at(e, g["best_lr"])["final_loss"]
                                      if g["best_lr"] else [] for e, g in zip(entries, groups)},
                       "lr_grid": entries[0]["lr_grid"], "extended": entries[0]["extended"],
                       "seeds": entries[0]["scored"][0]["seeds"], "explain": explain, "groups": groups}
    first = next(iter(summary["models"].values()))["scored"][0]["unigram"]
    return {"panels": panels, "unigram_val_loss": float(np.mean(first))}


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.depth_transfer` on every panel's `transfer_status`."""
    panels = summary["results"]["panels"].values()
    return verdicts.depth_transfer({p["name"]: p["status"] for p in panels if p["axis"] == "depth"},
                                   {p["name"]: p["status"] for p in panels if p["axis"] == "width"})


def table(summary: Mapping[str, Any]) -> Table:
    u, rows = summary["results"]["unigram_val_loss"], []
    for p in summary["results"]["panels"].values():
        grid = p["lr_grid"]
        lrs = " → ".join("div." if v is None else f"{v:.3g}" + ("⚠" if e else "")
                         for v, e in zip(p["best_lr"], p["edge"]))
        rows.append([p["axis"], p["name"], lrs, p["best_lr_ratio"], p["status"],
                     f"{p['best_loss_largest']:.3f} ({p['best_loss_largest'] - u:+.3f})",
                     f"{p['sensitivity_largest']:.3f}",
                     f"{p['transfer_regret']:.3f}", f"{grid[0]:.3g}–{grid[-1]:.3g} ({len(grid)})"])
    return Table(["sweep", "scheme", "η* by size", "η* largest/smallest", "status", "best loss, largest (− unigram)",
                  "LR sensitivity (largest)", "transfer regret", "lr grid"], rows)


def notes(summary: Mapping[str, Any]) -> str:
    """LR sensitivity ranking, grid extensions, and what the largest size's largest-lr runs ended with."""
    panels = summary["results"]["panels"]
    depth = [p for p in panels.values() if p["axis"] == "depth"]
    ranked = " < ".join(p["panel"] for p in sorted(depth, key=lambda p: p["sensitivity_largest"]))
    ext = [f"{p['panel']}: {'; '.join(p['extended'])}" for p in panels.values() if p["extended"]]
    num = lambda x: "—" if x is None else f"{x:.3g}"
    rows = [[p["axis"], p["panel"], size, f"{r['lr']:g}", r["diverged"], num(r["max_attn_logit"]),
             num(r["min_attn_entropy"]), f"{num(r['grad_norm_median'])} / {num(r['grad_norm_max'])}"]
            for p in panels.values() for size, e in list(p["explain"].items())[-1:] for r in e["largest_lr"]]
    largest = Table(["sweep", "scheme", "size", "lr", "diverged", "max logit", "min entropy", "grad norm median / max"],
                    rows, caption="At the largest size, the largest lr of the grid: what the run ended with.")
    return (f"LR sensitivity at the deepest model, lowest first: {ranked}. ⚠ = η* at the grid's edge. "
            "Grid extensions: " + (" — ".join(ext) if ext else "none (every optimum inside the starting grid)")
            + ".\n\n" + largest.markdown())


def setup(summary: Mapping[str, Any]) -> str:
    s = summary["sizes"]
    return (f"decoder, causal LM on `pydoc` (BPE {s['vocab']}), seq {s['seq']}, batch {s['batch']}, {s['steps']} "
            f"AdamW steps (10 % warmup, cosine, clip 1.0, weight decay 0.1), seeds {s['seeds']}; lr grid "
            f"{', '.join(f'{x:.3g}' for x in s['lrs'])}, extended by one ×2 step past an edge that holds a size's "
            f"optimum (up to {s['max_extend']} extensions). Depth: width {s['width']}, depths {s['depths']}. Width: "
            f"depth "
            f"{s['width_depth']}, widths {s['widths']}, 4 heads. Base depth/width = the smallest. Unigram loss of the "
            f"evaluation tokens: {summary['results']['unigram_val_loss']:.3f} nats (a best loss close to it means no "
            "lr trained that model beyond token frequencies, so its η* is weakly determined).")


def plot(summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """Top: η* vs depth and vs width (hollow: at the edge); below: final loss vs lr per panel, one line per size."""
    panels = summary["results"]["panels"]
    fig, axes = plt.subplots(3, 4, figsize=(17, 11))
    for ax, axis in zip(axes[0, :2], ("depth", "width")):
        plot_best_lr({"size": axis, "panels": [p for p in panels.values() if p["axis"] == axis]}, ax)
    for ax in axes[0, 2:]:
        ax.set_visible(False)
    for ax, p in zip(axes[1:].flat, panels.values()):
        for g in p["groups"]:
            ax.plot(g["lrs"], [v if math.isfinite(v) else np.nan for v in g["loss"]], marker="o", ms=3,
                    label=f"{p['axis']} {g['size']}")
        log_ticks(ax, p["groups"][0]["lrs"])
        ax.set(xlabel="learning rate", ylabel="final validation loss", title=p["panel"])
        ax.legend(fontsize=7)
    for ax in axes[1:].flat[len(panels):]:
        ax.set_visible(False)
    return fig


CLAIM = Claim(
    name="depth-transfer", title="does the best learning rate transfer across depth and width?",
    claim=("(Yang et al. TP-VI 2024; Bordelon et al. 2024; Dey et al. 2025, CompleteP; Yang et al. TP-V, μP): with "
           "the depth-μP or CompleteP rules the best lr of a shallow model is the best lr of a deep one, with μP the "
           "best lr of a narrow model is that of a wide one; under the standard rules it moves."),
    full=FULL, quick=QUICK, models=models, rule=rule, setup=setup, table=table, plot=plot, log=explain_row,
    extend=extend, derive=derive, notes=notes)
