import math

import pytest

from sigprop.experiments import dslm_depth


@pytest.mark.slow
def test_run_quick(tmp_path, claim_outputs):
    s = dslm_depth.run(tmp_path, quick=True, show_progress=False)
    saved = claim_outputs(tmp_path, "dslm-depth", s, ("configs", "tuning_seed"))
    configs = s["configs"]
    assert len(configs) == 4 + 1                          # 4 at depth 192 (here 6), 1 deep
    dslm_lr = {c["norm"]: c["best_lr"] for c in configs.values() if c["scheme"] == "dslm" and "best_lr" in c}
    for key, c in configs.items():
        assert c["lr"] == dslm_lr[c["norm"]], key          # every scored run at DSLM's chosen lr
        assert len(c["trains"]) == len(c["seeds"]) == len(c["final_loss"]) == len(c["unigram"])
        if "lr_grid" in c:                                 # the 192-layer models: grid, tuning losses, stable lr
            assert len(c["lr_grid"]) == len(c["tuning_loss"]) and c["tuning_seed"] not in c["seeds"]
            assert c["largest_stable_lr"] is None or c["largest_stable_lr"] in c["lr_grid"]
        if c["scheme"] == "dslm":                         # DSLM at tiny size: finite, falling, gradients logged
            assert not any(c["diverged"]), key
            assert c["final_val_loss"]["mean"] < c["initial_val_loss"]["mean"], key
            assert all(math.isfinite(g["max"]) and g["max"] > 0 for g in c["grad_norm"]), key
    assert s["verdict"] == "inconclusive"                 # 12 steps, one seed: the rule needs 300 and two
    assert dslm_depth.judge(saved["summary"])[0] == s["verdict"]


def test_full_size_follows_the_rule():
    f = dslm_depth.FULL
    assert f["steps"] >= 300 and len(f["seeds"]) >= 2 and len(f["lrs"]) >= 3 and f["depth"] == 192
    t = dslm_depth.tables(f, "dslm", "preln", 192)
    assert t["optim"]["decay"] == "constant" and t["optim"]["warmup_steps"] == 30


def test_unknown_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown size"):
        dslm_depth.measure(tmp_path, quick=True, depht=3)
