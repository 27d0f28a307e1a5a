"""How training erodes the shortcut of DeepScaleLM's 192-layer Post-LN decoder during warmup
(docs/RESULTS_discussion.md, dslm-postln-horizon).

The model and data are those of the claim (width 64, 4 heads, seq 32, batch 8, tuning seed 100); every few steps the
trainer logs each post-norm sublayer's shortcut factor s (`sigprop.diagnostics.shortcut`), and the *deficit*
D = −Σ log10 s (`shortcut_deficit`) says by how many decades the shortcut alone scales a gradient from the top of
the stack to its bottom.

*The first phase is predicted by the first step.* Adam's first updates are m̂/√v̂ ≈ ±1 per coordinate while
the gradient keeps its sign, so after t steps the weights have moved by S(t) = Σ_{τ<t} η_τ along AdamW's first
direction d₀, whatever peak lr and warmup made the sum: D after lr sum S is D(θ₀ + S·d₀), read before any step
(`sigprop.advice.probe.along_first_step`). Measured: up to S = 0.001 three schedules (peak lrs 3e-4 … 3.3e-3,
warmups 30 … 500, 14 to 100 steps to reach that sum) follow it within 0.1 decade
(`test_the_first_step_predicts_the_deficit_while_the_gradient_keeps_its_sign`); at equal step counts they differ.

*The second phase is not.* Once the gradient turns, the first direction overstates the growth, and by how much
depends on how many steps the sum took: at S = 0.005 it predicts 2.4 decades where the slow ramp (3e-4 / 500)
measures 1.26 and the fast one (1e-3 / 30) 2.03 (`test_the_first_step_beyond_the_first_phase`, a strict xfail: a
rate law of the second phase is not derived). Whether the shortcut recovers or runs away follows the lr summed
over the first 100 steps (`table`; docs/RESULTS_discussion.md).

    cd tests && OMP_NUM_THREADS=1 python -c "from test_shortcut_growth import table; table()"   # ~25 min
"""
from __future__ import annotations

import numpy as np
import pytest

from sigprop.advice.advise import lm_loss, run_inputs
from sigprop.advice.probe import along_first_step
from sigprop.diagnostics.shortcut import shortcut_deficit, shortcut_factors
from sigprop.experiments import postln_horizon
from sigprop.experiments.tuning import TUNING_SEED
from sigprop.train.config import OptimConfig, RunConfig, from_mapping
from sigprop.train.one_run import train_run
from sigprop.train.schedules import lr_at

pytestmark = pytest.mark.slow

STEPS = 2000                                 # the claim's horizon: the schedule's shape (warmup, then cosine)
FIRST = (0.0006, 0.001)                      # cumulative lrs inside the first phase
LATER = 0.005                                # one in the second


def claim_tables() -> dict:
    """The run-config tables of the claim's DSLM Post-LN model."""
    return next(m for m in postln_horizon.models(postln_horizon.FULL) if m.key == "dslm-postln").run_config


def first_step_deficits(out_dir, sums) -> list[float]:
    """D(θ₀ + S·d₀) for each S of ``sums``: the claim's model at init on its first training batch (tuning seed)."""
    tables = claim_tables()
    cfg = from_mapping(RunConfig, {**tables, "train": {**tables["train"], "out_dir": str(out_dir),
                                                       "seed": TUNING_SEED}})
    inputs = run_inputs(cfg)

    def deficit(model) -> float:
        with shortcut_factors(model) as factors:
            model(*inputs.heldout.inputs)
        return shortcut_deficit(factors)
    return along_first_step(inputs.model, inputs.groups, lm_loss(), inputs.train, sums, deficit)


