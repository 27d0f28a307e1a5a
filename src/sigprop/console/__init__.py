"""The bottom layer of every ``sigprop`` command: exit codes, user errors and their one-line message, the
argument parser, ``--set`` overrides, the progress bar, and how a command stops on a signal (with the worker
processes it started). Imports nothing from sigprop above it (tqdm only when a bar is shown), so every layer may
use it and a command's start-up pays for nothing else."""
from .errors import EXIT_FAILED, EXIT_INVALID, EXIT_OK, USER_ERRORS, UserError, fail, one_line
from .overrides import add_set_option, apply_sets, parse_value, read_toml, set_dotted, split_key
from .parser import Parser, UsageError
from .progress import add_progress_flag, progress
from .stopping import Stopped, exit_code, stop_on_signals

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "USER_ERRORS", "UserError", "fail",
           "one_line", "add_set_option", "apply_sets", "parse_value", "read_toml", "set_dotted", "split_key", "Parser",
           "UsageError", "add_progress_flag", "progress", "Stopped", "exit_code", "stop_on_signals"]
