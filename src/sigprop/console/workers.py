"""A process pool whose workers never outlive the command that started them (`sigprop.console.stopping`).

    with WorkerPool(2) as pool:
        futures = [pool.submit(fn, x) for x in xs]
        ...                      # Ctrl-C here: Stopped is raised, the pool ends its workers on the way out

Leaving the ``with`` block normally waits for every submitted call, as a `ProcessPoolExecutor` does. Leaving
it by an exception (`Stopped` from SIGINT/SIGTERM, or any error) cancels the calls not started, sends every
worker SIGTERM, waits `GRACE` seconds and kills the ones still alive. Workers start with Ctrl-C left to the
parent, and die with it (`die_with_parent`). Imports nothing from sigprop outside `sigprop.console`.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import time
from typing import Any, Callable, Sequence

from .stopping import die_with_parent, reset_in_child, track, untrack

GRACE = 3.0          # seconds a worker gets after SIGTERM before it is killed


def _start_worker(parent: int, initializer: Callable[..., None] | None, initargs: Sequence[Any]) -> None:
    reset_in_child()
    die_with_parent(parent)
    if initializer is not None:
        initializer(*initargs)


class WorkerPool(cf.ProcessPoolExecutor):
    """``jobs`` worker processes (fork where it exists, so workers start with the parent's imports; spawn
    elsewhere), each running ``initializer(*initargs)`` first."""

    def __init__(self, jobs: int, initializer: Callable[..., None] | None = None, initargs: Sequence[Any] = ()
                 ) -> None:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        super().__init__(jobs, mp_context=ctx, initializer=_start_worker,
                         initargs=(os.getpid(), initializer, tuple(initargs)))

    def _workers(self) -> list[multiprocessing.Process]:
        return list((self._processes or {}).values())

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        future = super().submit(fn, *args, **kwargs)
        for p in self._workers():
            track(p.pid)
        return future

    def stop(self, grace: float = GRACE) -> None:
        """Cancel the calls not started, SIGTERM every worker, wait up to ``grace`` seconds, kill the rest."""
        workers = self._workers()
        self.shutdown(wait=False, cancel_futures=True)
        for p in workers:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace
        for p in workers:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in workers:
            if p.is_alive():
                p.kill()
                p.join(1.0)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        workers = self._workers()
        try:
            if exc_type is None:
                self.shutdown(wait=True)
            else:
                self.stop()
        finally:
            for p in workers:
                untrack(p.pid)
        return False
