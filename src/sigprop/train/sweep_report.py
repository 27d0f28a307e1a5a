"""What a finished sweep means: best learning rate per group, LR sensitivity, transfer regret; a table
and two plots (measure → table → plot: `summarize` makes rows, the plotting functions only draw them).

Definitions (Wortsman et al. 2023, arXiv 2309.14322, §2.3):
  * a *group* is every grid key except ``optim.lr`` and the seed; its curve is the mean final
    validation loss over seeds at each lr (`seed_stats`; a diverged seed makes the point +inf);
  * best lr η* and *edge* (η* is the smallest or largest lr of the grid, or the grid's only lr): `lr_grid.best_lr`;
  * LR sensitivity = mean over the grid of min(loss(η), loss at init) − min over η of loss(η);
  * transfer regret, per panel (the group minus the size axis): loss of the largest size at the
    smallest size's η*, capped at the loss at init like the sensitivity, minus the largest size's best loss
    ("not applicable" when the largest size has no run at that lr: grids centred on each group's advice).

The size axis is *ordered* when its values are finite numbers, *categorical* when they are all strings
or all booleans (e.g. schemes or parametrizations, each at its own best lr); `check_size` refuses anything
else. A categorical axis keeps the grid's order, plots η* per category, and has no transfer regret or
η* ratio (both compare the largest size with the smallest): those read "not applicable", and the
summary's ``not_applicable`` says why.
"""
from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..console.errors import UserError
from ..table import Table
from .lr_grid import best_lr
from .seed_stats import seed_stats

LR, SEEDS = "optim.lr", ("seed", "train.seed")
ORDERED, CATEGORICAL = "ordered", "categorical"
NOT_APPLICABLE = "not applicable"


def size_kind(values: Sequence[Any], name: str = "size") -> str:
    """`ORDERED` when every value (None ignored) is a finite number (a boolean is not), `CATEGORICAL` when all
    are strings or all are booleans; else ValueError naming ``name`` and the values."""
    vals = [v for v in values if v is not None]
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in vals):
        return ORDERED
    if all(isinstance(v, str) for v in vals) or all(isinstance(v, bool) for v in vals):
        return CATEGORICAL
    raise UserError(f"{name} must hold only finite numbers (an ordered size) or only strings or only booleans "
                    f"(categories), got {list(values)!r}")


def check_size(size: str, values: Sequence[Any]) -> str:
    """The kind of the size axis ``size`` with these values (`size_kind`); ValueError if the report cannot use it:
    the lr (every curve's x) and the seed (averaged over) are not size axes."""
    if size == LR or size in SEEDS:
        raise UserError(f"sweep.size={size!r} is invalid: the size axis must be a grid key other than "
                        f"{LR!r} (the x of every curve) and the seed (averaged over)")
    return size_kind(values, f"sweep.size={size!r}")


def _label(point: Mapping[str, Any], skip: Sequence[str]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items() if k not in skip) or "all"


def group_label(point: Mapping[str, Any]) -> str:
    """The group of a point: its values except the lr and the seed (``n_layers=4, scheme=preln``)."""
    return _label(point, (LR, *SEEDS))


