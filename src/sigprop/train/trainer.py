"""The training loop, in nanoGPT's order: data → forward → backward → clip → step → log → eval →
checkpoint. Everything else (logging sinks, schedules, diagnostics) is a `Callback`.

Gradient normalisation: the loss of a step is the *global* mean over target positions,
sum(loss) / n_targets(global batch). Each rank back-propagates its micro-batch sums times
world_size / n_targets; DDP's gradient averaging divides by world_size again, so one
process with batch B and N processes with B/N each take the same step (up to float order).
"""
from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..console.stopping import stop_on_signals
from ..diagnostics.shortcut import shortcut_factors
from ..fields import FieldError
from ..models import calibrate
from ..nn.block import Block
from .callbacks import Callback, Diagnostics
from .checkpoint import capture_rng, checkpoint_step, restore_rng, resume_point, save_checkpoint, set_aside_newer
from .config import RunConfig
from .data import DataBundle
from .distributed import DistInfo, all_gather, all_reduce_sum, barrier
from .growth import grown, grown_optimizer_state
from .health import LastGood
from .logging import JSONLLogger, ProgressBar, TensorBoardLogger
from .objectives import Batch, loss_terms
from .optim import make_optimizer
from .parallel import autocast, gather_state, no_sync, prepare_model, restore_state
from .sampler import EpochSampler, generator, shard_bounds
from .schedules import RecoverSchedule, lr_at

EVAL_STREAM, DIAG_STREAM = -1, -2   # generator streams of the fixed validation/diagnostic batches


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN/Inf; the offending step was not applied.

    ``checkpoint``: the last good checkpoint (`sigprop.train.health`) to resume from, or None."""

    def __init__(self, message: str, checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


@dataclass
class TrainState:
    """Progress that a checkpoint must restore."""

    step: int = 0           # optimizer steps done
    position: int = 0       # training examples consumed (the data position)


def block_grad_norms(model: nn.Module) -> list[float]:
    """The gradient norm of each `sigprop.nn.block.Block` of ``model``'s parameters, in module order (an encdec's
    encoder blocks, then its decoder's); 0 for a block none of whose parameters has a gradient."""
    out = []
    for block in (m for m in model.modules() if isinstance(m, Block)):
        grads = [torch.linalg.vector_norm(p.grad) for p in block.parameters() if p.grad is not None]
        out.append(float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0)
    return out


