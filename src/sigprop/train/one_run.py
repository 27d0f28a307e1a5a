"""One training run as a sweep or an experiment records it: the run, its outcome read back, its wall time.

    from sigprop.train.one_run import train_run
    r = train_run("runs/x/preln-s0", {"arch": "decoder", "scheme": "preln", "n_layers": 8},
                  optim={"lr": 1e-3}, train_cfg={"steps": 200}, seed=0)
    r["final_val_loss"], r["diverged"], r["val_curve"]

A NaN/Inf loss is a result, not a crash: the run stops (the trainer refuses the step) and comes back
with ``diverged = True`` and the message. An interruption (Ctrl-C, SIGTERM) is not a result: the trainer
checkpoints and `run_once` raises `sigprop.console.stopping.Stopped` (a KeyboardInterrupt), so a truncated run
is never recorded as finished.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from ..console.stopping import stopped_by
from .config import RunConfig, from_mapping
from .run_dir import clear
from .run_summary import read_run

# quiet, light runs: no inner progress bar (the caller shows one over runs), one checkpoint at the end
RUN_DEFAULTS = {"progress": False, "ckpt_every": 0, "keep_last": 1, "eval_batches": 4}


def run_once(cfg: RunConfig) -> dict[str, Any]:
    """Train ``cfg`` in its ``train.out_dir`` (fresh, or resumed where ``train.resume`` says) and return its
    `sigprop.train.run_summary.read_run` record (losses, ``diverged``, ``error``, curves) with ``wall_s``."""
    from .run import train  # in a sweep's worker: keeps the parent's import light
    from .trainer import NonFiniteLossError

    run_dir = Path(cfg.train.out_dir)
    start, error = time.perf_counter(), None
    try:
        trainer = train(cfg)
    except NonFiniteLossError as e:
        error = str(e)
    else:
        if trainer.stop_reason is not None:   # Ctrl-C / SIGTERM: the run saved itself; stop the caller too
            raise stopped_by(trainer.stop_reason, f"{run_dir}: interrupted ({trainer.stop_reason}) at step "
                                                  f"{trainer.state.step}; its checkpoint is saved")
    return {**read_run(run_dir, error), "wall_s": round(time.perf_counter() - start, 3)}


def train_run(out_dir: str | Path, model: Mapping[str, Any], data: Mapping[str, Any] | None = None,
              optim: Mapping[str, Any] | None = None, train_cfg: Mapping[str, Any] | None = None,
              seed: int = 0) -> dict[str, Any]:
    """Train a fresh model in ``out_dir`` (cleared first, `sigprop.train.run_dir.clear`) and return `run_once`'s
    record with ``seed`` and ``params`` (trainable parameters). Tables are `RunConfig` sections (`RUN_DEFAULTS`
    under ``train``); ``train.out_dir`` and ``train.seed`` are set here, every other key is validated as usual."""
    from ..models.build import param_count

    run_dir = Path(out_dir)
    clear(run_dir)
    raw = {"model": dict(model), "data": dict(data or {}), "optim": dict(optim or {}),
           "train": {**RUN_DEFAULTS, **dict(train_cfg or {}), "seed": seed, "out_dir": str(run_dir)}}
    cfg = from_mapping(RunConfig, raw)
    return {"seed": seed, "params": param_count(cfg.model), **run_once(cfg)}


__all__ = ["RUN_DEFAULTS", "run_once", "train_run"]
