"""Successive halving over peak lrs (`sigprop.advice.halving`): its cost formula, its cuts, its rung loss, the
property the lr benchmark reads it off the grid runs by (an arm stopped at step n is the first n steps of the run),
and `sigprop advise` running it on the run itself within its budget."""
import math
import random

import pytest

from helpers import CONFIGS
from sigprop.advice.halving import (
    MAX_EXTRA,
    SCHEDULES,
    SPACING,
    Schedule,
    advise_by_halving,
    arm_folder,
    bracket,
    halve,
    rung_loss,
    rung_step,
    schedule_for,
    train_losses,
)
from sigprop.cli import main
from sigprop.train import load_config
from sigprop.train.logging import read_jsonl
from sigprop.train.one_run import run_once


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
def test_the_extra_cost_is_what_the_cut_arms_ran(schedule):
    steps, ran = 1000, {}
    lrs = bracket(1e-3, schedule.arms)
    rng = random.Random(0)
    loss = {lr: rng.random() for lr in lrs}

    def loss_at(lr, n):
        ran[lr] = max(ran.get(lr, 0), n)
        return loss[lr]
    survivor, log = halve(lrs, loss_at, schedule, steps)
    assert survivor == min(lrs, key=loss.get)
    assert sum(n for lr, n in ran.items() if lr != survivor) / steps == pytest.approx(schedule.extra)
    assert len(log) == schedule.arms + sum(schedule.keep[:-1])


def test_each_rung_keeps_the_lowest_losses_and_drops_non_finite_ones():
    s = Schedule(5, (0.1, 0.5), (2, 1))
    at = {0.1: {100: math.inf}, 0.03: {100: 1.0, 500: 0.9}, 0.01: {100: 2.0, 500: 0.5}, 0.003: {100: 3.0},
          0.001: {100: 4.0}}
    survivor, log = halve(list(at), lambda lr, n: at[lr][n], s, 1000)
    assert survivor == 0.01                      # second at the first rung, first at the second
    assert [x["lr"] for x in log[:5]] == [0.03, 0.01, 0.003, 0.001, 0.1]
    assert halve([1e-3, 1e-2], lambda lr, n: 1.0, Schedule(2, (0.1,), (1,)), 100)[0] == 1e-3    # a tie: smaller


def test_the_rung_loss_is_the_mean_of_the_last_window_and_inf_past_a_divergence():
    losses = {s: float(s) for s in range(1, 201)}
    assert rung_loss(losses, 100, 200) == pytest.approx(sum(range(97, 101)) / 4)   # w = ceil(0.02 × 200) = 4
    assert rung_loss(losses, 100, 100) == pytest.approx(sum(range(98, 101)) / 3)   # at least MIN_WINDOW steps
    assert rung_loss({1: 1.0, 2: math.nan, 3: 1.0}, 3, 10) == math.inf
    assert rung_loss({1: 1.0}, 3, 10) == math.inf                                 # stopped before step 3
    assert rung_step(0.05, 20) == 3 and rung_step(0.5, 300) == 150


def test_the_bracket_is_centred_and_spaced():
    assert bracket(1e-3, 3) == pytest.approx([1e-3 / SPACING, 1e-3, 1e-3 * SPACING])
    assert bracket(1e-3, 5)[2] == pytest.approx(1e-3)


@pytest.mark.parametrize("bad", [dict(arms=3, rungs=(0.2, 0.1), keep=(2, 1)), dict(arms=3, rungs=(0.1,), keep=(2,)),
                                 dict(arms=2, rungs=(0.1, 0.2), keep=(2, 1)), dict(arms=3, rungs=(1.0,), keep=(1,))])
def test_a_schedule_that_cannot_halve_is_refused(bad):
    with pytest.raises(ValueError, match="Schedule"):
        Schedule(**bad)


def test_every_candidate_schedule_fits_the_extra_budget():
    assert SCHEDULES and all(s.extra <= 0.4 + 1e-12 for s in SCHEDULES)