class Trainer:
    """Trains ``model`` on ``data`` as ``cfg`` says; rank 0 writes into ``run_dir``. A fresh model first gets its
    scheme's data-dependent init (`sigprop.models.calibrate`: Admin's profiled ω) from the first training batch."""

    def __init__(self, cfg: RunConfig, model: nn.Module, data: DataBundle, run_dir: Path,
                 dist: DistInfo = DistInfo(), callbacks: Sequence[Callback] = ()) -> None:
        if cfg.train.grow_at and dist.enabled:
            raise FieldError(f"train.grow_at={cfg.train.grow_at}: growth during training runs in one process, "
                             f"not on {dist.world_size} ranks (grow a run folder with `sigprop grow` instead)")
        self.cfg, self.data, self.run_dir, self.dist = cfg, data, Path(run_dir), dist
        self.model = model.to(dist.device)
        self.sampler = EpochSampler(len(data.train), cfg.train.seed)
        self.micro = shard_bounds(cfg.train.batch_size, dist.world_size, dist.rank, cfg.train.grad_accum)
        # data-dependent init (Admin's profiled ω) on rank 0's first micro-batch of step 1, the same on every
        # rank, before sharding or compiling; a resumed run then loads its checkpoint's values over it
        calibrate(self.model, self.global_batch(0).rows(0, self._per_micro()).to(dist.device).inputs)
        self.ddp = prepare_model(self.model, cfg.train, dist)   # DDP wrapper, or the model (FSDP shards in place)
        self.optimizer = make_optimizer(self.model, cfg.optim, cfg.model)
        self.state = TrainState()
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.last_checkpoint: Path | None = None
        self.saved_at = time.monotonic()                # when the last checkpoint was written (train.ckpt_minutes)
        self.health = LastGood()
        self.set_aside: Path | None = None              # newer checkpoints moved away by a resume from an earlier one
        self.stop_reason: str | None = None
        self.callbacks: list[Callback] = []             # sinks first: the others may log from on_train_start
        if dist.is_main:
            self.callbacks.append(JSONLLogger(self.run_dir / "metrics.jsonl"))
            if cfg.train.tensorboard:
                self.callbacks.append(TensorBoardLogger(self.run_dir / "tensorboard"))
            if cfg.train.progress:
                self.callbacks.append(ProgressBar())
        if cfg.model.shaping == "recover":
            self.callbacks.append(RecoverSchedule(self.model, cfg.train.recover_steps))
        self.callbacks.append(Diagnostics(cfg.train.diag_every))
        self.callbacks += list(callbacks)
        self._eval_batch: Batch | None = None

    # -- plumbing -----------------------------------------------------------------------
    def _call(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    def log(self, record: dict[str, Any]) -> None:
        """Send a record (a dict with ``kind``) to every callback, stamped with the step."""
        self._call("on_log", {"step": self.state.step, **record})

    def request_stop(self, reason: str = "requested") -> None:
        """Finish the current step, save a checkpoint and return from `fit` (signal-safe)."""
        self.stop_reason = reason

    def _per_micro(self) -> int:
        return self.micro[0][1] - self.micro[0][0]

    def diag_batch(self) -> Batch:
        """A fixed validation micro-batch for diagnostics, on the training device (the same on every rank)."""
        n = min(len(self.data.val), self._per_micro())
        idx = torch.arange(n)
        return self.data.val.batch(idx, generator(self.cfg.train.seed, DIAG_STREAM)).to(self.dist.device)

    def global_batch(self, position: int) -> Batch:
        """The global training batch that starts at data ``position`` (the same on every rank)."""
        idx = self.sampler.indices(position, self.cfg.train.batch_size)
        return self.data.train.batch(idx, generator(self.cfg.train.seed, position))

    # -- one step -----------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """One optimizer step on the next global batch; returns its train record."""
        t0 = time.perf_counter()
        cfg, dist = self.cfg, self.dist
        # data: the whole global batch (cheap), of which this rank uses its micro-batches
        batch = self.global_batch(self.state.position)
        n_targets = max(batch.n_targets, 1)
        totals = torch.zeros(2, device=dist.device)                   # loss sum, correct
        logs_blocks = cfg.train.block_grads and self._evaluates(self.state.step + 1)
        with shortcut_factors(self.model) if logs_blocks else contextlib.nullcontext([]) as factors:
            for k, (a, b) in enumerate(self.micro):
                sync = not dist.enabled or k == len(self.micro) - 1
                with contextlib.nullcontext() if sync else no_sync(self.ddp):
                    with autocast(cfg.train.precision, dist.device):
                        loss_sum, correct = loss_terms(self.ddp, batch.rows(a, b).to(dist.device),   # forward
                                                       cfg.optim.z_loss)
                    (loss_sum * (dist.world_size / n_targets)).backward()                        # backward
                totals += torch.stack([loss_sum.detach(), correct.to(totals.dtype)])
        all_reduce_sum(totals, dist)
        max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
        blocks = block_grad_norms(self.model) if logs_blocks else None
        grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))     # clip
        loss = float(totals[0]) / n_targets
        self.health.observe(loss, grad_norm)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.log({"kind": "event", "event": "non_finite", "loss": loss, "grad_norm": grad_norm,
                      "last_good": str(self.health.good) if self.health.good else None})
            raise NonFiniteLossError(
                f"non-finite training loss {loss} (grad norm {grad_norm}) at step {self.state.step + 1}; "
                f"the step was not applied. Last good checkpoint (its next step was healthy): "
                f"{self.health.good or 'none'}", self.health.good)
        lr = lr_at(self.state.step, cfg.train.steps, cfg.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_mult"]                     # the scheme's per-role multiplier
        self.optimizer.step()                                                                # step
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.position += cfg.train.batch_size
        record = {"kind": "train", "loss": loss, "acc": float(totals[1]) / n_targets, "lr": lr,
                  "grad_norm": grad_norm, "dt": time.perf_counter() - t0}
        if blocks is None:
            return record
        return {**record, "block_grad_norms": blocks, **({"shortcut_factors": factors} if factors else {})}

    # -- evaluation ---------------------------------------------------------------------
    def _last_step(self) -> int:
        """The step the run ends after: ``train.stop_at`` when set, else ``train.steps``."""
        return self.cfg.train.stop_at or self.cfg.train.steps

    def _evaluates(self, step: int) -> bool:
        """Whether the loop evaluates after ``step``: every ``eval_every`` steps and at the last step."""
        t = self.cfg.train
        return bool(t.eval_batches) and (step == self._last_step() or bool(t.eval_every and step % t.eval_every == 0))

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Loss, perplexity (text) and accuracy on the fixed validation examples (all ranks)."""
        if self._eval_batch is None:
            n = min(len(self.data.val), self.cfg.train.eval_batches * self.cfg.train.batch_size)
            self._eval_batch = self.data.val.batch(torch.arange(n), generator(self.cfg.train.seed, EVAL_STREAM))
        n = len(self._eval_batch.targets)
        lo, hi = n * self.dist.rank // self.dist.world_size, n * (self.dist.rank + 1) // self.dist.world_size
        totals = torch.zeros(3, device=self.dist.device)                # loss sum, correct, targets
        self.model.eval()
        for a in range(lo, hi, self._per_micro()):
            mb = self._eval_batch.rows(a, min(a + self._per_micro(), hi)).to(self.dist.device)
            with autocast(self.cfg.train.precision, self.dist.device):
                loss_sum, correct = loss_terms(self.model, mb)
            totals += torch.stack([loss_sum, correct.to(totals.dtype), totals.new_tensor(mb.n_targets)])
        self.model.train()
        all_reduce_sum(totals, self.dist)
        loss = float(totals[0] / totals[2])
        out = {"kind": "eval", "loss": loss, "acc": float(totals[1] / totals[2])}
        if self.data.tokenizer is not None:
            out["ppl"] = math.exp(min(loss, 700.0))
        return out

    # -- checkpoints --------------------------------------------------------------------
    def save(self) -> None:
        """Checkpoint the current state (rank 0 writes; every rank contributes its RNG state)."""
        rngs = all_gather(capture_rng(), self.dist)
        model_state, optim_state = gather_state(self.model, self.optimizer)   # collective under FSDP
        if self.dist.is_main:
            meta = {"data_position": self.state.position, "config": self.cfg.to_dict(),
                    "model_config": self.cfg.model.to_dict(), **self.health.meta()}
            self.last_checkpoint = save_checkpoint(self.ckpt_dir, self.state.step, model_state, optim_state,
                                                   meta, rngs, self.cfg.train.keep_last, protect=self.health.good)
            self.health.saved(self.last_checkpoint)
            self.log({"kind": "event", "event": "checkpoint", "path": str(self.last_checkpoint)})
        self.saved_at = time.monotonic()
        barrier(self.dist)

    def _grow(self) -> None:
        """Deepen the model by the run's growth (`sigprop.train.growth`), its AdamW state carried over."""
        cfg, model, slots = grown(self.cfg, self.model)
        state = grown_optimizer_state(self.model, self.optimizer.state_dict(), model, self.cfg, cfg, slots)
        self.cfg, self.model = cfg, model.to(self.dist.device)
        self.ddp = prepare_model(self.model, cfg.train, self.dist)
        self.optimizer = make_optimizer(self.model, cfg.optim, cfg.model)
        self.optimizer.load_state_dict(state)

    def _resume(self) -> list[dict[str, Any]] | None:
        path = resume_point(self.ckpt_dir, self.cfg.train.resume_from)
        if path is None:
            return None
        t = self.cfg.train
        if t.grow_at and checkpoint_step(path) >= t.grow_at and self.cfg.model.n_layers < t.grow_to:
            self._grow()                      # the checkpoint holds the grown model: build its structure first
        record = restore_state(path, self.model, self.cfg.model.to_dict(), self.optimizer)
        self.state = TrainState(record["step"], record["data_position"])
        self.last_checkpoint, self.health = path, LastGood.from_record(path, record)
        barrier(self.dist)                    # every rank has read it before rank 0 moves newer ones aside
        self.set_aside = set_aside_newer(self.ckpt_dir, record["step"]) if self.dist.is_main else None
        return record["rng"]

    # -- the loop -----------------------------------------------------------------------
    def fit(self) -> TrainState:
        """Train to ``train.steps``, or to ``train.stop_at`` when set (the lr schedule still spans ``train.steps``),
        resuming first if ``train.resume``; returns the final state.

        Raises NonFiniteLossError on a NaN/Inf loss. A SIGINT or SIGTERM ends the loop after the current step
        with a checkpoint (``stop_reason`` names the signal); a second one ends the process at once
        (`sigprop.console.stopping`).
        """
        t = self.cfg.train
        rngs = self._resume() if t.resume else None
        with stop_on_signals(lambda s: self.request_stop(signal.Signals(s).name)):
            self._call("on_train_start")
            try:
                if rngs is not None:
                    self.log({"kind": "event", "event": "resumed", "path": str(self.last_checkpoint),
                              "set_aside": str(self.set_aside) if self.set_aside else None})
                    if len(rngs) == self.dist.world_size:
                        restore_rng(rngs[self.dist.rank])
                    else:   # world size changed: exact continuation is impossible anyway
                        torch.manual_seed(t.seed + self.dist.rank + self.state.step)
                elif t.eval_batches:
                    self.log(self.evaluate())                     # the baseline at step 0
                end = self._last_step()
                while self.state.step < end:
                    self._call("on_step_start")
                    self.log(self.train_step())
                    self._call("on_step_end")
                    if t.grow_at and self.state.step == t.grow_at:
                        self._grow()
                        self.log({"kind": "event", "event": "grown", "n_layers": self.cfg.model.n_layers})
                    if self._evaluates(self.state.step):
                        self.log(self.evaluate())
                    last = self.state.step == end
                    due = bool(t.ckpt_minutes) and time.monotonic() - self.saved_at >= 60 * t.ckpt_minutes
                    flags = all_reduce_sum(torch.tensor([float(self.stop_reason is not None), float(due)],
                                                        device=self.dist.device), self.dist)
                    stop, due = bool(flags[0] > 0), bool(flags[1] > 0)    # any rank's clock makes every rank save
                    if last or stop or due or (t.ckpt_every and self.state.step % t.ckpt_every == 0):
                        self.save()
                    if stop:
                        self.stop_reason = self.stop_reason or "stopped by another rank"
                        self.log({"kind": "event", "event": "interrupted", "reason": self.stop_reason})
                        break
            finally:
                self._call("on_train_end")
        return self.state
