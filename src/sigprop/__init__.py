"""sigprop: signal propagation in deep transformers.

The names below are imported on first use, so ``import sigprop.console`` (the bottom layer of every command) and
``sigprop --help`` load no torch.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
_LAZY = {"ModelConfig": "sigprop.models", "build_model": "sigprop.models", "grow": "sigprop.models.grow",
         "advise": "sigprop.advice"}
__all__ = ["ModelConfig", "advise", "build_model", "grow", "__version__"]


def __getattr__(name: str) -> Any:
    """`ModelConfig`, `build_model` (`sigprop.models`), `grow` (`sigprop.models.grow`) and `advise`
    (`sigprop.advice`), each imported when first read."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sigprop' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
