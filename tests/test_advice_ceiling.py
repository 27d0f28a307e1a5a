"""The ceiling of successive halving (`sigprop.advice.ceiling`): handed every bracket that holds the optimum, its
regret is that of the rung's leader, read off the grid runs."""
import json

import pytest

from sigprop.advice.benchmark import Config
from sigprop.advice.ceiling import main, placements, regrets, schedules
from sigprop.advice.halving import Schedule

STEPS = 100


def _config(cross: int) -> Config:
    """Three lrs whose middle one ends best (2.5); the largest leads every step before ``cross`` and then falls
    behind it for good; the smallest trails throughout."""
    def curve(lead: bool) -> tuple[float, ...]:
        return tuple(4.0 - 0.01 * s + (-0.2 if s < cross else 0.2) * lead for s in range(1, STEPS + 1))
    middle = tuple(4.0 - 0.01 * s for s in range(1, STEPS + 1))
    small = tuple(x + 0.5 for x in middle)
    return Config("synthetic", "{}", (1e-3, 3e-3, 1e-2), (3.0, 2.5, 2.8), (6.0, 6.0, 6.0), (False,) * 3, 5.0,
                  {"train": {"steps": STEPS}}, 1.0, (small, middle, curve(True)))


def test_each_bracket_that_holds_the_optimum_is_scored_and_the_early_leaders_miss_is_its_final_gap():
    c = _config(cross=40)
    assert placements(c, 2) == [3e-3, 1e-2]                 # brackets {1e-3, 3e-3} and {3e-3, 1e-2}
    assert placements(c, 3) == [3e-3]
    early, late = Schedule(2, (0.3,), (1,)), Schedule(2, (0.5,), (1,))
    assert regrets(c, early) == pytest.approx([0.0, 2.8 - 2.5])   # at step 30 the largest lr leads its bracket
    assert regrets(c, late) == pytest.approx([0.0, 0.0])          # at step 50 the best lr leads both


def test_a_config_without_curves_or_with_fewer_lrs_than_arms_is_left_out():
    c = _config(cross=40)
    assert regrets(Config(**{**c.__dict__, "curves": ()}), Schedule(2, (0.3,), (1,))) == []
    assert regrets(c, Schedule(5, (0.05,), (1,))) == []


def test_the_schedules_stay_within_the_cost_and_include_two_rung_ones():
    for cost in (0.2, 0.5):
        got = schedules(cost)
        assert got and all(s.extra <= cost + 1e-12 for s in got)
        assert [s.extra for s in got] == sorted(s.extra for s in got)
    assert Schedule(2, (0.5,), (1,)) in schedules(0.5) and Schedule(2, (0.5,), (1,)) not in schedules(0.4)
    assert any(len(s.rungs) == 2 for s in schedules(0.5))


def test_the_command_reads_a_benchmark_json_and_refuses_one_without_curves(tmp_path, capsys):
    c = _config(cross=40)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"configs": [c.__dict__], "results": {}}))
    main([str(path), "--cost", "0.5"])
    out = capsys.readouterr().out
    assert "| 2 lrs ×3 apart; 1 kept at 0.3 (extra 0.3 runs) | 0.3 | 0.300 | 0/1 | 0.150 | 50% |" in out
    path.write_text(json.dumps({"configs": [{**c.__dict__, "curves": []}], "results": {}}))
    with pytest.raises(SystemExit, match="no config with training curves"):
        main([str(path)])
