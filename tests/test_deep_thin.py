import math

import pytest

from sigprop.experiments import deep_thin


def test_pairs_match_parameters():
    """Deep-thin has ≤ and within 10 % of shallow-wide's total parameters, and equal block weights."""
    for setting in deep_thin.SETTINGS.values():
        deep, wide = (deep_thin.model_table(setting, deep_thin.SHAPES[k]) for k in ("deep-thin", "shallow-wide"))
        ratio = deep_thin.param_count(deep) / deep_thin.param_count(wide)
        assert 0.9 <= ratio <= 1.0, (setting, ratio)
        ne = deep_thin.non_embedding_count(deep) / deep_thin.non_embedding_count(wide)
        assert abs(ne - 1) < 0.01, (setting, ne)


def test_settings_follow_the_rule():
    assert all(len(s.lrs) >= 3 for s in deep_thin.SETTINGS.values()) and len(deep_thin.SEEDS) >= 2
    assert all(deep_thin.SETTINGS[n].steps >= 2000 for n in ("decoder-preln", "decoder-postln"))


def test_gap_curve_is_shallow_minus_deep():
    run = lambda losses: {"diverged": False, "val_curve": [[i * 10, x] for i, x in enumerate(losses)]}
    c = deep_thin.gap_curve({"deep-thin": [run([5, 3]), run([5, 2])], "shallow-wide": [run([5, 4]), run([5, 4])]})
    assert c["step"] == [0, 10] and c["gap"] == [0, 1.5] and c["low"] == [0, 1] and c["high"] == [0, 2]


@pytest.mark.slow
def test_quick_run(tmp_path, claim_outputs):
    s = deep_thin.run(tmp_path, quick=True, show_progress=False)
    saved = claim_outputs(tmp_path, "deep-thin", s, ("settings", "tuning_seed"))
    assert set(s["settings"]) == set(deep_thin.SETTINGS)
    for name, runs in saved["data"].items():
        for kind, rs in runs.items():
            m = s["settings"][name]["models"][kind]
            assert {"lr_grid", "best_lr", "seeds", "final_loss"} <= set(m)
            for r in rs:
                assert not r["diverged"], (name, kind)
                assert r["final_val_loss"] < r["initial_val_loss"], (name, kind, r["val_curve"])
    for name, st in s["settings"].items():               # the context-free level of each text setting
        u = st["unigram_val_loss"]
        assert u is None if deep_thin.SETTINGS[name].arch == "vit" else 0 < u["mean"] < math.log(deep_thin.VOCAB)
    assert s["verdict"] == "inconclusive"                  # one lr, one seed
    assert deep_thin.judge(saved["summary"])[0] == s["verdict"]
