"""The per-layer record: one schema for predicted (theory) and measured (diagnostics) moments.

One row per sublayer output (plus the embedding output as layer 0). Fields that a source does
not provide stay ``None``. Records convert to CSV/JSON with the standard library; pandas is
optional (`to_dataframe`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .extras import require
from .table import Table

__all__ = ["Record", "FIELDS", "to_rows", "to_json", "from_json", "to_csv", "to_dataframe", "format_table"]


@dataclass(frozen=True)
class Record:
    """One sublayer output's moments, predicted or measured.

    Attributes:
        layer: block index, 1-based; 0 = embeddings.
        sublayer: "embed" | "attn" | "cross" | "mlp" (with ``blocks`` selected by `measure`: the module's class).
        fwd_mean: mean of the output over batch, tokens and features.
        fwd_var: variance of the output.
        token_corr: Cov(x_i, x_j)/Var(x) between different tokens, same feature.
        grad_var: variance of ∂loss/∂output.
        stack: "enc" | "dec" ("model" for modules selected by ``blocks``).
        source: "measured" | "predicted".
        attn_entropy: softmax entropy per row, averaged over rows, heads, batch.
        max_logit: largest attention logit.
        stable_rank: ‖X‖_F²/‖X‖₂² of the (tokens × features) output, batch mean.
    """

    layer: int
    sublayer: str
    fwd_mean: float
    fwd_var: float
    token_corr: float
    grad_var: float | None = None
    stack: str = "dec"
    source: str = "measured"
    attn_entropy: float | None = None
    max_logit: float | None = None
    stable_rank: float | None = None


FIELDS = tuple(f.name for f in dataclasses.fields(Record))
"""The `Record` field names, in order: the columns of `to_csv` and `to_dataframe`."""


def to_rows(records: Iterable[Record]) -> list[dict]:
    """One dict per record, field name -> value."""
    return [dataclasses.asdict(r) for r in records]


def to_json(records: Iterable[Record], path: str | Path | None = None) -> str:
    """The records as a JSON list of objects (`from_json` reads it back).

    Args:
        records: the rows.
        path: also write the text there.

    Raises:
        OSError: ``path`` cannot be written.
    """
    text = json.dumps(to_rows(records), indent=1)
    if path is not None:
        Path(path).write_text(text)
    return text


def from_json(text: str) -> list[Record]:
    """The records of a `to_json` text.

    Raises:
        json.JSONDecodeError: ``text`` is not JSON.
        TypeError: an object with a key that is not a `Record` field, or without a required one.
    """
    return [Record(**row) for row in json.loads(text)]


def to_csv(records: Iterable[Record], path: str | Path | None = None) -> str:
    """The records as CSV, a header of `FIELDS` then one line per record; a missing value is an empty cell.

    Args:
        records: the rows.
        path: also write the text there.

    Raises:
        OSError: ``path`` cannot be written.
    """
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in to_rows(records):
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    if path is not None:
        Path(path).write_text(buf.getvalue())
    return buf.getvalue()


def to_dataframe(records: Iterable[Record]):
    """A pandas DataFrame, one row per record, columns `FIELDS`.

    Raises:
        ImportError: ``pandas`` is not installed (the message gives the install command).
    """
    return require("pandas", "to_dataframe", "pip install pandas").DataFrame(to_rows(records), columns=FIELDS)


def format_table(records: Iterable[Record], fields: tuple[str, ...] = ("stack", "layer", "sublayer", "fwd_var",
                                                                      "token_corr", "grad_var")) -> str:
    """A fixed-width text table (`Table.text`) of ``fields``, one row per record; a missing value reads "-"."""
    return Table(fields, [["-" if r[f] is None else r[f] for f in fields] for r in to_rows(records)]).text()
