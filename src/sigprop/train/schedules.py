"""Schedules as pure functions of the step: learning rate, and the shaped-attention Recover variant."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch import nn

from ..console.errors import UserError
from ..nn import ShapedAttention, ShapedReLU
from .callbacks import Callback
from .config import OptimConfig

if TYPE_CHECKING:
    from .trainer import Trainer


def default_warmup(steps: int) -> int:
    """The warmup every experiment gives a run of ``steps`` optimizer steps: its first 10 % (at least one step)."""
    return max(1, steps // 10)


def lr_at(step: int, total: int, cfg: OptimConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of ``total``.

    Linear warmup 0 → lr over ``warmup_steps`` (step s uses lr·(s+1)/warmup), then a cosine
    or linear decay to ``min_lr_ratio·lr`` at the last step, or constant.

    Args:
        step: the optimizer step, 0-based.
        total: the run's number of steps.
        cfg: the optimizer settings (``lr``, ``warmup_steps``, ``decay``, ``min_lr_ratio``).
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    span = max(total - 1 - cfg.warmup_steps, 1)
    frac = min((step - cfg.warmup_steps) / span, 1.0)
    if cfg.decay == "cosine":
        return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * frac))
    if cfg.decay == "linear":
        return cfg.lr - (cfg.lr - floor) * frac
    return cfg.lr


class RecoverSchedule(Callback):
    """Shaped Transformer "Recover" (Noci et al. 2023, App. D): γ₁, γ₂ of every ShapedAttention
    and s₋ of every ShapedReLU decay linearly from their initial values to 0 over ``steps``
    steps, turning shaped attention into softmax attention and the shaped ReLU into a ReLU.

    Construct it on the freshly built model: the initial values are read there, so the
    schedule stays a function of the step after a resume.

    Args:
        model: the freshly built model.
        steps: the steps over which the values decay to 0 (``train.recover_steps``).

    Raises:
        UserError: a model with no shaped attention or shaped ReLU to schedule.
    """

    def __init__(self, model: nn.Module, steps: int) -> None:
        self.steps = steps
        self.attn = [(m, float(m.gamma1.flatten()[0]), float(m.gamma2.flatten()[0]))
                     for m in model.modules() if isinstance(m, ShapedAttention)]
        self.relu = [(m, float(m.s_minus)) for m in model.modules() if isinstance(m, ShapedReLU)]
        if not self.attn and not self.relu:
            raise UserError("model.shaping='recover' but the model has no ShapedAttention or "
                            "ShapedReLU to schedule (use scheme='shaped' or activation='shaped_relu')")

    def factor(self, step: int) -> float:
        """Remaining fraction of the initial values at ``step``: 1 → 0 linearly, then 0."""
        return max(0.0, 1.0 - step / self.steps)

    def on_step_start(self, trainer: "Trainer") -> None:
        f = self.factor(trainer.state.step)
        for m, g1, g2 in self.attn:
            m.set_shape(g1 * f, g2 * f)
        for m, s in self.relu:
            m.set_slope(s * f)
