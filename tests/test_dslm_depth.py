import math

import pytest

from sigprop.experiments import dslm_depth


@pytest.mark.slow
def test_run_quick(tmp_path, claim_outputs):
    s = dslm_depth.run(tmp_path, quick=True)
    saved = claim_outputs(tmp_path, "dslm-depth", s, ("configs",))
    configs = s["configs"]
    assert len(configs) == 4 + 2 + 1                      # 4 at depth 192 (here 6), 2 low-lr standard, 1 deep
    for key, c in configs.items():
        assert set(c["status"]) <= {"trains", "stalled", "diverged"}
        if c["scheme"] == "dslm":                         # DSLM at tiny size: finite, falling, gradients logged
            assert not any(c["diverged"]), key
            assert c["final_val_loss"]["mean"] < c["initial_val_loss"]["mean"], key
            assert all(math.isfinite(g["max"]) and g["max"] > 0 for g in c["grad_norm"]), key
    runs = saved["data"]["runs"]
    assert all(len(r["grad_curve"]) == r["steps_done"] for rs in runs.values() for r in rs)


def test_status_rule():
    base = {"diverged": False, "initial_val_loss": 7.0, "unigram_loss": 5.5}
    assert dslm_depth.status({**base, "diverged": True, "final_val_loss": math.nan}) == "diverged"
    assert dslm_depth.status({**base, "final_val_loss": 7.2}) == "diverged"
    assert dslm_depth.status({**base, "final_val_loss": 6.4}) == "stalled"          # P = 0.4
    assert dslm_depth.status({**base, "final_val_loss": 6.2}) == "trains"           # P = 0.53
    assert dslm_depth.status({**base, "final_val_loss": 6.2}, dslm_drop=2.0) == "stalled"   # Δ 0.8 < 0.5·2
