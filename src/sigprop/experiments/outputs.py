"""What every experiment writes: ``NAME.json`` ({"summary", "data"}), ``NAME.png`` and ``NAME.md``
(a Markdown section) and the wall time it reports; `progress` (`sigprop.console`) wraps long loops."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ..console.progress import progress  # noqa: F401 - the runners' progress bar
from ..train.sweep import finished_records
from .report import Table


def write_outputs(out_dir: str | Path, name: str, data: dict[str, Any], summary: dict[str, Any], md: str,
                  fig: Any) -> dict[str, Any]:
    """Save ``fig`` as NAME.png, {"summary", "data"} as NAME.json and ``md`` as NAME.md; return ``summary``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    (out / f"{name}.json").write_text(json.dumps({"summary": summary, "data": data}, indent=1))
    (out / f"{name}.md").write_text(md)
    return summary


def finished_points(out_dir: str | Path) -> int:
    """How many finished sweep points the ``sweep.jsonl`` files anywhere under ``out_dir`` hold."""
    return sum(len(finished_records(f)) for f in Path(out_dir).rglob("sweep.jsonl"))


class WallClock:
    """The wall time a claim runner reports for the call that trained its points.

    Started when the runner starts; `seconds` is the time since then if the call trained a sweep point
    under ``out_dir`` or no earlier ``NAME.json`` is there, else the earlier summary's ``wall_s``: a call
    that only re-reads finished points (to re-derive a summary) keeps the figure that was measured. A
    resumed call reports the time it took itself (the points it trained)."""

    def __init__(self, out_dir: str | Path, name: str) -> None:
        self.out, self.start = Path(out_dir), time.perf_counter()
        self.before = finished_points(self.out)
        saved = self.out / f"{name}.json"
        self.previous = json.loads(saved.read_text())["summary"].get("wall_s") if saved.exists() else None

    def seconds(self) -> float:
        if self.previous is None or finished_points(self.out) != self.before:
            return round(time.perf_counter() - self.start, 1)
        return self.previous


def section(heading: str, table: Table, notes: str = "") -> str:
    """A runner's Markdown section: ``### heading``, the table (caption above it), optional notes below."""
    return f"### {heading}\n\n{table.markdown()}" + (f"\n{notes}\n" if notes else "")
