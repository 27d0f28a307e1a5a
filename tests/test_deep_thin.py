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


def test_verdict_rule():
    assert deep_thin.verdict({"a": True, "b": True}) == "reproduced"
    assert deep_thin.verdict({"a": True, "b": False}) == "partly"
    assert deep_thin.verdict({"a": False, "b": False}) == "not reproduced"
    stats = lambda m, s: {"mean": m, "std": s, "se": s}  # noqa: E731
    pair = lambda d, w: {"deep-thin": {"final_val_loss": d}, "shallow-wide": {"final_val_loss": w}}  # noqa: E731
    assert deep_thin.compare(pair(stats(1.0, 0.03), stats(1.1, 0.04)))["deep_wins"]        # 0.1 > 0.05
    assert not deep_thin.compare(pair(stats(1.0, 0.09), stats(1.1, 0.12)))["deep_wins"]    # 0.1 < 0.15
    assert not deep_thin.compare(pair(stats(math.nan, 0.0), stats(1.1, 0.0)))["deep_wins"]  # diverged


@pytest.mark.slow
def test_quick_run(tmp_path, claim_outputs):
    s = deep_thin.run(tmp_path, quick=True, show_progress=False)
    saved = claim_outputs(tmp_path, "deep-thin", s, ("settings",))
    assert set(s["settings"]) == set(deep_thin.SETTINGS)
    for name, runs in saved["data"].items():
        for kind, rs in runs.items():
            for r in rs:
                assert not r["diverged"], (name, kind)
                assert r["final_val_loss"] < r["initial_val_loss"], (name, kind, r["val_curve"])
