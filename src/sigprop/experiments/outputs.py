"""The one writer of every experiment's outputs: `write_outputs` (``NAME.json`` {"summary", "data"}, ``NAME.md``
(a Markdown section), ``NAME.png`` and further ``NAME-*.png``) on `write_json`, `write_text` and `write_figure`, which
the runners with files of their own call too; and the wall time a claim reports. It owns matplotlib's backend (Agg):
the runners draw on its ``plt``; `progress` (`sigprop.console`) wraps long loops."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend; the runners' pyplot

from ..console.files import write_atomic
from ..console.progress import progress  # noqa: F401 - the runners' progress bar
from ..table import Table
from ..train.sweep import finished_records


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (Markdown, HTML) to ``path``, its folder made, the file replaced whole; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return path


def write_json(path: str | Path, doc: Any) -> Path:
    """Write ``doc`` as indented JSON (one final newline) to ``path`` (`write_text`); returns the path."""
    return write_text(path, json.dumps(doc, indent=1) + "\n")


def write_figure(path: str | Path, fig: Any) -> Path:
    """Lay out ``fig``, save it as a PNG at ``path`` (its folder made) and close it; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(out_dir: str | Path, name: str, data: Any, summary: dict[str, Any], md: str,
                  fig: Any = None, figures: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Save {"summary", "data"} as NAME.json, ``md`` as NAME.md, ``fig`` (if any) as NAME.png and each of
    ``figures`` as NAME-KEY.png; return ``summary``."""
    out = Path(out_dir)
    if fig is not None:
        write_figure(out / f"{name}.png", fig)
    for key, f in (figures or {}).items():
        write_figure(out / f"{name}-{key}.png", f)
    write_json(out / f"{name}.json", {"summary": summary, "data": data})
    write_text(out / f"{name}.md", md)
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
