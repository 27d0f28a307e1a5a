"""The claims' verdict rules on synthetic numbers: every outcome of every rule, and the shared tuning rule."""
import math

import pytest

from sigprop.experiments import verdicts as v

GRID = [1e-3, 3e-3, 1e-2]


def tuned(final, tuning=(5.0, 4.0, 4.5), seeds=(0, 1, 2), tuning_seed=100, grid=GRID, **extra):
    """A tuned model: best lr in the middle of its grid unless ``tuning`` says otherwise."""
    return {"lr_grid": list(grid), "tuning_loss": list(tuning), "tuning_seed": tuning_seed, "seeds": list(seeds),
            "final_loss": list(final), **extra}


def test_best_lr_and_edges():
    assert v.best_lr(GRID, [5.0, 4.0, 4.5]) == (3e-3, False)
    assert v.best_lr(GRID, [5.0, 4.5, 4.0]) == (1e-2, True)
    assert v.best_lr(GRID, [4.0, math.nan, math.inf]) == (1e-3, True)
    assert v.best_lr(GRID, [math.nan] * 3) == (None, False)
    assert v.best_lr([1e-3], [4.0]) == (1e-3, True)


def test_tuning_problems_name_each_failure():
    assert v.tuning_problems("m", tuned([4, 4, 4]), 3) == []
    assert "edge" in v.tuning_problems("m", tuned([4, 4, 4], tuning=(5, 4.5, 4)), 3)[0]
    assert "diverged" in v.tuning_problems("m", tuned([4, 4, 4], tuning=(math.nan,) * 3), 3)[0]
    assert "also scored" in v.tuning_problems("m", tuned([4, 4, 4], tuning_seed=0), 3)[0]
    assert "scored seed(s)" in v.tuning_problems("m", tuned([4, 4], seeds=(0, 1)), 3)[0]


@pytest.mark.parametrize("shaped, expected", [
    ({"a": [4.1, 4.2, 4.0], "b": [4.0, 4.0, 4.1]}, "reproduced"),          # both within +5 %
    ({"a": [4.1, 4.2, 4.0], "b": [4.6, 4.6, 4.6]}, "partly"),              # one within +5 %
    ({"a": [4.3, 4.3, 4.3], "b": [4.35, 4.35, 4.35]}, "partly"),           # all within +10 %
    ({"a": [4.3, 4.3, 4.3], "b": [4.6, 4.6, 4.6]}, "not reproduced"),
    ({"a": [4.0, math.nan, 4.0], "b": [4.6, 4.6, 4.6]}, "not reproduced"),  # a diverged seed fails its variant
])
def test_shaped_vs_preln_outcomes(shaped, expected):
    models = {"Pre-LN": tuned([4.0, 4.0, 4.0]), **{k: tuned(x) for k, x in shaped.items()}}
    assert v.shaped_vs_preln(models)[0] == expected


def test_shaped_vs_preln_inconclusive():
    good = {"Pre-LN": tuned([4.0] * 3), "a": tuned([4.0] * 3)}
    assert v.shaped_vs_preln({**good, "Pre-LN": tuned([4.0] * 3, tuning=(5, 4.5, 4))})[0] == "inconclusive"
    assert v.shaped_vs_preln({**good, "a": tuned([4.0] * 2, seeds=(0, 1))})[0] == "inconclusive"
    assert v.shaped_vs_preln({**good, "Pre-LN": tuned([4.0, math.nan, 4.0])})[0] == "inconclusive"


LIMIT = 0.4


