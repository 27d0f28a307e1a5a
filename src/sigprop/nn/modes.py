"""Train/eval mode of a module tree, set for the length of a block and put back module by module."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

MODES = ("eval", "train")


@contextmanager
def in_mode(model: nn.Module, mode: str) -> Iterator[None]:
    """Run the body with every module of ``model`` in ``mode`` ("eval" | "train"), then put each module's own
    train/eval state back."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    training = {m: m.training for m in model.modules()}
    model.train(mode == "train")
    try:
        yield
    finally:
        for m, was in training.items():
            m.training = was
