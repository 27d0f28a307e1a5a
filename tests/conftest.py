"""One intra-op thread: the suite's tensors are small, and on a shared 2-core machine a second
thread makes them slower, not faster. Results do not depend on it. Also the fixtures several test
files share: the check every claim runner's output must pass (`claim_outputs`), one quick demo run
(`quick_demo`), measured networks at init (`measured_networks`) and the median error against them
(`median_error`), and tokens with a given correlation (`correlated_tokens`). Shared helpers that are not
fixtures live in helpers.py."""
import contextlib
import io
import json
import math
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest
import torch

from sigprop.experiments.verdicts import VERDICTS

torch.set_num_threads(1)

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


@pytest.fixture(scope="session")
def measured_networks():
    """measure(cfg, seeds, batch) -> (fwd, grad, first network's records): one fresh float64 model of ``cfg``
    per seed (``torch.manual_seed(seed)``, then ``batch(cfg)`` draws its input), measured at init by
    `diagnostics.measure`; fwd and grad are (seeds, points) arrays of the forward and stream-gradient
    variance. Cached per (cfg, seeds, batch) for the whole test run."""
    from sigprop.diagnostics import measure
    from sigprop.models import build_model

    @lru_cache(maxsize=None)
    def run(cfg, seeds: tuple, batch: Callable) -> tuple:
        runs = []
        for seed in seeds:
            torch.manual_seed(seed)
            runs.append(measure(build_model(cfg).double(), batch(cfg), seed=seed, attention_stats=False))
        fwd = np.array([[r.fwd_var for r in rs] for rs in runs])
        grad = np.array([[r.grad_var for r in rs] for rs in runs])
        return fwd, grad, runs[0]
    return run


@pytest.fixture(scope="session")
def median_error():
    """error(pred, samples) -> (median over points of |pred / mean − 1|, median relative standard error of the
    mean): ``pred`` (points,), ``samples`` (seeds, points)."""
    def error(pred: np.ndarray, samples: np.ndarray) -> tuple[float, float]:
        mean = samples.mean(0)
        return (float(np.median(np.abs(pred / mean - 1))),
                float(np.median(samples.std(0, ddof=1) / mean)) / math.sqrt(len(samples)))
    return error


@pytest.fixture(scope="session")
def correlated_tokens():
    """tokens(batch, seq, d, r, gen) -> (batch, seq, d) float64 unit-variance features with token correlation
    r: x_t = √r·s + √(1−r)·e_t, s shared by the tokens of a sequence, s and e_t standard normal."""
    def tokens(batch: int, seq: int, d: int, r: float, gen: torch.Generator) -> torch.Tensor:
        shared = torch.randn(batch, 1, d, generator=gen, dtype=torch.float64)
        return math.sqrt(r) * shared + math.sqrt(1 - r) * torch.randn(batch, seq, d, generator=gen,
                                                                       dtype=torch.float64)
    return tokens
