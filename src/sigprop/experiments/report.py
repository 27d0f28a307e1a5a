"""A self-contained HTML report: sections of text, tables and PNGs (embedded as data URIs, so the file
opens in a browser with no network and survives being moved away from its folder)."""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


@dataclass
class Table:
    """A header row and data rows; floats are shown with 4 significant digits."""

    header: Sequence[str]
    rows: Sequence[Sequence[Any]]

    def cells(self) -> list[list[str]]:
        """Every row as display strings."""
        return [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in self.rows]

    def text(self) -> str:
        """A fixed-width plain-text rendering (for the terminal)."""
        cells = [list(map(str, self.header))] + self.cells()
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
        return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])

    def html(self) -> str:
        """An HTML <table>."""
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.cells())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class Section:
    """One part of the report: a title, paragraphs, tables, and PNG files."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    images: list[Path] = field(default_factory=list)


STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f2f2f2}img{max-width:100%;border:1px solid #eee;margin:.5em 0}h2{border-bottom:1px solid #ddd}"""


def _image(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(Path(path).name)}" src="data:image/png;base64,{data}"></figure>'


def write_html(path: str | Path, title: str, sections: Sequence[Section], intro: str = "") -> Path:
    """Write the report to ``path`` (parent folders created); returns the path."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    for s in sections:
        parts.append(f"<section><h2>{html.escape(s.title)}</h2>")
        parts += [f"<p>{html.escape(p)}</p>" for p in s.paragraphs]
        parts += [t.html() for t in s.tables]
        parts += [_image(p) for p in s.images]
        parts.append("</section>")
    parts.append("</body></html>")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts), encoding="utf-8")
    return out
