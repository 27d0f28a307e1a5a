import math

import pytest

from sigprop.experiments import entropy_collapse as ec


@pytest.mark.slow
def test_quick_run_writes_outputs(tmp_path, claim_outputs):
    s = ec.run(tmp_path, quick=True, show_progress=False)
    saved = claim_outputs(tmp_path, ec.NAME, s, ("models", "lr_grid", "verdict_temperature"))
    log_t = math.log(ec.DATA["seq_len"])
    (lr,) = s["lr_grid"]
    key = f"{lr:g}"
    for label, m in s["models"].items():
        assert {"lr_grid", "best_lr", "seeds", "final_loss"} <= set(m)
        (e,), (low,) = m["final_entropy"][key], m["final_min_entropy"][key]
        assert 0.0 < low <= e <= log_t + 1e-6, label
        (logits,), (rms,) = m["max_logit"][key], m["stream_rms"][key]
        assert len(logits) == 2 and all(x > 0 for x in rms), label          # 2 layers; every sublayer's stream
        assert math.isfinite(m["final_loss"][key][0]), label
        curve = saved["data"][label]["entropy"][key]
        assert len(curve["step"]) == len(curve["mean_entropy"]) > 1
    assert s["verdict"] == "inconclusive"            # one lr, one seed: the rule needs three of each
    assert ec.judge(saved["summary"])[0] == s["verdict"]


def test_threshold_and_models():
    assert math.isclose(ec.threshold(64), 0.1 * math.log(64))
    assert len(ec.LARGE_LRS) >= 3 and len(ec.SEEDS) >= 3
    assert {m.get("qk_scaling") for m in ec.MODELS.values()} == {None, "init", "temperature"}


def test_final_state_averages_over_layers():
    rows = [{"fwd_var": 1.0, "fwd_mean": 0.0, "attn_entropy": e, "max_logit": 2.0} for e in (1.0, 3.0)]
    s = ec.final_state({"diag_layers": [[0, rows]]})
    assert s["entropy"] == 2.0 and s["min_entropy"] == 1.0 and s["stream_rms"] == [1.0, 1.0]
    assert math.isnan(ec.final_state({"diag_layers": []})["entropy"])
