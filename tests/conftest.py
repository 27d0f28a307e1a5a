"""One intra-op thread: the suite's tensors are small, and on a shared 2-core machine a second
thread makes them slower, not faster. Results do not depend on it. Also the fixtures several test
files share: the check every claim runner's output must pass (`claim_outputs`) and one quick demo run
(`quick_demo`)."""
import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

torch.set_num_threads(1)

VERDICTS = ("reproduced", "partly", "not reproduced")


@pytest.fixture
def claim_outputs():
    """check(out_dir, name, summary, keys) -> saved JSON: NAME.{json,png,md} exist and are non-empty, the
    JSON holds ``summary``, which has the contract's keys (+ ``keys``) and a valid verdict, and the
    Markdown section starts with ``## NAME — `` and states the verdict."""
    def check(out_dir: Path, name: str, summary: dict, keys: tuple = ()) -> dict:
        for ext in ("json", "png", "md"):
            assert (out_dir / f"{name}.{ext}").stat().st_size > 0, ext
        saved = json.loads((out_dir / f"{name}.json").read_text())
        assert saved["summary"]["verdict"] == summary["verdict"]
        assert {"verdict", "verdict_reason", "seeds", "wall_s", *keys} <= set(summary)
        assert summary["verdict"] in VERDICTS
        md = (out_dir / f"{name}.md").read_text()
        assert md.startswith(f"## {name} — ") and f"**Verdict: {summary['verdict']}.**" in md
        return saved
    return check


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
    """`sigprop demo --quick` run once: ``.out`` its folder, ``.stdout`` what it printed."""
    from sigprop.cli import main
    out, text = tmp_path_factory.mktemp("demo"), io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["demo", "--quick", "--out", str(out)]) == 0
    return SimpleNamespace(out=out, stdout=text.getvalue())