def test_an_arm_stopped_at_step_n_is_the_first_n_steps_of_the_run(tmp_path):
    """What the lr benchmark reads a halving off the grid runs by: the warmup and decay span the whole run, so a
    run stopped at step n (``train.stop_at``) trains exactly the first n steps of the full run, and resumed it
    goes on as the full run did."""
    sets = ["data.seq_len=16", "model.max_seq_len=16", "data.max_chars=30000", "model.vocab_size=300",
            "train.batch_size=8", "train.steps=12", "optim.warmup_steps=3", "optim.lr=0.003", "train.eval_every=6"]
    losses = {}
    for name, extra in (("full", []), ("arm", ["train.stop_at=5"])):
        cfg = load_config(CONFIGS / "tiny_decoder.toml", [*sets, *extra, f"train.out_dir={tmp_path / name}"])
        run_once(cfg)
        losses[name] = {r["step"]: r["loss"] for r in read_jsonl(tmp_path / name / "metrics.jsonl", "train")}
    assert sorted(losses["arm"]) == [1, 2, 3, 4, 5]
    assert [losses["arm"][s] for s in range(1, 6)] == pytest.approx([losses["full"][s] for s in range(1, 6)],
                                                                    rel=1e-6)
    cfg = load_config(CONFIGS / "tiny_decoder.toml", [*sets, "train.resume=true", f"train.out_dir={tmp_path / 'arm'}"])
    run_once(cfg)
    resumed = {r["step"]: r["loss"] for r in read_jsonl(tmp_path / "arm" / "metrics.jsonl", "train")}
    assert [resumed[s] for s in range(1, 13)] == pytest.approx([losses["full"][s] for s in range(1, 13)], rel=1e-6)


SMALL = ["data.seq_len=16", "model.max_seq_len=16", "data.max_chars=30000", "model.vocab_size=300",
         "train.batch_size=8", "train.steps=40", "optim.warmup_steps=4", "train.eval_every=20"]


def test_halving_on_the_run_is_halving_read_off_its_full_runs_and_its_survivor_goes_on_as_the_full_run(tmp_path):
    """`advise_by_halving` trains the arms to the rungs only (within the budget), keeps what the same halving
    read off the full runs at the arms' lrs keeps, and its survivor, resumed, ends where the full run ends."""
    cfg = load_config(CONFIGS / "tiny_decoder.toml", [*SMALL, f"train.out_dir={tmp_path / 'run'}"])
    a = advise_by_halving(cfg, 0.5, lrs=[1e-3, 1e2], out=tmp_path / "arms", progress=False)
    s = schedule_for(0.5)
    assert a.cost == pytest.approx(s.extra) and a.cost <= 0.5
    arms = sorted({r["lr"] for r in a.rungs})
    assert len(arms) == s.arms and arms[len(arms) // 2] == pytest.approx(a.target.recommended_lr, rel=0.01)
    ran = {lr: max(train_losses(arm_folder(cfg, lr, tmp_path / "arms"))) for lr in arms}
    assert sum(n for lr, n in ran.items() if lr != a.recommended_lr) / cfg.train.steps <= s.extra + 1e-9
    assert ran[a.recommended_lr] == a.resume_step == rung_step(s.rungs[-1], cfg.train.steps)
    full = {}
    for lr in arms:
        run_once(load_config(CONFIGS / "tiny_decoder.toml", [*SMALL, f"optim.lr={lr}",
                                                             f"train.out_dir={tmp_path / str(lr)}"]))
        full[lr] = train_losses(tmp_path / str(lr))
    lr, log = halve(arms, lambda lr, n: rung_loss(full[lr], n, cfg.train.steps), s, cfg.train.steps)
    assert lr == a.recommended_lr
    assert [x["loss"] for x in log] == pytest.approx([x["loss"] for x in a.rungs], rel=1e-6)
    assert [p["outcome"] for p in a.predictions] == [p["outcome"] for p in a.target.predictions]
    go_on = load_config(CONFIGS / "tiny_decoder.toml", [*SMALL, f"optim.lr={lr}", "train.resume=true",
                                                        f"train.out_dir={a.run_dir}"])
    run_once(go_on)
    assert train_losses(a.run_dir)[cfg.train.steps] == pytest.approx(full[lr][cfg.train.steps], rel=1e-6)
    again = advise_by_halving(cfg, 0.5, out=tmp_path / "arms", progress=False)    # a rerun reuses the arms
    assert again.recommended_lr == a.recommended_lr and again.cost_s < a.cost_s


def test_a_budget_below_the_cheapest_schedule_is_refused_and_the_cli_states_its_cost(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--budget 0.05: successive halving needs at least 0.1"):
        schedule_for(0.05)
    assert schedule_for(0.2).extra <= 0.2 and schedule_for(10).extra <= MAX_EXTRA
    tiny = str(CONFIGS / "tiny_decoder.toml")
    assert main(["advise", "--config", tiny, "--budget", "0.05"]) == 2
    assert "needs at least 0.1" in capsys.readouterr().err
    sets = [x for s in SMALL for x in ("--set", s)]
    assert main(["advise", "--config", tiny, *sets, "--out", str(tmp_path / "arms"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("successive halving: 3 lrs") and "besides the run it leaves" in out
    assert "recommended lr" in out and "to continue it: sigprop train" in out
