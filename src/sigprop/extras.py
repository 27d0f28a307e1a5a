"""Optional dependencies: `require` imports one inside the function that needs it, or raises
`MissingExtraError` saying what to install. A missing extra is a user error (the CLI exits 2 with one
line), not a bug. This module imports only the bottom layer (`sigprop.console`), so every layer may use it.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .console.errors import UserError


class MissingExtraError(UserError, ImportError):
    """An optional package that the requested feature needs is not installed (or does not import); a
    `UserError` and an ``ImportError``."""


def require(module: str, needed_by: str, install: str) -> ModuleType:
    """The imported ``module``; MissingExtraError "{needed_by} needs the '{package}' package ({why}): {install}"
    if it cannot be imported (``needed_by`` names the feature, e.g. a config field and value)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"{needed_by} needs the {module.split('.')[0]!r} package ({e}): {install}") from e
