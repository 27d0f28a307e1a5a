"""The argument parser of every ``sigprop`` command: a usage error is a `UserError` (one line, exit 2)."""
from __future__ import annotations

import argparse
from typing import NoReturn

from .errors import UserError


class UsageError(UserError):
    """A command line that argparse refuses (unknown option, missing or malformed argument)."""


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors raise `UsageError` (argparse's message and where the help is)
    instead of printing the usage block and exiting, so a command reports them as it reports every other user
    error. Subparsers made with ``add_subparsers`` are of this class too (argparse's default); ``--help``
    prints and exits 0."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")
