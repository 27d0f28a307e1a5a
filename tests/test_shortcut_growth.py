"""How training erodes the shortcut of DeepScaleLM's 192-layer Post-LN decoder during warmup
(docs/RESULTS_discussion.md, dslm-postln-horizon).

The model and data are those of the claim (width 64, 4 heads, seq 32, batch 8, tuning seed 100); every few steps the
trainer logs each post-norm sublayer's shortcut factor s (`sigprop.diagnostics.shortcut`), and the *deficit*
D = −Σ log10 s (`shortcut_deficit`) says by how many decades the shortcut alone scales a gradient from the top of
the stack to its bottom.

*The first phase is a function of the cumulative lr.* Adam's first updates are m̂/√v̂ ≈ ±1 per coordinate while
the gradient keeps its sign, so after t steps every weight has moved by S(t) = Σ_{τ<t} η_τ in a fixed direction,
whatever the peak lr and warmup that made the sum: the branches' growth against the shortcut, and so D, are then
functions of S alone. Measured: up to S = 0.001 the deficits of peak lrs 3e-4 … 3.3e-3 and warmups 30 … 500 agree
(`test_the_deficit_first_grows_with_the_cumulative_lr`), though the step counts that reach the same S differ by 5×;
at equal step counts they do not.

*The second phase is not.* Past S ≈ 0.002 a fast ramp (large η/W) erodes the shortcut further per unit lr than a
slow one: the first-phase law predicts the same deficit at S = 0.005 for every schedule, where the 3e-4 / 500 run
measures 1.26 decades and the 1e-3 / 30 run 2.03 (`test_the_cumulative_lr_law_beyond_the_first_phase`, a strict
xfail: a rate law of the second phase is not derived). Whether the shortcut recovers or runs away follows the lr
summed over the first 100 steps (`table`; docs/RESULTS_discussion.md).

    cd tests && OMP_NUM_THREADS=1 python -c "from test_shortcut_growth import table; table()"   # ~25 min
"""
from __future__ import annotations

import numpy as np
import pytest

from sigprop.diagnostics.shortcut import shortcut_deficit
from sigprop.experiments import postln_horizon
from sigprop.experiments.tuning import TUNING_SEED
from sigprop.train.config import OptimConfig
from sigprop.train.one_run import train_run
from sigprop.train.schedules import lr_at

pytestmark = pytest.mark.slow

STEPS = 2000                                 # the claim's horizon: the schedule's shape (warmup, then cosine)
FIRST = (0.0006, 0.001)                      # cumulative lrs inside the first phase
LATER = 0.005                                # one in the second


def deficits(out_dir, lr: float, warmup: int, stop: int, every: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train the claim's DSLM Post-LN model at peak ``lr`` and ``warmup`` for ``stop`` steps of its 2000-step
    schedule, logging every ``every`` steps; returns (steps, cumulative lr S, deficit D) at each log. A log of step k
    is read in the forward of that step, after k − 1 updates: S sums the lrs of those."""
    model = next(m for m in postln_horizon.models(postln_horizon.FULL) if m.key == "dslm-postln")
    tables = model.run_config
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


def test_the_deficit_first_grows_with_the_cumulative_lr(runs):
    """Up to S = 0.001 the three schedules' deficits agree within 0.1 decade (their growth from init ≈ 0.4), while
    at equal step counts they differ by more than 0.3."""
    for S in FIRST:
        ds = [at(S, s, d) for _, s, d in runs.values()]
        assert max(ds) - min(ds) <= 0.1, (S, ds)
    first = [d[0] for _, _, d in runs.values()]
    grown = [at(0.001, s, d) for _, s, d in runs.values()]
    assert min(g - f for g, f in zip(grown, first)) >= 0.25, (first, grown)
    step = 15
    by_step = [at(step, t, d) for t, _, d in runs.values()]
    assert max(by_step) - min(by_step) >= 0.3, by_step


@pytest.mark.xfail(strict=True, reason="second phase: at S = 0.005 the fast ramp's deficit exceeds the slow one's "
                   "by about 0.8 decade; its rate law is not derived")
def test_the_cumulative_lr_law_beyond_the_first_phase(runs):
    ds = [at(LATER, s, d) for _, s, d in runs.values()]
    assert max(ds) - min(ds) <= 0.1, ds


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
