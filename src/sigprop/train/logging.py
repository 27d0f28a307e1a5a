"""Log sinks as callbacks: JSONL (always), TensorBoard (optional extra), the progress bar (`sigprop.console`)."""
from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..console.progress import bar
from ..extras import require
from .callbacks import Callback

if TYPE_CHECKING:
    from .trainer import Trainer


class JSONLLogger(Callback):
    """Appends every record as one JSON line to ``path`` (flushed per line, so a crash keeps it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = None

    def on_train_start(self, trainer: "Trainer") -> None:
        self._f = open(self.path, "a", encoding="utf-8")

    def on_log(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def on_train_end(self, trainer: "Trainer") -> None:
        self._f.close()


def read_jsonl(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl file, optionally only those of one ``kind``.

    Args:
        path: the file.
        kind: "train", "eval", "diag", "event", ...; None: all.

    Raises:
        OSError: the file cannot be read.
        json.JSONDecodeError: a line that is not JSON.
    """
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]


class TensorBoardLogger(Callback):
    """Scalars of every record under ``kind/key`` (needs the tensorboard extra)."""

    def __init__(self, log_dir: Path) -> None:
        tensorboard = require("torch.utils.tensorboard", "train.tensorboard=true", "pip install 'sigprop[tensorboard]'")
        self.writer = tensorboard.SummaryWriter(str(log_dir))

    def on_log(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        for key, value in record.items():
            if isinstance(value, numbers.Real) and key != "step":
                self.writer.add_scalar(f"{record['kind']}/{key}", value, record["step"])

    def on_train_end(self, trainer: "Trainer") -> None:
        self.writer.close()


class ProgressBar(Callback):
    """A progress bar (`sigprop.console.progress.bar`) over steps showing the latest loss, lr and validation loss."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.shown: dict[str, str] = {}

    def on_train_start(self, trainer: "Trainer") -> None:
        self.bar = bar(trainer.cfg.train.steps, "train", initial=trainer.state.step)

    def on_log(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        if record["kind"] == "train":
            self.shown.update(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")
            self.bar.update(record["step"] - self.bar.n)
        elif record["kind"] == "eval":
            self.shown["val"] = f"{record['loss']:.4f}"
        self.bar.set_postfix(self.shown, refresh=False)

    def on_train_end(self, trainer: "Trainer") -> None:
        self.bar.close()
