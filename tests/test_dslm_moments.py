"""Smoke run of the DeepScaleLM signal-propagation experiment at tiny size.

The full run and its numbers: docs/RESULTS_dslm_moments.md."""
from __future__ import annotations

import json
from pathlib import Path

from sigprop.experiments import dslm_moments


def test_quick_run_writes_results_figures_and_section(tmp_path: Path) -> None:
    out = dslm_moments.run(tmp_path, quick=True)
    assert set(out["summary"]) == set(dslm_moments.CONFIGS)
    assert out["meta"]["depth"] == 4 and out["meta"]["seeds"] == 2
    for name in ("results.json", "section.md", "dslm_moments_preln.png", "dslm_moments_postln.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    saved = json.loads((tmp_path / "results.json").read_text())
    for name, s in saved["summary"].items():
        n = len(saved["records"][name]["measured"])
        assert n == len(saved["records"][name]["predicted"]) == 1 + 2 * 4
        assert s["fwd_var"]["measured_range"][0] > 0 and s["grad_var"]["predicted_range"][1] >= 1.0 - 1e-12
    post = saved["summary"]["Post-LN DSLM"]["fwd_var"]
    assert abs(post["measured_range"][0] - 1) < 1e-2 and abs(post["measured_range"][1] - 1) < 1e-2  # LayerNorm outputs
    assert (tmp_path / "section.md").read_text().count("\n| ") == 1 + len(dslm_moments.CONFIGS)
