"""depth-transfer: grid bracketing, the rule read back from a summary, and the quick run end to end."""
import math

import pytest

from sigprop.experiments import depth_transfer as dt


def group(lrs, loss):
    return {"lrs": lrs, "loss": loss}


def test_bracketing_lrs_extends_past_each_edge_once():
    inside = group([1e-3, 2e-3, 4e-3], [5.0, 4.0, 4.5])
    top = group([1e-3, 2e-3, 4e-3], [5.0, 4.5, 4.0])
    bottom = group([1e-3, 2e-3, 4e-3], [4.0, 4.5, math.inf])
    assert dt.bracketing_lrs([inside]) == []
    assert dt.bracketing_lrs([inside, top, top]) == [8e-3]
    assert dt.bracketing_lrs([top, bottom]) == [5e-4, 8e-3]
    assert dt.bracketing_lrs([group([1e-3, 2e-3], [math.inf, math.inf])]) == [5e-4]   # all diverged: go down


def panel(lo, hi, edge=(False, False)):
    return {"best_lr": [lo, hi], "edge": list(edge)}


def test_judge_reads_the_saved_panels():
    panels = {k: panel(4e-3, 8e-3) for k in dt.VARIANTS}
    panels["Pre-LN"] = panel(4e-3, 1e-3)
    panels |= {"width standard": panel(1.6e-2, 4e-3), "width μP": panel(1.6e-2, 1.6e-2)}
    assert dt.judge({"panels": panels})[0] == "reproduced"
    panels["width μP"] = panel(1.6e-2, 3.2e-2, (False, True))
    assert dt.judge({"panels": panels})[0] == "partly"


@pytest.mark.slow
def test_quick_run(tmp_path, claim_outputs):
    summary = dt.run(tmp_path, quick=True, show_progress=False)
    claim_outputs(tmp_path, dt.NAME, summary, ("panels", "sizes"))
    assert set(summary["panels"]) == {*dt.VARIANTS, *(f"width {k}" for k in dt.WIDTH_VARIANTS)}
    assert (tmp_path / f"{dt.NAME}-best-lr.png").stat().st_size > 0
    # a 2-lr grid always has its optimum at an edge, so the quick run extends every sweep once
    for p in summary["panels"].values():
        assert len(p["lr_grid"]) in (3, 4) and len(p["extended"]) == 1
        # each size's final loss per scored seed at its own best lr
        assert p["seeds"] == [0] and set(p["final_loss"]) == {str(n) for n in p["sizes"]}
        assert all(len(v) == 1 for v in p["final_loss"].values())
    assert dt.judge(summary) == (summary["verdict"], summary["verdict_reason"])
