"""One short training run as an experiment sees it: a config from plain tables, the run, and its curves.

    from sigprop.experiments.training import train_run
    r = train_run("runs/x/preln-s0", {"arch": "decoder", "scheme": "preln", "n_layers": 8},
                  optim={"lr": 1e-3}, train_cfg={"steps": 200}, seed=0)
    r["final_val_loss"], r["diverged"], r["val_curve"]

A NaN/Inf loss is a result, not a crash: the run stops (the trainer refuses the step) and comes back
with ``diverged = True`` and the message. An interruption (Ctrl-C, SIGTERM) is not a result: the trainer
checkpoints and `train_run` raises `sigprop.console.stopping.Stopped` (a KeyboardInterrupt), so a truncated run
is never recorded as finished.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..console import UserError
from ..console.stopping import stopped_by
from ..models import ModelConfig
from ..models.build import ARCHITECTURES
from ..train.config import RunConfig, from_mapping
from ..train.run import train
from ..train.run_dir import clear
from ..train.run_summary import read_run
from ..train.trainer import NonFiniteLossError

# quiet, light runs: no inner progress bar (the experiment shows one over runs), one checkpoint at the end
RUN_DEFAULTS = {"progress": False, "ckpt_every": 0, "keep_last": 1, "eval_batches": 4}


def meta_model(model: ModelConfig | Mapping[str, Any]) -> torch.nn.Module:
    """The model a config builds, on the meta device (shapes only: no memory, no init)."""
    cfg = model if isinstance(model, ModelConfig) else ModelConfig.from_dict(dict(model))
    with torch.device("meta"):
        return ARCHITECTURES[cfg.arch](cfg)


def trainable(module: torch.nn.Module) -> int:
    """Number of trainable parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def param_count(model: ModelConfig | Mapping[str, Any]) -> int:
    """Trainable parameters of the model a config builds."""
    return trainable(meta_model(model))


def non_embedding_count(model: Mapping[str, Any]) -> int:
    """Trainable parameters outside the model's ``embed`` module (token/position tables, tied LM head; ViT patch
    projection, position table, class token)."""
    net = meta_model(model)
    return trainable(net) - trainable(net.embed)


def train_run(out_dir: str | Path, model: Mapping[str, Any], data: Mapping[str, Any] | None = None,
              optim: Mapping[str, Any] | None = None, train_cfg: Mapping[str, Any] | None = None,
              seed: int = 0) -> dict[str, Any]:
    """Train a fresh model in ``out_dir`` and return its record (JSON-ready):

    the run's `sigprop.train.run_summary.read_run` record (losses, ``diverged``, ``error``, curves) with
    ``seed``, ``params`` and ``wall_s``. Tables are `RunConfig` sections;
    ``train.out_dir`` and ``train.seed`` are set here, every other key is validated as usual.
    """
    run_dir = Path(out_dir)
    clear(run_dir)                        # a previous run of this experiment (`sigprop.train.run_dir.clear`)
    raw = {"model": dict(model), "data": dict(data or {}), "optim": dict(optim or {}),
           "train": {**RUN_DEFAULTS, **dict(train_cfg or {}), "seed": seed, "out_dir": str(run_dir)}}
    cfg = from_mapping(RunConfig, raw)
    start, error = time.perf_counter(), None
    try:
        trainer = train(cfg)
    except NonFiniteLossError as e:
        error = str(e)
    else:
        if trainer.stop_reason is not None:   # Ctrl-C / SIGTERM: the run saved itself; stop the experiment too
            raise stopped_by(trainer.stop_reason, f"{run_dir}: interrupted ({trainer.stop_reason}) at step "
                                                  f"{trainer.state.step}; its checkpoint is saved")
    return {"seed": seed, "params": param_count(cfg.model), **read_run(run_dir, error),
            "wall_s": round(time.perf_counter() - start, 2)}


def resolve_sizes(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """An experiment's sizes: ``base`` (its FULL or QUICK table) with ``overrides`` laid over it; an override
    that names no key of ``base`` raises UserError listing the valid ones."""
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise UserError(f"unknown size(s) {unknown}; valid: {sorted(base)}")
    return {**base, **overrides}


def mean_curve(curves: Sequence[Sequence[Sequence[float]]], column: int = 1) -> dict[str, list[float]]:
    """Mean, min and max over curves of rows [step, value, ...] (``column`` picks the value), cut to the
    shortest curve."""
    if not curves:
        return {"step": [], "mean": [], "min": [], "max": []}
    n = min(len(c) for c in curves)
    rows = np.asarray([c[:n] for c in curves], dtype=float)                # (curves, n, columns)
    values = rows[:, :, column]
    return {"step": rows[0, :, 0].tolist(), "mean": values.mean(0).tolist(), "min": values.min(0).tolist(),
            "max": values.max(0).tolist()}
