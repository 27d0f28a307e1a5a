"""Assemble and run: run folder, seeds, data, model, trainer; and reload a finished run."""
from __future__ import annotations

import contextlib
import json
import random
import shlex
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..console.errors import UserError
from ..models import build_model
from .callbacks import Callback
from .checkpoint import CheckpointError, checkpoint_step, list_checkpoints, load_checkpoint
from .config import RunConfig, dump_toml, load_config
from .data import prepare_data
from .distributed import barrier, init_distributed, shutdown
from .growth import grown
from .run_dir import check_run_dir, claim
from .trainer import Trainer


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_run_dir(cfg: RunConfig, argv: Sequence[str] | None) -> Path:
    """Create ``train.out_dir``; write the resolved config.toml and the command line."""
    run_dir = check_run_dir(cfg.train)
    claim(run_dir)
    if not cfg.train.resume:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(cfg.to_dict()))
    if argv is not None:
        with open(run_dir / "command.txt", "a", encoding="utf-8") as f:
            f.write("sigprop train " + shlex.join(argv) + "\n")
    return run_dir


@contextlib.contextmanager
def flushed_denormals(enabled: bool) -> Iterator[None]:
    """While inside, if ``enabled``: CPU arithmetic treats subnormal floats (|x| < 1.2e-38 in float32) as 0;
    IEEE behaviour again on the way out, however the block ends."""
    if not enabled:
        yield
        return
    if not torch.set_flush_denormal(True):
        raise UserError("train.flush_denormal=true needs a CPU that supports it (x86 with SSE3); set it to false")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def train(cfg: RunConfig, callbacks: Sequence[Callback] = (), argv: Sequence[str] | None = None) -> Trainer:
    """Run a whole training (one process, or one rank under torchrun); returns the finished trainer.

    ``train.flush_denormal`` (`flushed_denormals`): numbers are unchanged unless a subnormal occurs; where
    gradients vanish through depth (a trained 192-layer standard Post-LN stack holds ~10⁶ subnormal gradient
    entries), each operation on them costs many times a normal one, and flushing made such steps 3–4× faster
    (bench/RESULTS.md).

    Args:
        cfg: the run's config.
        callbacks: extra `Callback` objects, called after the run's own (metrics log, progress bar, diagnostics).
        argv: the command line, written to ``command.txt`` beside the run.

    Returns:
        The finished `Trainer`.

    Raises:
        UserError: an output folder sigprop may not write into, data that cannot be prepared, or
            ``train.flush_denormal`` on a CPU without it.
        NonFiniteLossError: the loss or the gradient norm became NaN/Inf (the error names the last good
            checkpoint).
    """
    with flushed_denormals(cfg.train.flush_denormal):
        dist = init_distributed(cfg.train.device)
        try:
            # every rank fails alike
            run_dir = prepare_run_dir(cfg, argv) if dist.is_main else check_run_dir(cfg.train)
            barrier(dist)
            data = prepare_data(cfg, run_dir, save_tokenizer=dist.is_main)
            seed_everything(cfg.train.seed)
            model = build_model(cfg.model)
            torch.manual_seed(cfg.train.seed + 1 + dist.rank)   # per-rank stream for dropout
            trainer = Trainer(cfg, model, data, run_dir, dist, callbacks)
            trainer.fit()
            return trainer
        finally:
            shutdown(dist)


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None,
             overrides: Sequence[str] = ()) -> tuple[RunConfig, nn.Module, Path]:
    """Config and trained model of a run folder (newest checkpoint unless ``checkpoint``);
    ``overrides`` (``a.b=c``) adjust the saved config, e.g. ``train.device=cpu``.

    Args:
        run_dir: the run folder (``train.out_dir`` of a training).
        checkpoint: a checkpoint JSON to load instead of the newest.
        overrides: ``section.key=value`` strings applied to the saved config.

    Returns:
        (config, model in eval mode, the checkpoint loaded).

    Raises:
        UserError: not a run folder (no config.toml), or an invalid override (`FieldError`).
        CheckpointError: no checkpoint, or one that cannot be loaded into the config's model.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").exists():
        raise UserError(f"{run_dir} is not a sigprop run folder (no config.toml)")
    tokenizer = run_dir / "tokenizer.json"
    pinned = [f"data.tokenizer={json.dumps(str(tokenizer))}"] if tokenizer.exists() else []
    cfg = load_config(run_dir / "config.toml", pinned + list(overrides))
    if checkpoint is None:
        found = list_checkpoints(run_dir / "checkpoints")
        if not found:
            raise CheckpointError(f"no checkpoint in {run_dir / 'checkpoints'}")
        checkpoint = found[-1]
    model = build_model(cfg.model)
    if cfg.train.grow_at and checkpoint_step(Path(checkpoint)) >= cfg.train.grow_at:
        cfg, model, _ = grown(cfg, model)             # a checkpoint after the run's growth holds the deeper model
    load_checkpoint(Path(checkpoint), model, cfg.model.to_dict())
    return cfg, model.eval(), Path(checkpoint)
