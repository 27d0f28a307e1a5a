"""A self-contained HTML report built directly as HTML: a table of contents, sections with a "how to read
this" note, HTML tables (numbers right-aligned) and captioned figures whose PNGs are embedded as data URIs,
so the file opens in a browser with no network and survives being moved away from its folder.

Tables are `sigprop.table.Table` (re-exported here for the experiment runners): `Table.html` in the report,
`Table.markdown` in the Markdown sections the runners write beside their JSON.
"""
from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..table import Table
from .outputs import write_text


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
    """Write `render`'s document to ``path`` (`sigprop.experiments.outputs.write_text`); returns the path."""
    return write_text(path, render(title, sections, intro))
