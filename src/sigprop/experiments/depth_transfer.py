"""Does the optimal learning rate transfer across depth (and width)? Per scheme, at CPU scale.

Claim (Yang et al., "Tensor Programs VI", ICLR 2024; Bordelon et al., ICLR 2024; Dey et al.,
"CompleteP", arXiv 2505.01618; μP: Yang et al., "Tensor Programs V", arXiv 2203.03466): with the
depth-μP (α = ½) or CompleteP (α = 1) residual and Adam rules the best learning rate found on a
shallow model is (close to) the best one for a deep model, and with μP the best one at a narrow width
is the best one at a wide width, whereas under the standard parametrization it moves.

Setup: `sigprop.train.sweep` grids. Depth: decoders on the embedded corpus ("pydoc", BPE 512),
width 64, 4 heads, depths `FULL["depths"]`, lr grid `FULL["lrs"]` (7 points, ×2 apart), schemes
`VARIANTS`: standard Pre-LN, Pre-LN + qk-norm + z-loss 1e-4 (Wortsman et al. 2023, the fair
stability baseline), DSLM with Pre-LN, shaped, depth-μP and CompleteP (base depth = the shallowest
depth, so their multipliers are 1 there). Width: depth `FULL["width_depth"]`, widths
`FULL["widths"]` (head count fixed, so the head width grows with the width), standard vs μP (base width =
the narrowest). AdamW, 10 % warmup, cosine decay, clip 1.0, weight decay 0.1; every point has the same
data, steps (`FULL["steps"]`) and batch; loss = final validation loss. Grid bracketing (the rule every
claim's lr search follows, `sigprop.experiments.tuning.next_lr`): when a size's best lr sits at an edge
of the grid, one lr beyond that edge (one grid step) is added to the sweep for every size, at most
``max_extend`` times per sweep; each extension is recorded in the summary.

Rule (fixed before the full run): `sigprop.experiments.verdicts.transfer_status` per sweep — η*(size) is
the grid lr with the lowest seed-mean final validation loss at that size (a diverged seed makes the point
+inf); the scheme *transfers* if η* at the largest size is within a factor 2 (one grid step) of η* at the
smallest, *moves* if further, *undetermined* if either sits at the edge of the (extended) grid — and
`sigprop.experiments.verdicts.depth_transfer` on those statuses: "reproduced" if CompleteP and depth-μP
transfer across depth and μP across width while standard Pre-LN moves across depth or the standard
parametrization across width; "partly" if some of those three transfer; "inconclusive" if none transfers
and one is undetermined; "not reproduced" if all three move. LR sensitivity (Wortsman et al.: mean over
the grid of min(loss, loss at init) − best loss, at the largest size) and transfer regret are reported and
ranked, not scored.

    from sigprop.experiments import depth_transfer
    summary = depth_transfer.run("runs/depth-transfer", jobs=2)   # depth-transfer.{json,png,md}
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ..train.sweep import SweepSpec, run_sweep
from ..train.sweep_report import plot_best_lr, plot_loss_vs_lr, summarize
from . import verdicts
from .outputs import WallClock, write_outputs
from .training import resolve_sizes, unigram_by_seed
from .tuning import MAX_EXTEND, next_lr

NAME = "depth-transfer"
VARIANTS: dict[str, dict[str, Any]] = {
    "Pre-LN": {"model.scheme": "preln"},
    "Pre-LN + qk-norm + z-loss": {"model.scheme": "preln", "model.qk_norm": True, "optim.z_loss": 1e-4},
    "DSLM (Pre-LN)": {"model.scheme": "dslm", "model.norm": "preln"},
    "shaped": {"model.scheme": "shaped"},
    "depth-μP": {"model.scheme": "depth_mup"},
    "CompleteP": {"model.scheme": "completep"},
}
WIDTH_VARIANTS: dict[str, dict[str, Any]] = {
    "standard": {"model.parametrization": "standard"},
    "μP": {"model.parametrization": "mup"},
}
LRS = [5e-4 * 2 ** k for k in range(7)]              # 5e-4 … 3.2e-2
FULL = {"depths": [2, 8, 32], "width": 64, "widths": [32, 64, 128, 256], "width_depth": 2,
        "lrs": LRS, "seeds": [0], "steps": 200, "batch": 8, "seq": 32, "vocab": 512, "max_chars": 200000,
        "jobs": 2, "max_extend": MAX_EXTEND}
QUICK = {**FULL, "depths": [1, 2], "width": 16, "widths": [16, 32], "width_depth": 1, "lrs": [1e-3, 1e-2],
         "steps": 2, "batch": 2, "seq": 8, "vocab": 300, "max_chars": 20000, "jobs": 1, "max_extend": 1}


def base_tables(s: dict[str, Any]) -> dict[str, Any]:
    """The run config every point starts from."""
    return {"model": {"arch": "decoder", "vocab_size": s["vocab"], "d_model": s["width"], "n_heads": 4,
                      "max_seq_len": s["seq"], "base_depth": s["depths"][0], "base_width": s["widths"][0]},
            "data": {"source": "pydoc", "seq_len": s["seq"], "max_chars": s["max_chars"]},
            "optim": {"warmup_steps": max(1, s["steps"] // 10)},
            "train": {"steps": s["steps"], "batch_size": s["batch"], "eval_every": 0, "eval_batches": 4}}


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower().replace("μ", "mu")).strip("-")


def transfer_status(panel: dict[str, Any]) -> str:
    """`verdicts.transfer_status` of a `summarize` panel (smallest vs largest size)."""
    return verdicts.transfer_status(panel["best_lr"], panel["edge"])


def judge(summary: dict[str, Any]) -> tuple[str, str]:
    """(verdict, reason): `verdicts.depth_transfer` on a summary's panels (as saved in depth-transfer.json)."""
    panels = summary["panels"]
    return verdicts.depth_transfer({k: transfer_status(panels[k]) for k in VARIANTS},
                                   {k: transfer_status(panels[f"width {k}"]) for k in WIDTH_VARIANTS})


