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
`FULL["widths"]`, standard vs μP (base width = the narrowest). AdamW, 10 % warmup, cosine decay,
clip 1.0, weight decay 0.1; every point has the same data, steps and batch; loss = final validation loss.

Rule (fixed before the full run). Per scheme, η*(size) is the grid lr with the lowest seed-mean final
validation loss at that size (a diverged seed makes the point +inf). The scheme *transfers* if η* at
the largest size is within a factor 2 (one grid step) of η* at the smallest size, *moves* if it is
further; the test is *undetermined* if either of those η* sits at the edge of the grid (the optimum may
lie outside it). Verdict on the claim: "reproduced" if CompleteP and depth-μP transfer across depth,
μP transfers across width, and standard Pre-LN moves across depth or the standard parametrization
moves across width; "partly" if at least one of CompleteP, depth-μP, μP transfers; "not reproduced"
otherwise. LR sensitivity (Wortsman et al.: mean over the grid of min(loss, loss at init) − best
loss, at the largest size) and transfer regret are reported and ranked, not scored.

    from sigprop.experiments import depth_transfer
    summary = depth_transfer.run("runs/depth-transfer", jobs=2)   # depth-transfer.{json,png,md}
"""
from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..train.sweep import SweepSpec, run_sweep  # noqa: E402
from ..train.sweep_report import plot_best_lr, plot_loss_vs_lr, summarize  # noqa: E402
from .outputs import write_outputs  # noqa: E402

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
FULL = {"depths": [2, 8, 32], "width": 64, "widths": [32, 64, 128], "width_depth": 2,
        "lrs": LRS, "seeds": [0], "steps": 30, "batch": 8, "seq": 32, "vocab": 512, "max_chars": 200000,
        "jobs": 2}
QUICK = {**FULL, "depths": [1, 2], "width": 16, "widths": [16, 32], "width_depth": 1, "lrs": [1e-3, 1e-2],
         "steps": 2, "batch": 2, "seq": 8, "vocab": 300, "max_chars": 20000, "jobs": 1}


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
    """"transfers" | "moves" | "undetermined" for a panel of `summarize` (smallest vs largest size), by the rule."""
    lo, hi = panel["best_lr"][0], panel["best_lr"][-1]
    if lo is None or hi is None or panel["edge"][0] or panel["edge"][-1]:
        return "undetermined"
    return "transfers" if abs(math.log2(hi / lo)) <= 1 + 1e-9 else "moves"


def verdict(depth: dict[str, str], width: dict[str, str]) -> tuple[str, str]:
    """The module's rule on the per-scheme statuses (``depth``: VARIANTS labels, ``width``: WIDTH_VARIANTS)."""
    good = [depth["CompleteP"], depth["depth-μP"], width["μP"]]
    baseline_moves = depth["Pre-LN"] == "moves" or width["standard"] == "moves"
    if all(x == "transfers" for x in good) and baseline_moves:
        v = "reproduced"
    elif any(x == "transfers" for x in good):
        v = "partly"
    else:
        v = "not reproduced"
    reason = ("depth: " + ", ".join(f"{k} {x}" for k, x in depth.items()) +
              "; width: " + ", ".join(f"{k} {x}" for k, x in width.items()) + ".")
    return v, reason


def _sweep(out: Path, label: str, overrides: dict[str, Any], grid: dict[str, list], size: str,
           s: dict[str, Any], tokenizer: str | None) -> dict[str, Any]:
    base = base_tables(s)
    if tokenizer:
        base["data"]["tokenizer"] = tokenizer
    spec = SweepSpec(base, grid, out / "sweeps" / slug(label), size, overrides)
    records = run_sweep(spec, jobs=s["jobs"], resume=True)
    summary = summarize(records, size)
    (panel,) = summary["panels"]
    panel["panel"] = label
    for g in summary["groups"]:
        g["panel"] = label
    panel["status"] = transfer_status(panel)
    panel["sensitivity_largest"] = summary["groups"][-1]["sensitivity"]
    return {"summary": summary, "tokenizer": records[0]["config"]["data"]["tokenizer"],
            "wall_s": sum(r["wall_s"] for r in records)}