@pytest.mark.parametrize("pre, shaped, expected", [
    ({0.01: [2, 2, 2], 0.03: [0.1, 0.2, 0.3], 0.1: [0.1, 0.1, 0.1]},
     {0.01: [2, 2, 2], 0.03: [1, 1, 1], 0.1: [0.9, 1, 1]}, "reproduced"),
    ({0.01: [2, 2, 2], 0.03: [0.1, 0.2, 0.5], 0.1: [2, 2, 2]},              # mean below, one seed above
     {0.01: [2, 2, 2], 0.03: [1, 1, 1], 0.1: [1, 1, 1]}, "partly"),
    ({0.01: [2, 2, 2], 0.03: [0.1, 0.2, 0.3], 0.1: [0.1, 0.1, 0.1]},        # shaped collapses at 0.1 too
     {0.01: [2, 2, 2], 0.03: [1, 1, 1], 0.1: [0.1, 0.1, 0.2]}, "partly"),
    ({0.01: [2, 2, 2], 0.03: [0.1, 0.2, 0.3], 0.1: [0.1, 0.1, 0.1]},
     {0.01: [2, 2, 2], 0.03: [0.1, 0.3, 0.2], 0.1: [0.1, 0.1, 0.2]}, "not reproduced"),
    ({0.01: [2, 2, 2], 0.03: [0.1, 0.2, 0.3], 0.1: [0.1, 0.1, 0.1]},        # a NaN shaped seed counts as collapsed
     {0.01: [2, 2, 2], 0.03: [1, math.nan, 1], 0.1: [1, 1, math.nan]}, "not reproduced"),
    ({0.01: [2, 2, 2], 0.03: [1, 1, 1], 0.1: [0.5, 0.6, 0.5]},              # Pre-LN never collapses
     {0.01: [2, 2, 2], 0.03: [1, 1, 1], 0.1: [1, 1, 1]}, "inconclusive"),
    ({0.03: [0.1, 0.2, 0.3], 0.1: [0.1, 0.1, 0.1]},                         # two lrs only
     {0.03: [1, 1, 1], 0.1: [1, 1, 1]}, "inconclusive"),
    ({0.01: [2, 2], 0.03: [0.1, 0.2], 0.1: [0.1, 0.1]},                      # two seeds only
     {0.01: [2, 2], 0.03: [1, 1], 0.1: [1, 1]}, "inconclusive"),
])
def test_entropy_collapse_outcomes(pre, shaped, expected):
    assert v.entropy_collapse(pre, {"shaped": shaped}, LIMIT)[0] == expected


def test_trains_needs_a_margin_below_unigram():
    assert v.trains(5.1, 5.2) and v.trains(5.0, 5.2)
    assert not v.trains(5.15, 5.2) and not v.trains(math.nan, 5.2)


def dslm_case(dslm_final, std_final, deep_final=(5.0,), std_tuning=(5.0, 5.0, 5.0), steps=300, **dslm_extra):
    u = 5.25
    grid = {"lr_grid": GRID, "tuning_seed": 100, "tuning_unigram": u}
    dslm = {"preln": {**grid, "tuning_loss": [5.3, 5.0, 5.1], "seeds": [0, 1], "final_loss": list(dslm_final),
                      "unigram": [u, u], **dslm_extra}}
    std = {"preln": {**grid, "tuning_loss": list(std_tuning), "seeds": [0, 1], "final_loss": list(std_final),
                     "unigram": [u, u]}}
    deep = {"DSLM preln depth 1000": {"seeds": [0], "final_loss": list(deep_final), "unigram": [u]}}
    return v.dslm_depth(dslm, std, deep, steps)[0]


def test_dslm_depth_outcomes():
    assert dslm_case([5.0, 5.05], [5.24, math.nan]) == "reproduced"          # standard stalls and diverges
    assert dslm_case([5.0, 5.05], [5.0, 5.3]) == "partly"                     # one standard seed fails
    assert dslm_case([5.0, 5.05], [5.0, 5.0], std_tuning=(5.0, 5.3, 5.5)) == "partly"   # standard stable only lower
    assert dslm_case([5.0, 5.05], [5.0, 5.0]) == "not reproduced"             # standard trains as well
    assert dslm_case([5.0, 5.2], [5.3, 5.3]) == "not reproduced"              # a DSLM seed does not train
    assert dslm_case([5.0, 5.05], [5.3, 5.3], deep_final=(5.2,)) == "not reproduced"   # 1000 layers do not train
    assert dslm_case([5.0, 5.05], [5.3, 5.3], steps=80) == "inconclusive"
    assert dslm_case([5.0, 5.05], [5.3, 5.3], tuning_loss=[5.3, 5.1, 5.0]) == "inconclusive"   # DSLM lr at edge


