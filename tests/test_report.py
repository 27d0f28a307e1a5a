"""The HTML report, read back with an HTML parser the way a browser sees it: every table is an HTML table,
every heading a heading, no Markdown left in the text, numbers right-aligned, figures captioned and
embedded, a table of contents that points at the sections."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sigprop.experiments.report import Figure, Section, write_html
from sigprop.table import Table, is_numeric

# Markdown a browser would show literally: a table row or separator, an ATX heading, an image, emphasis or code
RAW_MARKDOWN = (re.compile(r"^\s*\|.*\|\s*$"), re.compile(r"^\s*\|?\s*:?-{3,}"), re.compile(r"^\s*#{1,6}\s"),
                re.compile(r"!\[[^\]]*\]\("), re.compile(r"\*\*[^*]+\*\*"), re.compile(r"`[^`]+`"))


class Page(HTMLParser):
    """What a browser would render: text nodes (outside <style>/<script>), tags opened, table cells and
    their classes, image sources, ids, links and figure captions."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[tuple[str, str]] = []        # (enclosing tag, text)
        self.tags: list[str] = []
        self.stack: list[str] = []
        self.cells: list[tuple[str, str]] = []       # (class, text) of every <td>
        self.images: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.captions: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag not in ("img", "meta", "br"):
            self.stack.append(tag)
        if tag == "td":
            self.cells.append((a.get("class") or "", ""))
        if tag == "img":
            self.images.append(a.get("src") or "")
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "figcaption":
            self.captions.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.stack:
            while self.stack.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        where = self.stack[-1] if self.stack else ""
        if where in ("style", "script"):
            return
        self.text.append((where, data))
        if "td" in self.stack and self.cells:
            cls, txt = self.cells[-1]
            self.cells[-1] = (cls, txt + data)
        if "figcaption" in self.stack:
            self.captions[-1] += data


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def raw_markdown(page: Page) -> list[str]:
    """Text lines that a browser would show as literal Markdown."""
    return [line for _, t in page.text for line in t.splitlines() if any(p.search(line) for p in RAW_MARKDOWN)]


def check_report(path: Path, min_tables: int, min_figures: int) -> Page:
    page = parse(path)
    assert raw_markdown(page) == []
    assert page.tags.count("table") >= min_tables and page.tags.count("th") > 0
    assert page.tags.count("h1") == 1 and page.tags.count("nav") == 1
    sections = page.tags.count("section")
    assert page.tags.count("h2") == sections + 1                          # one per section + "Contents"
    toc = [link[1:] for link in page.links if link.startswith("#")]
    assert len(toc) == sections and set(toc) <= page.ids                 # the contents reach every section
    assert len(page.images) >= min_figures and len(page.captions) == len(page.images)
    assert all(src.startswith("data:image/png;base64,") and len(src) > 2000 for src in page.images)
    assert all(c.strip() for c in page.captions)
    assert all(not src.startswith("http") for src in page.images) and "http" not in path.read_text()
    for cls, txt in page.cells:                                           # numbers right, words left
        assert (cls == "num") == is_numeric(txt), (cls, txt)
    return page


def test_built_report_passes_the_checks(tmp_path):
    from PIL import Image  # matplotlib's dependency
    png = tmp_path / "f.png"
    Image.new("RGB", (40, 30), "white").save(png)
    png.write_bytes(png.read_bytes() + bytes(3000))                       # a PNG above the size floor
    t = Table(["model", "loss", "range"], [["<a>", 1.234567, "0.1 – 2"], ["b | c", 2, "—"]], caption="cap `x < y`")
    path = write_html(tmp_path / "r.html", "T & T", [Section("S 1", "read me", ["p < q"], [t], [Figure(png, "a fig")]),
                                                      Section("S 1", tables=[t])])
    page = check_report(path, min_tables=2, min_figures=1)
    assert [c for _, c in page.cells][:3] == ["<a>", "1.235", "0.1 – 2"]
    assert ("td", "<a>") in page.text and ("p", "p < q") in page.text and ("title", "T & T") in page.text
    assert len(page.ids) == 2                                             # two sections of one title, two ids
    assert "cap <code>x &lt; y</code>" in path.read_text()


@pytest.mark.parametrize("bad", ["| a | b |", "|---|---|", "### Fig. 1 — x", "## heading", "see ![f](f.png)",
                                 "**Verdict: ok.**"])
def test_the_check_fails_on_raw_markdown(tmp_path, bad):
    path = write_html(tmp_path / "r.html", "T", [Section("S", paragraphs=[f"text\n{bad}\nmore"])])
    assert raw_markdown(parse(path)) == [bad]


def test_numeric_cells():
    for s in ("0.25", "-1.2e-05", "3.1 – 4", "12.5%", "0.91 → 0.12", "1.5%, 2.0%", "—", "4.2 (4.0)"):
        assert is_numeric(s), s
    for s in ("shaped", "Pre-LN DSLM", "diverged", "e5", "", "softmax (no LN)"):
        assert not is_numeric(s), s


def test_markdown_table_escapes_pipes_and_keeps_the_caption():
    md = Table(["a", "b"], [["x|y", 0.5]], caption="c").markdown()
    assert md == "c\n\n| a | b |\n|---|---|\n| x\\|y | 0.5 |\n"


def test_quick_demo_report_renders(quick_demo):
    page = check_report(quick_demo.out / "report.html", min_tables=4, min_figures=4)
    headings = [t for tag, t in page.text if tag == "h2"]
    assert headings[0] == "Contents" and any(h.startswith("1. Rank collapse") for h in headings)
    assert sum(t.startswith("How to read this") for tag, t in page.text if tag == "b") == 4
