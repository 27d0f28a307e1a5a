"""depth-transfer: the verdict rule on hand-made panels, and the quick run end to end."""
import pytest

from sigprop.experiments import depth_transfer as dt


def panel(lo, hi, edge=(False, False)):
    return {"best_lr": [lo, hi], "edge": list(edge)}


@pytest.mark.parametrize("p,status", [
    (panel(4e-3, 8e-3), "transfers"), (panel(4e-3, 2e-3), "transfers"), (panel(4e-3, 1e-3), "moves"),
    (panel(4e-3, 1.6e-2), "moves"), (panel(4e-3, 4e-3, (False, True)), "undetermined"), (panel(None, 4e-3), "undetermined"),
])
def test_transfer_status(p, status):
    assert dt.transfer_status(p) == status


def statuses(depth_default, **over):
    d = {k: depth_default for k in dt.VARIANTS}
    d.update({k.replace("_", "-"): v for k, v in over.items()})
    return d


@pytest.mark.parametrize("depth,width,expected", [
    (statuses("transfers", **{"Pre-LN": "moves"}), {"standard": "transfers", "μP": "transfers"}, "reproduced"),
    (statuses("transfers"), {"standard": "moves", "μP": "transfers"}, "reproduced"),
    (statuses("transfers"), {"standard": "transfers", "μP": "transfers"}, "partly"),      # the baseline does not move
    (statuses("moves", CompleteP="transfers"), {"standard": "moves", "μP": "moves"}, "partly"),
    (statuses("undetermined"), {"standard": "moves", "μP": "undetermined"}, "not reproduced"),
])
def test_verdict_rule(depth, width, expected):
    assert dt.verdict(depth, width)[0] == expected


@pytest.mark.slow
def test_quick_run(tmp_path, claim_outputs):
    summary = dt.run(tmp_path, quick=True)
    claim_outputs(tmp_path, dt.NAME, summary, ("panels", "sizes"))
    assert set(summary["panels"]) == {*dt.VARIANTS, *(f"width {k}" for k in dt.WIDTH_VARIANTS)}
    assert (tmp_path / f"{dt.NAME}-best-lr.png").stat().st_size > 0