def markdown(result: dict[str, Any], s: dict[str, Any]) -> str:
    """The section: claim, setup, rule, per-scheme table, verdict."""
    lines = [f"## {NAME} — does the best learning rate transfer across depth and width?", "",
             "**Claim** (Yang et al. TP-VI 2024; Bordelon et al. 2024; Dey et al. 2025, CompleteP; Yang et al. "
             "TP-V, μP): with the depth-μP or CompleteP rules the best lr of a shallow model is the best lr of a deep "
             "one, with μP the best lr of a narrow model is that of a wide one; under the standard rules it moves.", "",
             f"**Setup:** decoder, causal LM on `pydoc` (BPE {s['vocab']}), seq {s['seq']}, batch {s['batch']}, "
             f"{s['steps']} AdamW steps (10 % warmup, cosine, clip 1.0, weight decay 0.1), seeds {s['seeds']}; lr grid "
             f"{', '.join(f'{x:.3g}' for x in s['lrs'])}. Depth: width {s['width']}, depths {s['depths']}. Width: "
             f"depth {s['width_depth']}, widths {s['widths']}. Base depth/width = the smallest. Rule: *transfers* if "
             "η* at the largest size is within 2× of η* at the smallest, *moves* otherwise, *undetermined* if either "
             "sits at the grid's edge. LR sensitivity at the largest size (Wortsman et al. 2023).", "",
             "| sweep | scheme | η* by size | η* largest/smallest | status | LR sensitivity (largest) | transfer regret |",
             "|---|---|---|---|---|---|---|"]
    for kind, key in (("depth", "depth"), ("width", "width")):
        for label, r in result[key].items():
            p = r["summary"]["panels"][0]
            lrs = " → ".join("div." if v is None else f"{v:.3g}" + ("⚠" if e else "") for v, e in zip(p["best_lr"], p["edge"]))
            lines.append(f"| {kind} | {label} | {lrs} | {p['best_lr_ratio']:.3g} | {p['status']} | "
                         f"{p['sensitivity_largest']:.3f} | {p['transfer_regret']:.3f} |")
    ranked = sorted(result["depth"], key=lambda k: result["depth"][k]["summary"]["panels"][0]["sensitivity_largest"])
    lines += ["", "LR sensitivity at the deepest model, lowest first: " + " < ".join(ranked) + ". ⚠ = η* at the grid's edge.",
              "", f"**Verdict: {result['verdict']}.** {result['verdict_reason']}", ""]
    return "\n".join(lines)


def run(out_dir: str | Path, quick: bool = False, **sizes: Any) -> dict[str, Any]:
    """Run the depth and width sweeps (resumable: finished points are kept) and write depth-transfer.{json,png,md}.

    ``sizes`` override `FULL` (or `QUICK`): depths, width, widths, width_depth, lrs, seeds, steps, batch, seq,
    vocab, max_chars, jobs. Returns the summary (verdict included)."""
    base = QUICK if quick else FULL
    unknown = sorted(set(sizes) - set(base))
    if unknown:
        raise ValueError(f"unknown size(s) {unknown}; valid: {sorted(base)}")
    s = {**base, **sizes}
    out, start = Path(out_dir), time.perf_counter()
    tokenizer: str | None = None
    depth, width = {}, {}
    for label, over in VARIANTS.items():
        depth[label] = _sweep(out, label, over, {"model.n_layers": s["depths"], "optim.lr": s["lrs"], "seed": s["seeds"]},
                              "model.n_layers", s, tokenizer)
        tokenizer = depth[label]["tokenizer"]
    for label, over in WIDTH_VARIANTS.items():
        width[label] = _sweep(out, f"width {label}", {**over, "model.n_layers": s["width_depth"]},
                              {"model.d_model": s["widths"], "optim.lr": s["lrs"], "seed": s["seeds"]},
                              "model.d_model", s, tokenizer)
    v, reason = verdict({k: r["summary"]["panels"][0]["status"] for k, r in depth.items()},
                        {k: r["summary"]["panels"][0]["status"] for k, r in width.items()})
    result = {"depth": depth, "width": width, "verdict": v, "verdict_reason": reason}
    summary = {"verdict": v, "verdict_reason": reason, "seeds": list(s["seeds"]), "sizes": s,
               "panels": {k: r["summary"]["panels"][0] for k, r in {**depth, **{f"width {k}": r for k, r in width.items()}}.items()},
               # the run's cost: every point's training time, summed (a resumed run re-reads finished points)
               "wall_s": round(sum(r["wall_s"] for r in [*depth.values(), *width.values()]), 1),
               "resume_wall_s": round(time.perf_counter() - start, 1)}
    data = {k: r["summary"]["groups"] for k, r in {**depth, **{f"width {k}": r for k, r in width.items()}}.items()}
    combined = {"size": "size", "groups": [g for rows in data.values() for g in rows],
                "panels": list(summary["panels"].values())}
    best = plot_best_lr({**combined, "size": "depth (blocks) or width"})
    best.savefig(out / f"{NAME}-best-lr.png", dpi=100)
    plt.close(best)
    return write_outputs(out, NAME, data, summary, markdown(result, s), plot_loss_vs_lr(combined, ncols=4))
