"""The shipped text speaks of the project alone: no development bookkeeping in README, docs, bench notes,
configs, code, tests or examples (work sessions, issue numbers, sections of internal specs or notes)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["README.md", "pyproject.toml", ".ci", "docs", "bench", "configs", "src", "tests", "examples"]
SUFFIXES = {".md", ".py", ".toml", ".sh", ".txt", ".cfg", ""}

FORBIDDEN = {
    "a work session": re.compile(r"\bsessions?\b(?!\")", re.I),          # pytest's scope="session" is allowed
    "an issue number": re.compile(r"\bissues?\s*#?\d+|\(issue\b|\bthe issue'?s?\b", re.I),
    "an internal spec": re.compile(r"\bSPEC\b|\b[Tt]he spec\b"),        # `spec` as a variable name is fine
    "internal notes": re.compile(r"\bthe notes\b|\bnotes'|\bnotes/|\[notes\b", re.I),
}
# the patterns above, as written in this file, are the only allowed hits
SELF = Path(__file__).resolve()


def shipped_files() -> list[Path]:
    files = []
    for entry in SHIPPED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in candidates if p.suffix in SUFFIXES and "__pycache__" not in p.parts and p != SELF]
    return files


def test_forbidden_words_are_caught() -> None:
    """The patterns do match what they are meant to refuse (so the scan below can fail)."""
    samples = {"a work session": "measured in session 3", "an issue number": "fixed (issue 12)",
               "an internal spec": "as SPEC §2 says", "internal notes": "the notes' formula"}
    for what, text in samples.items():
        assert FORBIDDEN[what].search(text), what
    assert not FORBIDDEN["a work session"].search('@pytest.fixture(scope="session")')


def test_shipped_text_has_no_development_bookkeeping() -> None:
    files = shipped_files()
    assert len(files) > 50, "the scan found too few files: is the layout different?"
    hits = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:100]}")
    assert not hits, "development bookkeeping in shipped text:\n" + "\n".join(hits)
