"""The progress bar of every long loop, and the one command-line flag that switches it off.

tqdm is optional (the ``train`` extra): without it, or with the bar switched off, loops run silently.
"""
from __future__ import annotations

import argparse
from typing import Any, Iterable, Iterator, TypeVar

T = TypeVar("T")

FLAG = "--no-progress"        # every command with a bar: no progress bar (``args.progress`` becomes False)


class _Silent:
    """A stand-in for a tqdm bar that shows nothing (same ``n``, ``update``, ``set_postfix``, ``close``)."""

    def __init__(self, initial: int) -> None:
        self.n = initial

    def update(self, k: int = 1) -> None:
        self.n += k

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int | None, desc: str, initial: int = 0, enabled: bool = True) -> Any:
    """A tqdm bar on stderr counting up to ``total`` from ``initial`` (advanced by ``update``), or `_Silent` when
    ``enabled`` is false or tqdm is not installed."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            enabled = False
    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True) if enabled else _Silent(initial)


def progress(items: Iterable[T], desc: str, total: int | None = None, enabled: bool = True,
             initial: int = 0) -> Iterator[T]:
    """``items``, with a `bar` advanced by one per item (``total`` defaults to ``len(items)`` + ``initial``
    where ``items`` has a length); the bar is closed when the loop ends, also by an exception."""
    if total is None and hasattr(items, "__len__"):
        total = len(items) + initial
    shown = bar(total, desc, initial, enabled)
    try:
        for item in items:
            yield item
            shown.update()
    finally:
        shown.close()


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    """Add `FLAG` to ``parser`` (``args.progress``, default True)."""
    parser.add_argument(FLAG, dest="progress", action="store_false", help="no progress bar")
