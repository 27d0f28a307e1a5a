"""Plot records per layer: predicted and measured curves overlaid, one panel per quantity."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..extras import require
from ..records import Record

PANELS = (("fwd_var", "forward variance", True), ("grad_var", "gradient variance", True),
          ("token_corr", "token correlation", False))


def _pyplot():
    require("matplotlib", "plotting", "pip install 'sigprop[plot]'").use("Agg")
    return require("matplotlib.pyplot", "plotting", "pip install 'sigprop[plot]'")


def records_figure(curves: Mapping[str, Iterable[Record]], title: str = "", panels: tuple = PANELS) -> Any:
    """A matplotlib figure with one panel per quantity; x = sublayer index in execution order.

    ``curves`` maps a label to records; labels containing "predicted" are drawn dashed.
    Variances use a log axis.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (field, label, log) in zip(axes[0], panels):
        for name, recs in curves.items():
            pts = [(i, getattr(r, field)) for i, r in enumerate(recs) if getattr(r, field) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, "--" if "predicted" in name else "-", label=name, lw=1.5)
        ax.set_xlabel("sublayer (execution order)")
        ax.set_title(label)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot_records(curves: Mapping[str, Iterable[Record]], path: str | Path, title: str = "",
                 panels: tuple = PANELS) -> Path:
    """Write `records_figure` as a PNG at ``path``; returns the path written."""
    plt = _pyplot()
    fig = records_figure(curves, title, panels)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
