r"""The LR range test (Smith 2017; fastai's ``lr_find``), the peer baseline of `advise`.

One short run whose peak lr grows exponentially, η_t = η_min (η_max/η_min)^{t/(N−1)}, t = 0..N−1; the training
loss is smoothed by an exponential moving average with bias correction,

    a_t = β a_{t−1} + (1 − β) ℓ_t,    s_t = a_t / (1 − β^{t+1}),       β = 0.98,

and the run stops once s_t exceeds ``stop_factor`` (4) times the best s so far, or the loss is not finite.
Picks: ``steepest`` = the lr where s falls fastest per unit log lr (the minimum of ds/d log η, by central
differences, after the first ``skip`` points), ``min_over_10`` = the lr of the smallest s, divided by 10.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..train.config import RunConfig
from ..train.optim import make_optimizer
from ..train.sampler import EpochSampler, generator


@dataclass(frozen=True)
class RangeTest:
    """The ramp and its picks."""

    lrs: list[float]              # the lr of every step taken
    losses: list[float]           # its training loss
    smoothed: list[float]         # bias-corrected EMA of the losses
    steepest: float               # lr of the steepest descent of the smoothed loss
    min_over_10: float            # lr of the smallest smoothed loss / 10
    cost_s: float = 0.0           # wall seconds


def ramp(lr_min: float, lr_max: float, steps: int) -> list[float]:
    """The exponential ramp η_t, t = 0..steps−1."""
    if not (0 < lr_min < lr_max) or steps < 3:
        raise ValueError(f"range test: need 0 < lr_min < lr_max and steps >= 3, got {lr_min}, {lr_max}, {steps}")
    return [lr_min * (lr_max / lr_min) ** (t / (steps - 1)) for t in range(steps)]


def lr_range_test(step: Callable[[float], float], lr_min: float = 1e-5, lr_max: float = 1.0, steps: int = 100,
                  beta: float = 0.98, stop_factor: float = 4.0, skip: int | None = None) -> RangeTest:
    """Run the range test with ``step(lr) -> training loss`` (one optimizer step at ``lr``; module docstring).

    Args:
        step: takes one optimizer step at the given lr and returns its training loss.
        lr_min: the ramp's first lr.
        lr_max: the ramp's last lr.
        steps: the ramp's length N.
        beta: the smoothing factor β of the loss's moving average.
        stop_factor: the run stops once the smoothed loss exceeds this many times its best so far.
        skip: leading points left out of the steepest-slope pick (default a tenth of ``steps``).

    Returns:
        The `RangeTest`: the lrs and losses of the steps taken, and its two picks.

    Raises:
        ValueError: not 0 < ``lr_min`` < ``lr_max`` or ``steps`` < 3, or the loss blew up (not finite, or above
            the stop factor) before ``skip`` + 3 points.
    """
    start = time.perf_counter()
    skip = max(1, steps // 10) if skip is None else skip
    lrs, losses, smoothed = [], [], []
    avg, best = 0.0, math.inf
    for t, lr in enumerate(ramp(lr_min, lr_max, steps)):
        loss = float(step(lr))
        if not math.isfinite(loss):
            break
        avg = beta * avg + (1 - beta) * loss
        s = avg / (1 - beta ** (t + 1))
        lrs.append(lr)
        losses.append(loss)
        smoothed.append(s)
        best = min(best, s)
        if s > stop_factor * best:
            break
    if len(smoothed) < skip + 3:
        last = lrs[-1] if lrs else lr_min
        raise ValueError(f"range test: the loss blew up after {len(smoothed)} steps (lr {last:.3g}); lower lr_min")
    s = np.asarray(smoothed)
    slope = np.gradient(s, np.log(np.asarray(lrs)))
    steep = skip + int(np.argmin(slope[skip:]))
    return RangeTest(lrs, losses, smoothed, steepest=lrs[steep], min_over_10=lrs[int(np.argmin(s))] / 10,
                     cost_s=time.perf_counter() - start)


def run_range_test(cfg: RunConfig, steps: int | None = None, lr_min: float = 1e-5, lr_max: float = 1.0
                   ) -> RangeTest:
    """The range test on a run config: its model, data order, optimizer groups (the scheme's lr multipliers),
    loss and gradient clipping, for ``steps`` (default the run's ``train.steps``) steps of the ramp.

    Args:
        cfg: the run's config.
        steps: the ramp's length (default ``cfg.train.steps``).
        lr_min: the ramp's first lr.
        lr_max: the ramp's last lr.

    Returns:
        The `RangeTest` of `lr_range_test`.

    Raises:
        ValueError: as `lr_range_test`.
        NotImplementedError: a ViT run (the range test trains a language model's loss).
    """
    from .advise import lm_loss, run_inputs

    start = time.perf_counter()
    inputs = run_inputs(cfg)
    model, data = inputs.model, inputs.data
    sampler = EpochSampler(len(data.train), cfg.train.seed)
    optimizer = make_optimizer(model, cfg.optim, cfg.model)
    loss_fn = lm_loss(cfg.optim.z_loss)
    position = 0
    max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
    torch.manual_seed(cfg.train.seed + 1)              # the trainer's dropout stream

    def step(lr: float) -> float:
        nonlocal position
        batch = data.train.batch(sampler.indices(position, cfg.train.batch_size), generator(cfg.train.seed, position))
        loss = loss_fn(model, batch)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_mult"]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        position += cfg.train.batch_size
        return float(loss.detach())

    result = lr_range_test(step, lr_min, lr_max, steps or cfg.train.steps)
    return RangeTest(result.lrs, result.losses, result.smoothed, result.steepest, result.min_over_10,
                     cost_s=time.perf_counter() - start)
