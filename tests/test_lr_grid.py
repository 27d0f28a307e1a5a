"""The lr grid's best lr and edge, one grid step beyond it, seed statistics and the warmup default."""
import math

import pytest

from sigprop.train.lr_grid import best_lr, next_lr, step_beyond
from sigprop.train.schedules import default_warmup
from sigprop.train.seed_stats import seed_stats

GRID = [1e-3, 3e-3, 1e-2]


def test_best_lr_is_the_lowest_finite_loss_and_edges_are_flagged():
    assert best_lr(GRID, [5.0, 4.0, 4.5]) == (3e-3, False)
    assert best_lr(GRID, [5.0, 4.5, 4.0]) == (1e-2, True)
    assert best_lr(GRID, [4.0, math.nan, math.inf]) == (1e-3, True)          # diverged lrs are skipped
    assert best_lr(GRID, [4.0, 4.0, 5.0]) == (1e-3, True)                    # ties: the smallest lr
    assert best_lr(GRID, [math.nan, math.inf, math.nan]) == (None, False)    # every lr diverged


def test_a_one_lr_grid_is_at_its_edge():
    assert best_lr([3e-3], [4.0]) == (3e-3, True)
    with pytest.raises(ValueError, match="at least 2"):
        next_lr([3e-3], [4.0])


def test_one_step_beyond_is_the_outer_ratio_rounded_to_3_digits():
    assert step_beyond([1e-2, 3e-2, 1e-1], "up") == 0.333                    # not 0.3333…
    assert step_beyond([1e-2, 3e-2, 1e-1], "down") == 0.00333
    assert step_beyond([1e-3, 2e-3], "up") == 4e-3
    with pytest.raises(ValueError, match="direction"):
        step_beyond(GRID, "sideways")


def test_next_lr_extends_past_the_edge_holding_the_optimum():
    assert next_lr(GRID, [5.0, 4.0, 4.5]) is None
    assert next_lr(GRID, [5.0, 4.5, 4.0]) == (0.0333, "up")
    assert next_lr(GRID, [4.0, 4.5, 5.0]) == (0.000333, "down")
    assert next_lr(GRID, [math.nan] * 3) == (0.000333, "down")               # every lr diverged: go down


def test_seed_stats_and_its_divergence_rule():
    s = seed_stats([1.0, 2.0, 3.0])
    assert (s["mean"], s["std"], s["per_seed"]) == (2.0, 1.0, [1.0, 2.0, 3.0])
    assert s["se"] == pytest.approx(1 / math.sqrt(3))
    assert seed_stats([2.5])["std"] == 0.0 and seed_stats([2.5])["se"] == 0.0
    for bad in (math.nan, math.inf):                                          # a diverged seed: no mean
        s = seed_stats([1.0, bad])
        assert all(math.isnan(s[k]) for k in ("mean", "std", "se")) and s["per_seed"][0] == 1.0
    assert math.isnan(seed_stats([])["mean"])


def test_default_warmup_is_a_tenth_of_the_run():
    assert default_warmup(450) == 45 and default_warmup(300) == 30 and default_warmup(5) == 1