def deficits(out_dir, lr: float, warmup: int, stop: int, every: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train the claim's DSLM Post-LN model at peak ``lr`` and ``warmup`` for ``stop`` steps of its 2000-step
    schedule, logging every ``every`` steps; returns (steps, cumulative lr S, deficit D) at each log. A log of step k
    is read in the forward of that step, after k − 1 updates: S sums the lrs of those."""
    tables = claim_tables()
    optim = {**tables["optim"], "lr": lr, "warmup_steps": warmup}
    train = {**tables["train"], "stop_at": stop, "eval_every": every}
    r = train_run(out_dir, tables["model"], tables["data"], optim, train, seed=TUNING_SEED)
    cfg = OptimConfig(lr=lr, warmup_steps=warmup, decay=optim["decay"])
    cumulative = np.concatenate([[0.0], np.cumsum([lr_at(s, STEPS, cfg) for s in range(stop)])])
    steps = np.array([step for step, _ in r["shortcut_factors"]])
    return steps, cumulative[steps - 1], np.array([shortcut_deficit(fs) for _, fs in r["shortcut_factors"]])


def at(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """ys at x, linear between logs (x within the logged range)."""
    assert xs[0] <= x <= xs[-1], (x, xs[0], xs[-1])
    return float(np.interp(x, xs, ys))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[float, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Three schedules, each to S = 0.005: a slow ramp, a fast ramp and a large lr over a long warmup."""
    out = tmp_path_factory.mktemp("growth")
    plan = {(3e-4, 500): (132, 4), (1e-3, 30): (20, 1), (3.33e-3, 500): (45, 1)}
    return {key: deficits(out / f"{key[0]:g}-{key[1]}", *key, stop, every) for key, (stop, every) in plan.items()}


@pytest.fixture(scope="module")
def predicted(tmp_path_factory) -> dict[float, float]:
    sums = (*FIRST, LATER)
    return dict(zip(sums, first_step_deficits(tmp_path_factory.mktemp("first-step"), sums)))


def test_the_first_step_predicts_the_deficit_while_the_gradient_keeps_its_sign(runs, predicted):
    """Up to S = 0.001 each schedule's deficit is D(θ₀ + S·d₀) within 0.1 decade (its growth from init ≈ 0.4),
    while at equal step counts the schedules differ by more than 0.3."""
    for S in FIRST:
        for key, (_, s, d) in runs.items():
            assert abs(at(S, s, d) - predicted[S]) <= 0.1, (S, key, at(S, s, d), predicted[S])
    first = [d[0] for _, _, d in runs.values()]
    assert min(predicted[0.001] - f for f in first) >= 0.25, (first, predicted)
    by_step = [at(15, t, d) for t, _, d in runs.values()]
    assert max(by_step) - min(by_step) >= 0.3, by_step


@pytest.mark.xfail(strict=True, reason="second phase: at S = 0.005 the first step predicts 2.4 decades, the slow "
                   "ramp measures 1.3; its rate law is not derived")
def test_the_first_step_beyond_the_first_phase(runs, predicted):
    for key, (_, s, d) in runs.items():
        assert abs(at(LATER, s, d) - predicted[LATER]) <= 0.1, (key, at(LATER, s, d), predicted[LATER])


def table(out_dir: str = "/tmp/shortcut-growth", stop: int = 300) -> None:
    """The deficit at the first log (step 10) and at S = 0.0003 … 0.01, at 100 steps, and its peak and end over
    ``stop`` steps, for peak lrs 1e-4 … 3.33e-3 at warmups 500 and 30, and the lr summed over the first 100 steps;
    printed as Markdown."""
    print("| peak lr | warmup | S₁₀₀ = Σ_{t<100} η_t | D at step 10 | D at S = 0.0003, 0.001, 0.003, 0.01 "
          "| D at step 100 | peak D (step) | D at step 300 |")
    print("|---|---|---|---|---|---|---|---|")
    for warmup in (500, 30):
        for lr in (1e-4, 3e-4, 1e-3, 3.33e-3):
            t, s, d = deficits(f"{out_dir}/{lr:g}-{warmup}", lr, warmup, stop, 10)
            cfg = OptimConfig(lr=lr, warmup_steps=warmup, decay="cosine")
            s100 = sum(lr_at(k, STEPS, cfg) for k in range(100))
            cells = ", ".join(f"{at(x, s, d):.2f}" if s[0] <= x <= s[-1] else "–"
                              for x in (3e-4, 1e-3, 3e-3, 1e-2))
            k = int(np.argmax(d))
            print(f"| {lr:g} | {warmup} | {s100:.3g} | {d[0]:.2f} | {cells} | {at(100, t, d):.2f} | "
                  f"{d[k]:.2f} ({t[k]}) | {d[-1]:.2f} |")
