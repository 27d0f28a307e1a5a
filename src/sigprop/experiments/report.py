"""A self-contained HTML report built directly as HTML: a table of contents, sections with a "how to read
this" note, HTML tables (numbers right-aligned) and captioned figures whose PNGs are embedded as data URIs,
so the file opens in a browser with no network and survives being moved away from its folder.

`Table` is also the one place tables become text: `Table.text` for the terminal and `Table.markdown` for
the Markdown sections the experiment runners write beside their JSON.
"""
from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

# a cell made of numbers and the signs that join them ("0.25", "1.2e-05", "3.1 – 4", "12 %", "0.9 → 0.1")
_NUMERIC = re.compile(r"^[-+−]?(\d|\.\d)[\d.,eE+\-−–→/%×()\s]*$|^—$")


def cell(value: Any) -> str:
    """A value as a display string: floats with 4 significant digits, everything else ``str``."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def is_numeric(text: str) -> bool:
    """Whether a display string is a number (or a range/arrow of numbers), to be right-aligned."""
    return bool(_NUMERIC.match(text.strip()))


@dataclass
class Table:
    """A header row and data rows (floats shown with 4 significant digits), with an optional caption."""

    header: Sequence[str]
    rows: Sequence[Sequence[Any]]
    caption: str = ""

    def cells(self) -> list[list[str]]:
        """Every row as display strings."""
        return [[cell(v) for v in row] for row in self.rows]

    def text(self) -> str:
        """A fixed-width plain-text rendering (for the terminal)."""
        cells = [list(map(str, self.header))] + self.cells()
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])

    def markdown(self) -> str:
        """A GitHub-flavoured Markdown table (caption as the paragraph above it), ``|`` in cells escaped."""
        esc = lambda s: str(s).replace("|", "\\|")
        lines = ["| " + " | ".join(map(esc, self.header)) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(map(esc, row)) + " |" for row in self.cells()]
        return (f"{self.caption}\n\n" if self.caption else "") + "\n".join(lines) + "\n"

    def html(self) -> str:
        """An HTML <table> (numeric cells right-aligned, class "num"), its caption a paragraph above it."""
        cap = f'<p class="caption">{html.escape(self.caption)}</p>' if self.caption else ""
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in self.header)
        td = lambda c: f'<td class="num">{html.escape(c)}</td>' if is_numeric(c) else f"<td>{html.escape(c)}</td>"
        body = "".join("<tr>" + "".join(map(td, row)) + "</tr>" for row in self.cells())
        return f"{cap}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class Figure:
    """A PNG file and the caption shown under it."""

    path: Path
    caption: str


@dataclass
class Section:
    """One part of the report: a title, a "how to read this" note, paragraphs, tables and figures."""

    title: str
    how_to_read: str = ""
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;
line-height:1.45}table{border-collapse:collapse;margin:1em 0;font-size:.92em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}td.num{text-align:right;
font-variant-numeric:tabular-nums;white-space:nowrap}th{background:#f2f2f2}p.caption{margin:1em 0 -.6em;
font-size:.92em;color:#444}figure{margin:1em 0}img{max-width:100%;
border:1px solid #eee}figcaption{font-size:.92em;color:#444}h2{border-bottom:1px solid #ddd;margin-top:1.6em}
.how{background:#f6f8fa;border-left:4px solid #8aa;padding:.5em .9em}nav ol{margin:.3em 0}"""


def _slug(text: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    slug, i = base, 2
    while slug in taken:
        slug, i = f"{base}-{i}", i + 1
    taken.add(slug)
    return slug


def _figure(fig: Figure, number: int) -> str:
    data = base64.b64encode(Path(fig.path).read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(fig.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>Figure {number}.</b> {html.escape(fig.caption)}</figcaption></figure>")


def render(title: str, sections: Sequence[Section], intro: str = "") -> str:
    """The report as one HTML document: title, intro, contents, then each section in order."""
    taken: set[str] = set()
    ids = [_slug(s.title, taken) for s in sections]
    toc = "".join(f'<li><a href="#{i}">{html.escape(s.title)}</a></li>' for i, s in zip(ids, sections))
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    parts.append(f"<nav><h2>Contents</h2><ol>{toc}</ol></nav>")
    number = 0
    for sid, s in zip(ids, sections):
        parts.append(f'<section id="{sid}"><h2>{html.escape(s.title)}</h2>')
        if s.how_to_read:
            parts.append(f'<p class="how"><b>How to read this.</b> {html.escape(s.how_to_read)}</p>')
        parts += [f"<p>{html.escape(p)}</p>" for p in s.paragraphs]
        parts += [t.html() for t in s.tables]
        for fig in s.figures:
            number += 1
            parts.append(_figure(fig, number))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: str | Path, title: str, sections: Sequence[Section], intro: str = "") -> Path:
    """Write `render`'s document to ``path`` (parent folders created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(title, sections, intro), encoding="utf-8")
    return out
