import math

import pytest

from sigprop.experiments import entropy_collapse as ec


@pytest.mark.slow
def test_quick_run_writes_outputs(tmp_path, claim_outputs):
    s = ec.run(tmp_path, quick=True, show_progress=False)
    saved = claim_outputs(tmp_path, ec.NAME, s, ("models", "lr"))
    log_t = math.log(ec.DATA["seq_len"])
    for label, m in s["models"].items():
        assert 0.0 < m["final_min_entropy"]["mean"] <= m["final_mean_entropy"]["mean"] <= log_t + 1e-6, label
        assert math.isfinite(m["final_val_loss"]["mean"]), label
        curve = saved["data"][label]["entropy"]
        assert len(curve["step"]) == len(curve["min_entropy"]) > 1
    md = (tmp_path / f"{ec.NAME}.md").read_text()
    assert md.startswith(f"## {ec.NAME} — ") and f"**Verdict: {s['verdict']}.**" in md


def test_verdict_rule():
    limit = ec.threshold(64)
    assert math.isclose(limit, 0.1 * math.log(64))
    assert ec.verdict({"Pre-LN": [0.2, 0.3], "shaped": [1.5, 2.0]}, limit)[0] == "reproduced"
    assert ec.verdict({"Pre-LN": [0.2, 0.5], "shaped": [1.5, 2.0]}, limit)[0] == "partly"
    assert ec.verdict({"Pre-LN": [0.2, 0.3], "shaped": [0.1, 0.5]}, limit)[0] == "not reproduced"
    assert ec.verdict({"Pre-LN": [0.2, 0.3], "shaped": [0.3, 2.0]}, limit)[0] == "partly"
    assert ec.verdict({"Pre-LN": [1.2, 1.3], "shaped": [1.5, 2.0]}, limit)[0] == "not reproduced"