def bracketing_lrs(groups: list[dict[str, Any]]) -> list[float]:
    """The lrs that bracket every group's optimum one grid step beyond its edge (`tuning.next_lr`), sorted;
    empty when every group's best lr is inside its grid."""
    return sorted({step[0] for g in groups if (step := next_lr(g["lrs"], g["loss"])) is not None})


def _sweep(out: Path, label: str, overrides: dict[str, Any], size_values: list[int], size: str,
           s: dict[str, Any], tokenizer: str | None) -> dict[str, Any]:
    """One panel's sweep (size × lr × seed), its grid extended until every size's optimum is inside it
    (at most ``s["max_extend"]`` rounds); the panel's summary, the pinned tokenizer, training time."""
    base = base_tables(s)
    if tokenizer:
        base["data"]["tokenizer"] = tokenizer
    lrs, extended = sorted(s["lrs"]), []
    while True:
        spec = SweepSpec(base, {size: size_values, "optim.lr": lrs, "seed": s["seeds"]}, out / "sweeps" / slug(label),
                         size, overrides)
        records = run_sweep(spec, jobs=s["jobs"], resume=True, progress=s["progress"])
        summary = summarize(records, size)
        new = bracketing_lrs(summary["groups"]) if len(extended) < s["max_extend"] else []
        if not new:
            break
        extended.append(f"best lr at an edge of {', '.join(f'{x:g}' for x in lrs)}: "
                        f"added {', '.join(f'{x:g}' for x in new)}")
        lrs = sorted({*lrs, *new})
    (panel,) = summary["panels"]
    panel["panel"] = label
    for g in summary["groups"]:
        g["panel"] = label
    panel["status"] = transfer_status(panel)
    panel["sensitivity_largest"] = summary["groups"][-1]["sensitivity"]
    panel["best_loss_largest"] = summary["groups"][-1]["best_loss"]
    panel["lr_grid"], panel["extended"], panel["seeds"] = lrs, extended, list(s["seeds"])
    panel["final_loss"] = {str(g["size"]): [r["final_val_loss"] for r in records if r["point"][size] == g["size"]
                                            and r["point"]["optim.lr"] == g["best_lr"]] for g in summary["groups"]}
    panel["explain"] = explain(records, size, summary["groups"])
    return {"summary": summary, "tokenizer": records[0]["config"]["data"]["tokenizer"],
            "wall_s": sum(r["wall_s"] for r in records), "records": records}


