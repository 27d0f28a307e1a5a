"""What every experiment writes: ``NAME.json`` ({"summary", "data"}), ``NAME.png`` and ``NAME.md``
(a Markdown section), plus the progress bar that wraps long loops."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .report import Table  # noqa: E402

T = TypeVar("T")


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


def progress(items: Iterable[T], desc: str, total: int | None = None, enabled: bool = True) -> Iterator[T]:
    """``items`` behind a tqdm bar (plain iteration when tqdm is missing or ``enabled`` is false)."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            enabled = False
    yield from (tqdm(items, desc=desc, total=total, dynamic_ncols=True) if enabled else items)


def section(heading: str, table: Table, notes: str = "") -> str:
    """A runner's Markdown section: ``### heading``, the table (caption above it), optional notes below."""
    return f"### {heading}\n\n{table.markdown()}" + (f"\n{notes}\n" if notes else "")
