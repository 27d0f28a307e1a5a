"""Writing a file so that an interruption (Ctrl-C, SIGTERM, kill -9) never leaves half of it: the text goes to a
temporary file beside it, which then replaces it in one rename."""
from __future__ import annotations

from pathlib import Path


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (``PATH.tmp``, then an atomic rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
