"""Text sources as lists of documents, and the deterministic train/validation split.

Built-in sources need no download: ``pydoc`` is the English reference text shipped in
CPython's ``pydoc_data.topics`` (~80 documents, ~0.45 M characters); ``stdlib`` is the
standard library's own ``.py`` source (a larger code corpus). A path names a text file
(documents separated by blank lines) or a folder (one document per file matching the
pattern); ``hf:DIR`` is a Hugging Face dataset saved with ``save_to_disk``.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path
from typing import Iterable, Iterator

from ..console.errors import UserError
from ..extras import require

SOURCES_HELP = "'pydoc', 'stdlib', 'hf:DIR' (datasets.save_to_disk), a text file or a folder"


def _pydoc() -> list[str]:
    from pydoc_data.topics import topics
    return [topics[k] for k in sorted(topics)]


def _stdlib() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    return (p.read_text(encoding="utf-8", errors="replace") for p in files)


def _hf(path: str, text_column: str) -> list[str]:
    datasets = require("datasets", f"data.source='hf:{path}'", "pip install datasets")
    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise UserError(f"hf:{path} has splits {list(ds)}; expected a 'train' split")
        ds = ds["train"]
    if text_column not in ds.column_names:
        raise UserError(f"hf:{path} has no column data.text_column={text_column!r}; "
                        f"columns: {ds.column_names}")
    return list(ds[text_column])


def _path(path: Path, pattern: str) -> list[str]:
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")
        return text.split("\n\n")
    return [p.read_text(encoding="utf-8", errors="replace")
            for p in sorted(path.glob(pattern)) if p.is_file()]


def load_documents(source: str, pattern: str = "**/*.txt", text_column: str = "text",
                   max_chars: int = 0) -> list[str]:
    """Documents of ``source`` in a fixed order, non-empty, cut to ``max_chars`` in total if > 0.

    Args:
        source: "pydoc" or "stdlib" (built in), ``hf:NAME`` (a Hugging Face dataset), or a file or folder.
        pattern: the glob of a folder's text files.
        text_column: the text column of a Hugging Face dataset.
        max_chars: the total characters kept (0: all).

    Raises:
        UserError: an unknown source, a dataset without a train split or that column, or a source that is
            empty or too small.
    """
    docs: Iterable[str]
    if source == "pydoc":
        docs = _pydoc()
    elif source == "stdlib":
        docs = _stdlib()
    elif source.startswith("hf:"):
        docs = _hf(source[3:], text_column)
    elif Path(source).exists():
        docs = _path(Path(source), pattern)
    else:
        raise UserError(f"data.source={source!r} is neither a built-in corpus nor an existing path; "
                        f"allowed: {SOURCES_HELP}")
    kept: list[str] = []
    total = 0
    for d in (d for d in docs if d.strip()):
        if max_chars and total >= max_chars:
            break
        kept.append(d[: max_chars - total] if max_chars else d)
        total += len(kept[-1])
    if len(kept) < 2:
        raise UserError(f"data.source={source!r} is {'too small' if kept else 'empty'}: {len(kept)} "
                        f"non-empty document(s), {total} characters; a run needs at least 2 documents "
                        "(train and validation are split by document)")
    return kept


def split_documents(docs: list[str], val_fraction: float, seed: int
                    ) -> tuple[list[str], list[str]]:
    """Split by document: a document goes to validation iff its seeded hash < ``val_fraction``.

    The hash depends only on (seed, text), so the split does not move when documents are
    added or reordered. At least one document is kept on each side.

    Args:
        docs: the documents.
        val_fraction: the expected fraction in validation.
        seed: the hash's seed.

    Returns:
        (train, validation) documents, each in the input order.

    Raises:
        UserError: fewer than two documents.
    """
    def u(doc: str) -> float:
        h = hashlib.blake2b(f"{seed}\0{doc}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2.0 ** 64

    if len(docs) < 2:
        raise UserError(f"need at least 2 documents for a train/validation split, got {len(docs)}")
    scores = [u(d) for d in docs]
    val_idx = {i for i, s in enumerate(scores) if s < val_fraction}
    if not val_idx:
        val_idx = {min(range(len(docs)), key=scores.__getitem__)}
    if len(val_idx) == len(docs):
        val_idx.discard(max(range(len(docs)), key=scores.__getitem__))
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    return train, val