def explain(records: list[dict[str, Any]], size: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """What explains a panel's curves, per size at its largest lr and at its best lr (the group's η* from
    `summarize`): the largest attention logit and the smallest attention entropy at the end of training, the
    median and largest pre-clip gradient norm, whether it diverged."""
    row = lambda r: {"lr": r["point"]["optim.lr"], "seed": r["point"]["seed"], "diverged": r["diverged"],
                     "max_attn_logit": r["max_attn_logit"], "min_attn_entropy": r["min_attn_entropy"],
                     "grad_norm_median": r["grad_norm"]["median"], "grad_norm_max": r["grad_norm"]["max"]}
    out: dict[str, Any] = {}
    for g in groups:
        rs = [r for r in records if r["point"][size] == g["size"]]
        out[str(g["size"])] = {name: [row(r) for r in rs if r["point"]["optim.lr"] == lr]
                               for name, lr in (("largest_lr", g["lrs"][-1]), ("best_lr", g["best_lr"]))
                               if lr is not None}
    return out


def markdown(result: dict[str, Any], s: dict[str, Any]) -> str:
    """The section: claim, setup, rule, per-scheme table, what explains the curves, verdict."""
    lines = [f"## {NAME} — does the best learning rate transfer across depth and width?", "",
             "**Claim** (Yang et al. TP-VI 2024; Bordelon et al. 2024; Dey et al. 2025, CompleteP; Yang et al. "
             "TP-V, μP): with the depth-μP or CompleteP rules the best lr of a shallow model is the best lr of a deep "
             "one, with μP the best lr of a narrow model is that of a wide one; under the standard rules it moves.", "",
             f"**Setup:** decoder, causal LM on `pydoc` (BPE {s['vocab']}), seq {s['seq']}, batch {s['batch']}, "
             f"{s['steps']} AdamW steps (10 % warmup, cosine, clip 1.0, weight decay 0.1), seeds {s['seeds']}; lr grid "
             f"{', '.join(f'{x:.3g}' for x in s['lrs'])}, extended by one ×2 step past an edge that holds a size's "
             f"optimum (up to {s['max_extend']} extensions). Depth: width {s['width']}, depths {s['depths']}. Width: "
             f"depth {s['width_depth']}, widths {s['widths']}, 4 heads. Base depth/width = the smallest. Rule "
             "(`verdicts.transfer_status`, `verdicts.depth_transfer`): *transfers* if η* at the largest size is "
             "within 2× of η* at the smallest, *moves* otherwise, *undetermined* if either sits at the grid's edge. "
             "LR sensitivity at the largest size (Wortsman et al. 2023).", "",
             f"Unigram loss of the evaluation tokens (token frequencies, no context): {result['unigram']:.3f} nats; "
             "a best loss close to it means no lr trained that model beyond token frequencies, so its η* is weakly "
             "determined.", "",
             "| sweep | scheme | η* by size | η* largest/smallest | status | best loss, largest (− unigram) "
             "| LR sensitivity (largest) | transfer regret | lr grid |", "|---|---|---|---|---|---|---|---|---|"]
    for kind in ("depth", "width"):
        for label, r in result[kind].items():
            p = r["summary"]["panels"][0]
            lrs = " → ".join("div." if v is None else f"{v:.3g}" + ("⚠" if e else "")
                             for v, e in zip(p["best_lr"], p["edge"]))
            grid = f"{p['lr_grid'][0]:.3g}–{p['lr_grid'][-1]:.3g} ({len(p['lr_grid'])})"
            below = p["best_loss_largest"] - result["unigram"]
            lines.append(f"| {kind} | {label} | {lrs} | {p['best_lr_ratio']:.3g} | {p['status']} | "
                         f"{p['best_loss_largest']:.3f} ({below:+.3f}) | "
                         f"{p['sensitivity_largest']:.3f} | {p['transfer_regret']:.3f} | {grid} |")
    ranked = sorted(result["depth"], key=lambda k: result["depth"][k]["summary"]["panels"][0]["sensitivity_largest"])
    ext = [f"{label}: {'; '.join(r['summary']['panels'][0]['extended'])}" for kind in ("depth", "width")
           for label, r in result[kind].items() if r["summary"]["panels"][0]["extended"]]
    lines += ["", "LR sensitivity at the deepest model, lowest first: " + " < ".join(ranked)
              + ". ⚠ = η* at the grid's edge.",
              "", "Grid extensions: " + (" — ".join(ext) if ext else "none (every optimum inside the starting grid)")
              + ".",
              "", "At the largest size, the largest lr of the grid: what the run ended with "
              "(largest attention logit, smallest attention entropy, median / largest pre-clip gradient norm):", "",
              "| sweep | scheme | size | lr | diverged | max logit | min entropy | grad norm median / max |",
              "|---|---|---|---|---|---|---|---|"]
    num = lambda x: "—" if x is None else f"{x:.3g}"
    for kind in ("depth", "width"):
        for label, r in result[kind].items():
            size, e = list(r["summary"]["panels"][0]["explain"].items())[-1]
            for row in e["largest_lr"]:
                lines.append(f"| {kind} | {label} | {size} | {row['lr']:g} | {row['diverged']} | "
                             f"{num(row['max_attn_logit'])} | {num(row['min_attn_entropy'])} | "
                             f"{num(row['grad_norm_median'])} / {num(row['grad_norm_max'])} |")
    lines += ["", f"**Verdict: {result['verdict']}.** {result['verdict_reason']}", ""]
    return "\n".join(lines)


def run(out_dir: str | Path, quick: bool = False, show_progress: bool = True, **sizes: Any) -> dict[str, Any]:
    """Run the depth and width sweeps (resumable: finished points are kept) and write depth-transfer.{json,png,md}.

    ``sizes`` override `FULL` (or `QUICK`): depths, width, widths, width_depth, lrs, seeds, steps, batch, seq,
    vocab, max_chars, jobs, max_extend. Returns the summary (verdict included)."""
    s = resolve_sizes(QUICK if quick else FULL, sizes)
    out, clock = Path(out_dir), WallClock(out_dir, NAME)
    tokenizer: str | None = None
    depth, width = {}, {}
    run_s = {**s, "progress": show_progress}
    for label, over in VARIANTS.items():
        depth[label] = _sweep(out, label, over, s["depths"], "model.n_layers", run_s, tokenizer)
        tokenizer = depth[label]["tokenizer"]
    for label, over in WIDTH_VARIANTS.items():
        width[label] = _sweep(out, f"width {label}", {**over, "model.n_layers": s["width_depth"]}, s["widths"],
                              "model.d_model", run_s, tokenizer)
    sweeps = {**depth, **{f"width {k}": r for k, r in width.items()}}
    panels = {k: r["summary"]["panels"][0] for k, r in sweeps.items()}
    v, reason = judge({"panels": panels})
    by_seed = unigram_by_seed(depth[next(iter(VARIANTS))]["records"])
    unigram = float(sum(by_seed.values()) / len(by_seed))
    result = {"depth": depth, "width": width, "verdict": v, "verdict_reason": reason, "unigram": unigram}
    summary = {"verdict": v, "verdict_reason": reason, "seeds": list(s["seeds"]), "sizes": s, "panels": panels,
               "unigram_val_loss": unigram,
               "wall_s": clock.seconds(),
               "points_s": round(sum(r["wall_s"] for r in sweeps.values()), 1)}
    data = {k: r["summary"]["groups"] for k, r in sweeps.items()}
    combined = {"size": "size", "groups": [g for rows in data.values() for g in rows],
                "panels": list(summary["panels"].values())}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (kind, axis) in zip(axes, (("depth", "depth (blocks)"), ("width", "width"))):
        labels = [k for k in depth] if kind == "depth" else [f"width {k}" for k in width]
        plot_best_lr({"size": axis, "panels": [panels[k] for k in labels]}, ax)
        ax.set_title(f"optimal lr vs {kind} (hollow: at the grid's edge)")
    fig.tight_layout()
    fig.savefig(out / f"{NAME}-best-lr.png", dpi=100)
    plt.close(fig)
    return write_outputs(out, NAME, data, summary, markdown(result, s), plot_loss_vs_lr(combined, ncols=4))
