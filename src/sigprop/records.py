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


@dataclass(frozen=True)
class Record:
    layer: int                       # block index, 1-based; 0 = embeddings
    sublayer: str                    # "embed" | "attn" | "cross" | "mlp"
    fwd_mean: float                  # mean of the output over batch, tokens and features
    fwd_var: float                   # variance of the output
    token_corr: float                # Cov(x_i, x_j)/Var(x) between different tokens, same feature
    grad_var: float | None = None    # variance of ∂loss/∂output
    stack: str = "dec"               # "enc" | "dec"
    source: str = "measured"         # "measured" | "predicted"
    attn_entropy: float | None = None  # softmax entropy per row, averaged over rows, heads, batch
    max_logit: float | None = None     # largest attention logit
    stable_rank: float | None = None   # ‖X‖_F²/‖X‖₂² of the (tokens × features) output, batch mean


FIELDS = tuple(f.name for f in dataclasses.fields(Record))


def to_rows(records: Iterable[Record]) -> list[dict]:
    return [dataclasses.asdict(r) for r in records]


def to_json(records: Iterable[Record], path: str | Path | None = None) -> str:
    text = json.dumps(to_rows(records), indent=1)
    if path is not None:
        Path(path).write_text(text)
    return text


def from_json(text: str) -> list[Record]:
    return [Record(**row) for row in json.loads(text)]


def to_csv(records: Iterable[Record], path: str | Path | None = None) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in to_rows(records):
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    if path is not None:
        Path(path).write_text(buf.getvalue())
    return buf.getvalue()


def to_dataframe(records: Iterable[Record]):
    """A pandas DataFrame (needs the optional ``pandas`` package)."""
    return require("pandas", "to_dataframe", "pip install pandas").DataFrame(to_rows(records), columns=FIELDS)


def format_table(records: Iterable[Record], fields: tuple[str, ...] = ("stack", "layer", "sublayer", "fwd_var",
                                                                      "token_corr", "grad_var")) -> str:
    """A fixed-width text table (`Table.text`) of ``fields``, one row per record; a missing value reads "-"."""
    return Table(fields, [["-" if r[f] is None else r[f] for f in fields] for r in to_rows(records)]).text()