def summarize(records: Sequence[dict[str, Any]], size: str | None) -> dict[str, Any]:
    """Rows per group (curve, η*, edge, sensitivity) and per panel (η* vs size, transfer regret).

    Raises ValueError if ``size`` is not a size axis the report can use (`check_size`)."""
    kind = check_size(size, [r["point"].get(size) for r in records]) if size else None
    skip_group = (LR, *SEEDS)
    groups: dict[str, dict[str, Any]] = {}
    for r in records:
        g = groups.setdefault(group_label(r["point"]), {
            "panel": _label(r["point"], (*skip_group, size)) if size else "all",
            "size": r["point"].get(size) if size else None, "runs": {}})
        g["runs"].setdefault(r["point"].get(LR, r["config"]["optim"]["lr"]), []).append(r)
    rows = []
    for label, g in groups.items():
        lrs = sorted(g["runs"])
        means = [seed_stats(r["final_val_loss"] for r in g["runs"][lr])["mean"] for lr in lrs]
        loss = [m if math.isfinite(m) else math.inf for m in means]
        init = float(np.mean([r["initial_val_loss"] for lr in lrs for r in g["runs"][lr]]))
        best_at, edge = best_lr(lrs, loss)
        best = math.inf if best_at is None else loss[lrs.index(best_at)]
        rows.append({"group": label, "panel": g["panel"], "size": g["size"], "lrs": lrs, "loss": loss,
                     "initial_loss": init, "best_lr": best_at, "best_loss": best, "edge": edge,
                     "sensitivity": (float(np.mean([min(v, init) for v in loss]) - best) if math.isfinite(best)
                                     else math.nan),
                     "n_seeds": len(g["runs"][lrs[0]])})
    panels, off_grid = [], []
    for panel in dict.fromkeys(r["panel"] for r in rows):
        prs = [r for r in rows if r["panel"] == panel]          # a categorical axis keeps the grid's order
        regret: float | str = NOT_APPLICABLE
        ratio: float | str = NOT_APPLICABLE
        if kind != CATEGORICAL:
            prs.sort(key=lambda r: (r["size"] is None, r["size"]))
            small, large = prs[0], prs[-1]
            regret = math.nan
            if size and small["best_lr"] in large["lrs"]:
                at = large["loss"][large["lrs"].index(small["best_lr"])]
                regret = min(at, large["initial_loss"]) - large["best_loss"]
            elif size and small["best_lr"] is not None:
                regret = NOT_APPLICABLE
                off_grid.append(panel)
            ratio = large["best_lr"] / small["best_lr"] if small["best_lr"] and large["best_lr"] else math.nan
        panels.append({"panel": panel, "sizes": [r["size"] for r in prs], "best_lr": [r["best_lr"] for r in prs],
                       "edge": [r["edge"] for r in prs], "transfer_regret": regret, "best_lr_ratio": ratio})
    not_applicable: dict[str, str] = {}
    if kind == CATEGORICAL:
        cats = f"{size} holds categories: " + ", ".join(str(c) for c in dict.fromkeys(r["size"] for r in rows))
        not_applicable = {"transfer_regret": f"it needs an ordered size (the largest size's loss at the smallest "
                                             f"size's best lr); {cats}",
                          "best_lr_ratio": f"it needs an ordered size (η* of the largest size over η* of the "
                                           f"smallest); {cats}"}
    if off_grid:
        not_applicable["transfer_regret"] = (f"in {', '.join(off_grid)} the largest size has no run at the smallest "
                                             "size's best lr (their lr grids differ, e.g. each centred on its advice)")
    return {"size": size, "groups": rows, "panels": panels, "not_applicable": not_applicable}


def _categorical(summary: dict[str, Any]) -> bool:
    return size_kind([s for p in summary["panels"] for s in p["sizes"]]) == CATEGORICAL


def _number(v: float | str, fmt: str) -> str:
    return v if isinstance(v, str) else format(v, fmt)


def table(summary: dict[str, Any]) -> str:
    """Markdown table: one row per group; an edge η* is marked ⚠ (the optimum may lie outside the grid). Per
    panel, η* by size (in size order, or per category), the η* ratio and the transfer regret; a metric without a
    number reads "not applicable", with the reason from ``summary["not_applicable"]`` below the table."""
    lr = lambda r: "diverged" if r["best_lr"] is None else f"{r['best_lr']:.3g}" + (" ⚠ edge" if r["edge"] else "")
    groups = [[r["group"], lr(r), f"{r['best_loss']:.4f}", f"{r['sensitivity']:.4f}", r["n_seeds"]]
              for r in summary["groups"]]
    lines = [Table(["group", "best lr", "best loss", "LR sensitivity", "seeds"], groups).markdown()]
    if summary["size"]:
        categorical = _categorical(summary)
        panels = []
        for p in summary["panels"]:
            lrs = ["—" if v is None else f"{v:.3g}" + ("⚠" if e else "") for v, e in zip(p["best_lr"], p["edge"])]
            lrs = ", ".join(f"{s}: {v}" for s, v in zip(p["sizes"], lrs)) if categorical else " → ".join(lrs)
            panels.append([p["panel"], lrs, _number(p["best_lr_ratio"], ".3g"), _number(p["transfer_regret"], ".4f")])
        lines.append(Table(["panel", f"η* by {summary['size']}", "η*(largest)/η*(smallest)", "transfer regret"],
                           panels).markdown())
        reasons = summary.get("not_applicable", {})
        if reasons:
            names = {"best_lr_ratio": "η*(largest)/η*(smallest)", "transfer_regret": "transfer regret"}
            lines.append("\n".join(f"{names[k]}: {NOT_APPLICABLE} — {why}." for k, why in reasons.items()))
    return "\n".join(lines).rstrip("\n")


