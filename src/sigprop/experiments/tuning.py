"""The learning-rate protocol every training claim follows: each compared model gets its own lr.

1. *Tune*: train the model at every lr of its grid on a tuning seed that is never scored.
2. *Bracket*: if the lowest final validation loss sits at an edge of the grid (or every lr diverged),
   add one lr one grid step beyond that edge (`sigprop.train.lr_grid.next_lr`; downward when every lr
   diverged), and repeat, at most ``max_extend`` times. Each extension is recorded;
   an optimum still at an edge makes the claim's verdict inconclusive (`sigprop.experiments.verdicts`).
3. *Score*: train the scored seeds at the chosen lr.

Runs go through `sigprop.train.sweep` (resumable; ``jobs`` worker processes): a claim's points share one
sweep folder, so a rerun skips finished points and every text run shares one tokenizer. Each record is the
sweep's line plus the run's curves (`read_run`).

    from sigprop.experiments.tuning import tune
    m = tune("runs/x/sweeps", run_config, [1e-3, 3e-3, 1e-2], tuning_seed=100, seeds=[0, 1, 2])
    m["best_lr"], m["lr_grid"], m["tuning_loss"], m["final_loss"], m["extended"]
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..console import UserError
from ..train.lr_grid import best_lr, next_lr
from ..train.run_summary import read_run
from ..train.sweep import SweepSpec, run_sweep

MAX_EXTEND = 2
TUNING_SEED = 100        # the seed every claim tunes on; the scored seeds are small integers


def sweep_runs(out: str | Path, run_config: Mapping[str, Any], lrs: Sequence[float], seeds: Sequence[int],
               jobs: int = 1) -> list[dict[str, Any]]:
    """Train ``run_config`` (run-config sections) at every lr × seed as one sweep in ``out`` (finished points
    are reused); one record per point, lr-major, with ``lr``, ``seed`` and the run's curves (`read_run`)."""
    spec = SweepSpec(dict(run_config), {"optim.lr": list(lrs), "seed": list(seeds)}, Path(out))
    out_records = []
    for r in run_sweep(spec, jobs=jobs, resume=True, progress=False):
        curves = read_run(r["config"]["train"]["out_dir"], r["error"])
        out_records.append({**r, **curves, "lr": r["point"]["optim.lr"], "seed": r["point"]["seed"]})
    return out_records


def tune(out: str | Path, run_config: Mapping[str, Any], grid: Sequence[float], tuning_seed: int,
         seeds: Sequence[int], jobs: int = 1, max_extend: int = MAX_EXTEND) -> dict[str, Any]:
    """The protocol above for one model; returns the tuned-model numbers the verdict rules read
    (``lr_grid``, ``tuning_loss``, ``tuning_seed``, ``best_lr``, ``seeds``, ``final_loss``), with
    ``at_edge``, ``extended`` (one line per added lr) and the records (``tuning_runs``, ``runs``)."""
    if tuning_seed in seeds:
        raise UserError(f"tuning_seed={tuning_seed} must not be one of the scored seeds {list(seeds)}")
    runs = {r["lr"]: r for r in sweep_runs(out, run_config, sorted(grid), [tuning_seed], jobs)}
    extended: list[str] = []
    while len(extended) < max_extend:
        lrs = sorted(runs)
        step = next_lr(lrs, [runs[x]["final_val_loss"] for x in lrs])
        if step is None:
            break
        new, direction = step
        runs[new] = sweep_runs(out, run_config, [new], [tuning_seed], jobs)[0]
        extended.append(f"best lr at the {'top' if direction == 'up' else 'bottom'} of "
                        f"{', '.join(f'{x:g}' for x in lrs)}: added {new:g}")
    lrs = sorted(runs)
    losses = [runs[x]["final_val_loss"] for x in lrs]
    lr, edge = best_lr(lrs, losses)
    scored = sweep_runs(out, run_config, [lr], seeds, jobs) if lr is not None and seeds else []
    return {"lr_grid": lrs, "tuning_loss": losses, "tuning_seed": tuning_seed, "best_lr": lr, "at_edge": edge,
            "extended": extended, "seeds": list(seeds), "final_loss": [r["final_val_loss"] for r in scored],
            "tuning_runs": [runs[x] for x in lrs], "runs": scored}


def layer_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The explaining quantities of one diagnostics measurement (`read_run`'s ``diag_layers`` rows): per
    attention sublayer its row entropy (averaged over rows, heads and batch) and largest logit, and per
    sublayer output the residual-stream RMS √(var + mean²)."""
    attn = [r for r in rows if r.get("attn_entropy") is not None]
    return {"attn_entropy": [r["attn_entropy"] for r in attn], "max_logit": [r["max_logit"] for r in attn],
            "stream_rms": [math.sqrt(r["fwd_var"] + r["fwd_mean"] ** 2) for r in rows]}

