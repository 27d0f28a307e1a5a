"""Exit codes, the user-error type and the one-line error message of every ``sigprop`` command.

A *user error* is a bad value, a missing or unreadable file, an unwritable output or a missing optional
package: the command prints one line ``{prog}: error: {message}`` on stderr and exits `EXIT_INVALID`. Every
other exception is a bug in sigprop and keeps its traceback (exit 1). Validation that a user can trigger
raises `UserError` (a ``ValueError``, so "invalid input raises ValueError" stays true for library callers);
a plain ``ValueError`` is not a user error. This module imports nothing from sigprop.
"""
from __future__ import annotations

import sys

EXIT_OK = 0            # done
EXIT_FAILED = 1        # the job ran and failed (a NaN/Inf training loss, a failing report) or a bug (traceback)
EXIT_INVALID = 2       # a user error: one line on stderr naming the input
# stopped by a signal before the job finished: 128 + its number, 130 for SIGINT, 143 for SIGTERM (`stopping.exit_code`)


class UserError(ValueError):
    """Input that sigprop refuses, with a message naming the input and what is allowed."""


USER_ERRORS: tuple[type[BaseException], ...] = (UserError, OSError)   # OSError: missing, unreadable, unwritable


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line (runs of whitespace, newlines included, become one space)."""
    return " ".join(str(err).split())


def fail(prog: str, err: BaseException, code: int = EXIT_INVALID) -> int:
    """Print ``{prog}: error: {message}`` (one line) on stderr; return ``code``."""
    print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
    return code