def test_largest_stable_lr():
    m = {"lr_grid": GRID, "tuning_loss": [5.0, 5.1, math.nan], "tuning_unigram": 5.25}
    assert v.largest_stable_lr(m) == (3e-3, False)
    assert v.largest_stable_lr({**m, "tuning_loss": [5.0, 5.0, 5.0]}) == (1e-2, True)
    assert v.largest_stable_lr({**m, "tuning_loss": [5.3, 5.3, 5.3]}) == (None, False)


def pair(deep, wide, **kw):
    return {"deep-thin": tuned(deep, seeds=(0, 1), **kw), "shallow-wide": tuned(wide, seeds=(0, 1))}


def test_deep_thin_outcomes():
    win, lose = pair([3.0, 3.02], [3.2, 3.22]), pair([3.2, 3.22], [3.0, 3.02])
    tie = pair([3.0, 3.2], [3.05, 3.25])                                       # Δ 0.05 < se 0.1
    assert v.deep_thin({"a": win, "b": win})[0] == "reproduced"
    assert v.deep_thin({"a": win, "b": tie})[0] == "partly"
    assert v.deep_thin({"a": lose, "b": tie})[0] == "not reproduced"
    assert v.deep_thin({"a": pair([math.nan, 3.0], [3.2, 3.2])})[0] == "not reproduced"
    assert v.deep_thin({"a": win, "b": pair([3.0, 3.0], [3.2, 3.2], tuning=(5, 4.5, 4))})[0] == "inconclusive"
    assert v.deep_thin_gap(tie)["se"] == pytest.approx(math.hypot(0.2 / math.sqrt(2) / math.sqrt(2),
                                                                  0.2 / math.sqrt(2) / math.sqrt(2)))


@pytest.mark.parametrize("lrs, edges, status", [
    ((4e-3, 8e-3), (False, False), "transfers"), ((4e-3, 2e-3), (False, False), "transfers"),
    ((4e-3, 1e-3), (False, False), "moves"), ((4e-3, 1.6e-2), (False, False), "moves"),
    ((4e-3, 4e-3), (False, True), "undetermined"), ((None, 4e-3), (False, False), "undetermined"),
    ((4e-3, 8e-3, 4e-3), (False, True, False), "transfers"),         # only the ends are compared
])
def test_transfer_status(lrs, edges, status):
    assert v.transfer_status(lrs, edges) == status


def statuses(default, **over):
    d = {k: default for k in ("Pre-LN", "DSLM (Pre-LN)", "depth-μP", "CompleteP")}
    d.update({k.replace("_", "-"): s for k, s in over.items()})
    return d


@pytest.mark.parametrize("depth, width, expected", [
    (statuses("transfers", **{"Pre-LN": "moves"}), {"standard": "transfers", "μP": "transfers"}, "reproduced"),
    (statuses("transfers"), {"standard": "moves", "μP": "transfers"}, "reproduced"),
    (statuses("transfers"), {"standard": "transfers", "μP": "transfers"}, "partly"),      # the baseline does not move
    (statuses("moves", CompleteP="transfers"), {"standard": "moves", "μP": "moves"}, "partly"),
    (statuses("undetermined"), {"standard": "moves", "μP": "moves"}, "inconclusive"),
    (statuses("moves"), {"standard": "moves", "μP": "moves"}, "not reproduced"),
])
def test_depth_transfer_outcomes(depth, width, expected):
    assert v.depth_transfer(depth, width)[0] == expected
