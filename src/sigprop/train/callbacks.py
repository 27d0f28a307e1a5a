"""Trainer extension points, and the in-training signal-propagation diagnostics.

The trainer calls, in loop order: ``on_train_start``; per step ``on_step_start`` (before
the data is drawn; ``trainer.state.step`` = steps done), ``on_step_end`` (after the
optimizer step and its log record); ``on_log`` for every record (train, eval, diag,
event); ``on_train_end`` (also after an interruption or a fault).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..diagnostics import measure
from ..records import to_rows
from .parallel import is_sharded

if TYPE_CHECKING:
    from .trainer import Trainer


class Callback:
    """Base class: every hook is a no-op."""

    def on_train_start(self, trainer: "Trainer") -> None:
        """Once, after setup (and resume), before the first step."""

    def on_step_start(self, trainer: "Trainer") -> None:
        """Before each step's data."""

    def on_step_end(self, trainer: "Trainer") -> None:
        """After each optimizer step and its train record."""

    def on_log(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        """For every record the trainer emits (``record["kind"]``: train, eval, diag, event)."""

    def on_train_end(self, trainer: "Trainer") -> None:
        """Once, when the loop ends for any reason."""


class Diagnostics(Callback):
    """At step 0 and every ``every`` steps: `sigprop.diagnostics.measure` on a fixed validation batch,
    in eval mode. Logs the per-sublayer records (``layers``: fwd_var, token_corr, grad_var,
    attn_entropy, ...) and summaries: mean and min attention entropy over attention
    sublayers, and the token correlation of the last sublayer output (``token_corr``).

    One process or DDP: rank 0 measures its own replica alone. FSDP: the pass is collective, every
    rank measures the sharded model on the same batch (FSDP's hooks gather each block's full weights
    for its forward and backward, so measure's hooks, the attention statistics included, run on full
    weights) and rank 0 logs the records, which equal `measure` of the same weights in one process.
    Either way the training state is left as it was: ``measure`` gives every parameter back its
    ``.grad`` (under FSDP after the backward's reduce-scatter), the optimizer is not touched, and the
    eval-mode pass draws nothing from the global RNG (dropout is off)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_train_start(self, trainer: "Trainer") -> None:
        if trainer.state.step == 0:          # the baseline at initialization (not again on resume)
            self.on_step_end(trainer)

    def on_step_end(self, trainer: "Trainer") -> None:
        if not self.every or trainer.state.step % self.every:
            return
        if trainer.dist.is_main or is_sharded(trainer.model):   # FSDP: every rank enters the collectives
            diag = self.summarize(trainer.model, trainer.diag_batch().inputs)
            if trainer.dist.is_main:
                trainer.log({"kind": "diag", **diag})

    @staticmethod
    def summarize(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        """Measure ``model(*inputs)``; returns summaries and the record rows."""
        was_training = model.training
        model.eval()
        try:
            records = measure(model, inputs)
        finally:
            model.train(was_training)
        entropies = [r.attn_entropy for r in records if r.attn_entropy is not None]
        out: dict[str, Any] = {"token_corr": records[-1].token_corr}
        if entropies:
            out.update(attn_entropy=sum(entropies) / len(entropies), attn_entropy_min=min(entropies))
        return {**out, "layers": to_rows(records)}
