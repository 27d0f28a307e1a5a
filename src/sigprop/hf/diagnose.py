"""`diagnose`: `sigprop.diagnostics.measure` of a `transformers` model in a train/eval mode, beside its prediction.

Rows (the family's adapter, `sigprop.hf.base.Family`): layer 0 "embed" = the stream entering the first block; then
per block the stream after its attention and after its MLP residual add (what sigprop's `Sublayer` outputs).
Attention rows also carry the Softmax entropy and largest logit, read from the model's attention function
(`sigprop.hf.logits`: Q and K after RoPE; the shaped models' τ). Models on HF's "eager" path report none.

The pass runs in ``mode`` "eval" (dropout off: deterministic) or "train" (dropout on, as in training);
the model's own train/eval state is put back afterwards, module by module. ``plot`` overlays the
prediction walked from the model's modules (`sigprop.hf.walk`).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..diagnostics.measure import measure
from ..diagnostics.plot import plot_records
from ..nn.modes import MODES
from ..records import Record
from .apply import family_of
from .walk import predict


def _predicted(model: nn.Module, batch: Any, mode: str) -> tuple[list[Record], str | None]:
    """`sigprop.hf.predict` of ``model`` on ``batch`` in ``mode``, or ([], the reason) where a module, option or
    input has no exact moment map."""
    try:
        return predict(model, batch, mode), None
    except NotImplementedError as e:
        return [], str(e)


def diagnose(model: nn.Module, batch: Any, loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
             seed: int = 0, attention_stats: bool = True, plot: str | Path | None = None,
             mode: str = "eval", backward: bool = True, stable_ranks: bool = True) -> list[Record]:
    """Per-sublayer records of a `transformers` model on ``batch`` (input_ids, or a dict of kwargs).

    One forward and backward pass (`sigprop.diagnostics.measure`); the loss is ``loss_fn(out)`` or ⟨out, G⟩ with
    G ~ N(0, 1) (`random_projection_loss`), out = the logits (or last hidden state). ``mode``: "eval" (default:
    dropout off, two calls give the same records) or "train" (dropout on, to measure its effect); the
    model's train/eval state is restored afterwards. Every parameter's ``.grad`` is left as it was (None
    stays None; a tensor keeps its values and identity). ``backward=False``: the forward pass alone (no gradient
    variance); ``stable_ranks=False``: no stable ranks (as in `sigprop.diagnostics.measure`). ``plot``: write a PNG
    of the measured curves with `plot_records`, and the predicted ones: `sigprop.hf.predict`, walked from the
    model's own modules in the same mode. Where a module, option or input has no exact moment map the plot is titled
    "measured only" and a warning names it.

    Args:
        model: a `transformers` model of a supported family (`SUPPORTED`), with or without `apply`.
        batch: input_ids (B, T), or a dict of keyword arguments of the model's forward.
        loss_fn: the loss of the output whose gradient is measured (default `random_projection_loss`).
        seed: seed of the default loss's projection.
        attention_stats: record each attention's entropy and largest logit.
        plot: the PNG to write, measured beside predicted; None: no plot.
        mode: "eval" or "train".
        backward: take the backward pass.
        stable_ranks: record the stable ranks.

    Returns:
        One `Record` per sublayer (layer 0: the embedding output), as `sigprop.diagnostics.measure`.

    Raises:
        ValueError: a ``mode`` other than "eval" or "train", or a model of an unsupported family.
    """
    if mode not in MODES:
        raise ValueError(f"hf.diagnose: mode must be one of {list(MODES)}, got {mode!r}")
    family_of(model)
    records = measure(model, batch, loss_fn, seed, attention_stats, backward=backward, stable_ranks=stable_ranks,
                      mode=mode)
    if plot is not None:
        predicted, reason = _predicted(model, batch, mode)
        if reason is not None:
            warnings.warn(f"hf.diagnose plots the measurement only: {reason}", stacklevel=2)
        curves = {"measured": records} | ({"predicted": predicted} if predicted else {})
        plot_records(curves, plot, title=f"{type(model).__name__}, {mode} mode"
                     + ("" if predicted else " (measured only)"))
    return records
