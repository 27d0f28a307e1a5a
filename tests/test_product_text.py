"""The shipped text speaks of the project alone: no development bookkeeping in README, docs, bench notes,
configs, code, tests or examples (work sessions, issue numbers, sections of internal specs or notes), and no
run history in the package's code and docstrings (wall times, load averages, the machine a run took) nor tallies
(measured figures: "measured 3.1 %", "over 64 networks", "2.3 % at L = 48", "~5 %", "within 2 % of Monte Carlo"):
those state contracts and mathematics, measured figures live in docs/ and bench/RESULTS.md. A bound a test holds is
a contract: "within 5 % (tests/test_x.py)", "≤ 5 % … tests/test_x.py" in the same sentence."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["README.md", "pyproject.toml", "conftest.py", "mkdocs.yml", ".ci", "docs", "bench", "configs", "src",
           "tests", "examples"]
SUFFIXES = {".md", ".py", ".toml", ".sh", ".txt", ".cfg", ".yml", ""}

FORBIDDEN = {
    "a work session": re.compile(r"\bsessions?\b(?!\")", re.I),          # pytest's scope="session" is allowed
    "an issue number": re.compile(r"\bissues?\s*#?\d+|\(issue\b|\bthe issue'?s?\b", re.I),
    "an internal spec": re.compile(r"\bSPEC\b|\b[Tt]he spec\b"),        # `spec` as a variable name is fine
    "internal notes": re.compile(r"\bthe notes\b|\bnotes'|\bnotes/|\[notes\b", re.I),
}
# in src/ only: docs/ and bench/RESULTS.md are where measured run figures belong
UNIT = r"(s|secs?|seconds?|ms|min|minutes?|h|hours?)"
RUN_HISTORY = {
    "a load average": re.compile(r"\bload (average|avg)\b|\bloadavg\b|\bat load \d|\bload (of |was |≈ ?|~ ?)\d", re.I),
    "a wall time": re.compile(r"\bwall(-clock)? time:? \d|\bwall time \((measured|estimate)"
                              rf"|\d(\.\d+)? ?{UNIT} (of )?(wall|here|on this machine)\b"
                              rf"|\bwall(-clock)?[ -]times?\b[^.;]{{0,25}}?\d+(\.\d+)? ?{UNIT}\b", re.I),
    "a run's duration": re.compile(r"\btook \d|\d(\.\d+)? ?(min|minutes|hours?)\b", re.I),
    "the machine a run used": re.compile(r"\b\d+-core machine\b", re.I),
}
PCT = r"\d+(?:\.\d+)?\s?%"
TALLIES = {
    "a measured figure": re.compile(r"\bmeasured\b:?\s+(?:[a-z]+\s+){0,2}?\(?(?:[<>≈~≤]\s?|[−+-])?\d"
                                    r"|\d[^.;\n]{0,25}?\(measured\)|\b(?:difference|error) measured\b", re.I),
    "a count of networks": re.compile(r"\b[1-9]\d*(?:,\d{3})*\s+(?:other\s+|random\s+)?(?:networks|nets|seeds)\b",
                                      re.I),
    "an error at a point": re.compile(rf"{PCT}\s+(?:high|low)\b"
                                      r"|\b(?:off|miss(?:es|ed)?) by (?:up to |about )?[~≈]?\s?\d"
                                      rf"|{PCT}\s+at\s+(?:[\w₀-₉]+\s?(?:=|≥|>=)\s?\d|depth|width)", re.I),
    "an approximate figure": re.compile(rf"[~≈]\s?{PCT}|\bby up to [~≈]?\s?{PCT}", re.I),
    "a Monte-Carlo figure": re.compile(rf"Monte[- ]Carlo[^.;]{{0,40}}?{PCT}|{PCT}[^.;]{{0,30}}?\bMonte[- ]Carlo", re.I),
}
# a bound a test holds, named in the same sentence: a contract, not a tally
TESTED_BOUND = re.compile(rf"(?:within|≤|<|below|under|at most)\s?{PCT}[^;]{{0,80}}?\btests/test_\w+\.py", re.I)
# the patterns above, as written in this file, are the only allowed hits
SELF = Path(__file__).resolve()


def shipped_files() -> list[Path]:
    files = []
    for entry in SHIPPED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in candidates if p.suffix in SUFFIXES and p != SELF
                  and not any(part == "__pycache__" or part.endswith(".egg-info") for part in p.parts)]
    return files


def test_forbidden_words_are_caught() -> None:
    """The patterns do match what they are meant to refuse (so the scan below can fail)."""
    samples = {"a work session": "measured in session 3", "an issue number": "fixed (issue 12)",
               "an internal spec": "as SPEC §2 says", "internal notes": "the notes' formula"}
    for what, text in samples.items():
        assert FORBIDDEN[what].search(text), what
    assert not FORBIDDEN["a work session"].search('@pytest.fixture(scope="session")')


def test_run_history_patterns_are_caught() -> None:
    """The run-history patterns match the prose they refuse (so the scan below can fail), not the contracts
    the package states about wall times."""
    samples = {"a load average": ["while two other claim runs shared the machine (load average 3.4–5.7)",
                                  "shared with other runs at load 2–6", "a load of 3.1 during the run",
                                  "sampled from /proc/loadavg"],
               "a wall time": ["Wall time (measured, 2-core machine, one thread per worker)",
                               "Wall time (estimate, from timed points)", "141.7 min wall for 25 points",
                               "wall time 35.5 min", "12 s of wall", "about 40 s here", "3.5 seconds on this machine",
                               "its wall time is about 12 s", "wall-clock times of 2–3 min", "90 s wall"],
               "a run's duration": ["the points took 160–800 s each", "≈ 13–16 min with ``jobs=2``",
                                    "sum to 4.0 hours, so even alone the run takes well over 30 minutes"],
               "the machine a run used": ["measured on the 2-core machine, ``jobs=2``"]}
    for what, texts in samples.items():
        for text in texts:
            assert RUN_HISTORY[what].search(text), (what, text)
    allowed = ["the wall time it reports", "f\"; wall time {s['wall_s']:.0f} s.\"", "min(v, init) for v in loss",
               "``wall_s``", "~1 ms per block", "time.perf_counter()", "the wall time of the call that trained it",
               "load the weights", "wall times are in bench/RESULTS.md"]
    for text in allowed:
        assert not any(p.search(text) for p in RUN_HISTORY.values()), text


def tallies(text: str) -> list[tuple[int, str]]:
    """(line, what) of each tally in ``text``, scanned across line breaks, tested bounds left out."""
    kept = TESTED_BOUND.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    return sorted((kept.count("\n", 0, hit.start()) + 1, what) for what, pattern in TALLIES.items()
                  for hit in pattern.finditer(kept))


def test_tally_patterns_are_caught() -> None:
    """The tally patterns match measured figures (so the scan below can fail), not contracts: stated bounds a test
    holds, quantiles, rates, a derived bound, counts of zero."""
    samples = {"a measured figure": ["measured 3.1 % over 64 networks", "(measured within 1 %)", "measured: 0.6 %",
                                     "measured > 99% at depth 48", "the measured correlation (−0.028 to +0.014)",
                                     "≤ 3e-7 relative to h = 0.2 for L = 128 (measured)",
                                     "≤ 1e-4 relative difference measured"],
               "a count of networks": ["(mean of 4 networks)", "over 64 networks", "against 1,500 networks",
                                       "3 seeds", "64 other networks"],
               "an error at a point": ["err 2.3 % at L=48", "+12% at V = 30522", "4 % low at e = 0.1",
                                       "81 % high", "off by 2.5% at d_in = 8", "misses by about 3"],
               "an approximate figure": ["cross terms ~5%", "≈ 3 % of G", "miss the gradient by up to 29 %"],
               "a Monte-Carlo figure": ["matches Monte Carlo of a real layer to 2%", "< 1% in Monte Carlo",
                                        "within 2.6 % of Monte Carlo"]}
    for what, texts in samples.items():
        for text in texts:
            assert what in {w for _, w in tallies(text)}, (what, text)
    allowed = ["within 5 % (tests/test_x.py)", "≤ 5 % of Monte Carlo at L = 16 (tests/test_moments_x.py)",
               "the gradient within 3 % + 4 s.e. of Monte Carlo at every position\n(tests/test_moments_causal.py)",
               "the 5–95 % band", "10 % warmup", "keep that bias under 1 %", "(no values: NaN, 0 seeds)",
               "measured at init (float64)", "15 % masking", "gap ≤ +5 %", "seeds: the networks' seeds",
               "the median relative error within `BAR`", "the measured records", "predicted/measured − 1",
               "within 0.03 of the layer's output correlation (tests/test_moments_dslm.py)"]
    for text in allowed:
        assert not tallies(text), (text, tallies(text))


def test_package_docstrings_state_no_tallies() -> None:
    files = [p for p in shipped_files() if p.is_relative_to(ROOT / "src") and p.suffix == ".py"]
    assert len(files) > 50, "the scan found too few files: is the layout different?"
    hits = [f"{path.relative_to(ROOT)}:{n}: {what}" for path in files for n, what in tallies(path.read_text("utf-8"))]
    assert not hits, ("tallies in the package (move the figure to docs/, or state the bound a test holds and name "
                      "the test):\n" + "\n".join(hits))


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


def test_package_code_carries_no_run_history() -> None:
    files = [p for p in shipped_files() if p.is_relative_to(ROOT / "src")]
    assert len(files) > 50, "the scan found too few files: is the layout different?"
    hits = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in RUN_HISTORY.items():
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:100]}")
    assert not hits, "run history in the package (move the figures to docs/ or bench/RESULTS.md):\n" + "\n".join(hits)
