"""`diagnose_model`: the Python entry of ``sigprop diagnose`` for a model sigprop does not build.

``sigprop diagnose --config FILE`` builds a sigprop model from a `ModelConfig`; any other torch model
(a nanoGPT, a research prototype) is diagnosed from Python with a block selector, writing the same
files: ``measured.csv``, ``measured.json`` and ``diagnose.png``. Runnable: ``examples/diagnose_any_model.py``.

    from sigprop.diagnostics import diagnose_model
    records = diagnose_model(model, input_ids, blocks=Block, out="runs/diagnose")
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..records import Record, to_csv, to_json
from .measure import Selector, measure
from .plot import plot_records


def diagnose_model(model: nn.Module, batch: Any, blocks: Selector, out: str | Path,
                   loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None, seed: int = 0,
                   title: str | None = None) -> list[Record]:
    """`measure` ``model`` on ``batch`` at the modules ``blocks`` selects (a module class, an iterable of classes,
    a name pattern or a predicate, see `sigprop.diagnostics.measure`), write ``out``/measured.{csv,json} and
    ``out``/diagnose.png, and return the records. Parameters' ``.grad`` are left as they were; a selector
    whose modules record nothing raises ValueError (as `measure`), before any file is written.

    Args:
        model: any torch model.
        batch: its input (a tensor, a tuple of positional arguments or a dict of keyword arguments).
        blocks: the modules to record: a module class, an iterable of classes, a name pattern or a predicate.
        out: the folder to write to (created if missing).
        loss_fn: the loss whose gradient is measured (default `random_projection_loss`).
        seed: seed of the default loss's projection.
        title: the plot's title (default the model's class and the seed).

    Returns:
        The records of `measure`, one per selected module.

    Raises:
        ValueError: a selector of another form, one that selects nothing, or whose modules record nothing.
        OSError: ``out`` cannot be created or written.
    """
    records = measure(model, batch, loss_fn=loss_fn, seed=seed, blocks=blocks)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    to_csv(records, out / "measured.csv")
    to_json(records, out / "measured.json")
    plot_records({"measured": records}, out / "diagnose.png", title=title or f"{type(model).__name__}, seed {seed}")
    return records