def log_ticks(ax: Any, values: Sequence[float], axis: str = "x") -> None:
    """Put ``axis`` of ``ax`` on a log scale ticked at the grid ``values`` (labels to 3 significant digits),
    without the minor-tick labels matplotlib writes, overlapping, when the values span less than a decade."""
    import matplotlib.ticker

    ticks = sorted({float(v) for v in values if v is not None and math.isfinite(v)})
    which = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    if ticks:
        which.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        which.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{v:.3g}" for v in ticks]))
        which.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.tick_params(axis=axis, labelsize=7, labelrotation=45 if axis == "x" and len(ticks) > 4 else 0)


def plot_loss_vs_lr(summary: dict[str, Any], ncols: int = 4) -> Any:
    """One panel per panel label, one line per size (or category): final loss vs lr (log x); η* marked, ✕ at an
    edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p["panel"] for p in summary["panels"]]
    ncols = min(ncols, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        for r in (r for r in summary["groups"] if r["panel"] == panel):
            y = [v if math.isfinite(v) else np.nan for v in r["loss"]]
            line, = ax.plot(r["lrs"], y, marker="o", ms=3, label=f"{summary['size'] or 'run'}={r['size']}")
            if r["best_lr"] is not None:
                ax.plot([r["best_lr"]], [r["best_loss"]], "x" if r["edge"] else "*", ms=10, color=line.get_color())
        log_ticks(ax, [lr for r in summary["groups"] if r["panel"] == panel for lr in r["lrs"]])
        ax.set(xlabel="learning rate", ylabel="final validation loss", title=panel)
        ax.legend(fontsize=7)
    return fig


def plot_best_lr(summary: dict[str, Any], ax: Any = None) -> Any:
    """η* vs size (log y), one line per panel; hollow markers where η* sits at the grid's edge. An ordered size is
    drawn on a log x axis (linear if a size is ≤ 0); a categorical one has one x position per category, in grid
    order, where each panel's η* is an unjoined marker beside the other panels'. Draws into ``ax`` if given
    (returns its figure), else into a new figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4.2))
    sizes = [s for p in summary["panels"] for s in p["sizes"] if s is not None]
    categorical = _categorical(summary)
    cats = list(dict.fromkeys(sizes))
    for i, p in enumerate(summary["panels"]):
        pts = [(s, v, e) for s, v, e in zip(p["sizes"], p["best_lr"], p["edge"]) if v is not None and s is not None]
        if not pts:
            continue
        if categorical:          # side by side within a category's slot of width 0.5
            shift = (i - (len(summary["panels"]) - 1) / 2) * 0.5 / len(summary["panels"])
            pts = [(cats.index(s) + shift, v, e) for s, v, e in pts]
        line, = ax.plot([s for s, _, _ in pts], [v for _, v, _ in pts], marker="o", label=p["panel"],
                        linestyle="none" if categorical else "-")
        edges = [(s, v) for s, v, e in pts if e]
        if edges:
            ax.plot(*zip(*edges), "o", mfc="white", color=line.get_color(), ms=8)
    ax.set(yscale="log", xlabel=summary["size"] or "size", ylabel="best learning rate η*",
           title=("optimal lr per category" if categorical else "optimal lr vs size") + " (hollow: at the grid's edge)")
    if categorical:
        ax.set_xticks(range(len(cats)), [str(c) for c in cats])
        ax.set_xlim(-0.5, len(cats) - 0.5)
    elif all(s > 0 for s in sizes):
        log_ticks(ax, sizes)
    else:
        ax.set_xticks(sorted(set(sizes)))
    if ax.get_legend_handles_labels()[0]:             # none without a size axis or a finite η*
        ax.legend(fontsize=7)
    return ax.figure


def write_report(records: Sequence[dict[str, Any]], size: str | None, out_dir: str | Path) -> dict[str, Any]:
    """summary.json, summary.md, loss_vs_lr.png and best_lr.png in ``out_dir``; returns the summary with its table."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    summary = summarize(records, size)
    summary["table"] = table(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(summary["table"] + "\n")
    for name, fig in (("loss_vs_lr", plot_loss_vs_lr(summary)), ("best_lr", plot_best_lr(summary))):
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)
    return summary
