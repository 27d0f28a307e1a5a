"""The one table of sigprop: a header, rows and a caption, rendered as fixed-width text for the terminal
(`Table.text`), GitHub Markdown (`Table.markdown`) or an HTML ``<table>`` (`Table.html`). Every command,
report and experiment that shows a table builds one. Imports nothing from sigprop.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
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
        """A fixed-width plain-text rendering (for the terminal), the caption on the line above it."""
        cells = [list(map(str, self.header))] + self.cells()
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        return "\n".join([*([self.caption] if self.caption else []), lines[0], "  ".join("-" * w for w in widths),
                          *lines[1:]])

    def markdown(self) -> str:
        """A GitHub-flavoured Markdown table (caption as the paragraph above it), ``|`` in cells escaped."""
        esc = lambda s: str(s).replace("|", "\\|")
        lines = ["| " + " | ".join(map(esc, self.header)) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(map(esc, row)) + " |" for row in self.cells()]
        return (f"{self.caption}\n\n" if self.caption else "") + "\n".join(lines) + "\n"

    def html(self) -> str:
        """An HTML <table> (numeric cells right-aligned, class "num"), its caption a paragraph above it, with
        its `code` spans as <code>."""
        caption = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(self.caption))
        cap = f'<p class="caption">{caption}</p>' if self.caption else ""
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in self.header)
        td = lambda c: f'<td class="num">{html.escape(c)}</td>' if is_numeric(c) else f"<td>{html.escape(c)}</td>"
        body = "".join("<tr>" + "".join(map(td, row)) + "</tr>" for row in self.cells())
        return f"{cap}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
