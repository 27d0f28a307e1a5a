"""How a ``sigprop`` command stops on SIGINT (Ctrl-C) or SIGTERM, and how the processes it started stop with it.

The rule, the same for every command:

- The first SIGINT or SIGTERM raises `Stopped` in the main thread (a ``KeyboardInterrupt``, so every clean-up
  written for Ctrl-C runs for SIGTERM too) unless a block asked for a gentler first step (a training loop finishes
  its step and checkpoints). The command keeps what finished, says how to continue and exits 128 + the signal's
  number: 130 for SIGINT, 143 for SIGTERM, as shells expect (`exit_code`).
- A second signal while the command is stopping ends it at once (`stop_now`): the worker processes it started are
  killed and it exits with that code.
- Worker processes (`sigprop.console.workers`) are ended by their pool when it is left by an exception, and each
  dies with its parent (`die_with_parent`), so not even SIGKILL of the command leaves one running.

Imports nothing from sigprop.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1          # prctl(2): the signal this process gets when the thread that created it exits


class Stopped(KeyboardInterrupt):
    """The command was asked to stop by signal ``signum``; ``str()`` says what was left where."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")
        self.signum = int(signum)


def _signum(err: BaseException) -> int:
    return err.signum if isinstance(err, Stopped) else int(signal.SIGINT)   # a plain KeyboardInterrupt: SIGINT


def exit_code(err: BaseException) -> int:
    """128 + the signal number of a `Stopped` (130 for a plain ``KeyboardInterrupt``, which only SIGINT raises)."""
    return 128 + _signum(err)


def restated(err: BaseException, message: str) -> Stopped:
    """A `Stopped` for the signal that stopped ``err``'s work, saying ``message`` (what was kept, how to go on)."""
    return Stopped(_signum(err), message)


def stopped_by(reason: str, message: str) -> Stopped:
    """The `Stopped` for a stop recorded by a signal's name (``"SIGTERM"``; any other reason counts as SIGINT)."""
    return Stopped(getattr(signal.Signals, reason, signal.SIGINT), message)


# what a second signal must end at once: the pids of the live workers this process started
_workers: set[int] = set()
_stopping = False             # a first signal arrived (a second one ends the process at once)
_depth = 0                    # nested `stop_on_signals` blocks now open


def track(pid: int) -> None:
    """Remember a worker ``stop_now`` must kill."""
    _workers.add(pid)


def untrack(pid: int) -> None:
    """Forget a worker that has ended."""
    _workers.discard(pid)


def stop_now(signum: int) -> None:
    """Kill every tracked worker (SIGKILL) and exit with 128 + ``signum`` without clean-up."""
    for pid in list(_workers):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    print(f"\nsigprop: stopped at once by a second {signal.Signals(signum).name}", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _raise(signum: int) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals(first: Callable[[int], None] = _raise) -> Iterator[None]:
    """SIGINT and SIGTERM handlers for the block, in the main thread (elsewhere: none): the first signal calls
    ``first(signum)`` (by default raises `Stopped`), any later one `stop_now`. The previous handlers come back
    when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        global _stopping
        if _stopping:
            stop_now(signum)
        _stopping = True
        first(signum)

    global _depth, _stopping
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    _depth += 1
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _depth -= 1
        _stopping = _stopping and _depth > 0     # the outermost block ends the stop


def reset_in_child() -> None:
    """In a freshly forked worker: no inherited tracking or stopping state, Ctrl-C left to the parent (SIGINT
    ignored; a block may install its own handlers), SIGTERM ends the process."""
    global _stopping, _depth
    _workers.clear()
    _stopping, _depth = False, 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Make this process get ``signum`` when process ``parent`` (its parent now) ends; at once if it has ended
    already. SIGKILL on Linux: PR_SET_PDEATHSIG, the kernel sends it. Any other signal, or elsewhere: a daemon
    thread polls the parent's pid every 0.5 s and sends it once (the kernel sends PR_SET_PDEATHSIG again as each
    thread of a dying multi-threaded parent exits, which a handler of a graceful signal would take for a second
    request to stop at once)."""
    linux = sys.platform.startswith("linux") and signum == signal.SIGKILL
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if linux else None
    if libc is not None and libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0:
        if os.getppid() != parent:           # it ended before the kernel was asked to tell
            os.kill(os.getpid(), signum)
        return

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(0.5)
        os.kill(os.getpid(), signum)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
