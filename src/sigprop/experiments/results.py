"""Collect the claim runners' Markdown sections (those whose summary carries a ``verdict``) into one RESULTS.md
with a verdict table on top."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from .outputs import write_json, write_text
from .registry import EXPERIMENTS, entry, is_claim

CLAIMS = tuple(n for n in EXPERIMENTS if is_claim(n))      # the training claims, whose verdict NAME.json recomputes

HEADER = """# Reproducing the papers' claims at CPU scale

Each section was written by `sigprop reproduce NAME` (JSON + PNG + this Markdown, in `runs/reproduce/NAME/`);
`sigprop reproduce NAME --docs docs` writes this file from every claim finished in `runs/reproduce` (the
runs are resumable: a finished point is read back, not retrained), each claim's summary in `docs/results/`.
Machine: 2 CPU cores, no GPU. Verdict rules are code, fixed before the full runs:
`src/sigprop/experiments/verdicts.py` for the training claims (each model at its own lr, chosen on an unscored
seed from a grid that brackets it), each runner's docstring for the others. The figure reproductions have their
own pages: [RESULTS_shaped_figs.md](RESULTS_shaped_figs.md) (The Shaped
Transformer, Figs. 1, 2, 4, 5) and [RESULTS_dslm_moments.md](RESULTS_dslm_moments.md) (DeepScaleLM moments).
What the verdicts mean at this scale, with the measurements made beside them:
[RESULTS_discussion.md](RESULTS_discussion.md).
"""


def figures_of(root: Path, name: str) -> list[Path]:
    """A claim's figures: ``NAME.png`` first, then ``NAME-*.png`` by name."""
    return [root / name / f"{name}.png", *sorted((root / name).glob(f"{name}-*.png"))]


def collect(root: str | Path, names: Sequence[str], docs: str | Path | None = None) -> str:
    """Build RESULTS.md from ``root/NAME/NAME.{md,json,png}`` for every ``NAME`` that has them; write it to
    ``root/RESULTS.md`` and, if ``docs``, to ``docs/RESULTS.md`` with the figures copied into ``docs/img`` and
    each claim's summary into ``docs/results/NAME.json``.
    Returns the text ("" and nothing written when no claim has results)."""
    root = Path(root)
    summaries = {n: json.loads((root / n / f"{n}.json").read_text())["summary"] for n in names
                 if (root / n / f"{n}.md").exists() and (root / n / f"{n}.json").exists()}
    found = {n: s for n, s in summaries.items() if "verdict" in s}
    if not found:
        return ""
    rows, sections = [], []
    for n, s in found.items():
        seeds = s["seeds"]
        seeds = ", ".join(map(str, seeds)) if isinstance(seeds, (list, tuple)) else seeds
        rows.append(f"| [{n}](#{n}) | **{s['verdict']}** | {s['verdict_reason']} | "
                    f"`sigprop reproduce {n}` | {seeds} | {s['wall_s'] / 60:.1f} min |")
        figures = "".join(f"\n\n![{f.stem}](img/{f.name})" for f in figures_of(root, n))
        sections.append(f'<a id="{n}"></a>\n\n' + (root / n / f"{n}.md").read_text().rstrip()
                        + f"\n\nCommand: `sigprop reproduce {n}`; seeds {seeds}; wall time {s['wall_s']:.0f} s."
                        + figures + "\n")
    table = ["| claim | verdict | measured | command | seeds | wall |", "|---|---|---|---|---|---|", *rows]
    text = HEADER + "\n" + "\n".join(table) + "\n\n" + "\n\n".join(sections)
    write_text(root / "RESULTS.md", text)
    if docs is not None:
        docs = Path(docs)
        (docs / "img").mkdir(parents=True, exist_ok=True)
        for n, s in found.items():
            for f in figures_of(root, n):
                shutil.copyfile(f, docs / "img" / f.name)
            write_json(docs / "results" / f"{n}.json", s)
        write_text(docs / "RESULTS.md", text)
    return text


def rejudge(root: str | Path, names: Sequence[str] = CLAIMS) -> dict[str, tuple[str, str]]:
    """(verdict, reason) of every training claim in ``names`` with a ``root/NAME/NAME.json``, recomputed by
    its rule from the saved summary alone."""
    out = {}
    for n in names:
        path = Path(root) / n / f"{n}.json"
        if n in CLAIMS and path.exists():
            out[n] = entry(n).rule(json.loads(path.read_text())["summary"])
    return out
