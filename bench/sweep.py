"""Per-point overhead of `sigprop sweep`: what a point pays besides its training steps.

    OMP_NUM_THREADS=1 python bench/sweep.py

Measures (wall seconds, median of ``REPEATS``): training the BPE tokenizer (what a point would pay
without the sweep's pinned tokenizer), loading the pinned one, a point's data preparation with the
pinned tokenizer (corpus read + encoding), a worker process start with the start methods
`sigprop.train.sweep` may use (fork on Linux, spawn elsewhere: paid once per worker with ``--jobs N``),
and one whole 1-step point in-process. Corpus: "pydoc", 200 000 characters,
vocabulary 512 (the depth-transfer settings).
"""
from __future__ import annotations

import functools
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

from sigprop.train.config import RunConfig, from_mapping
from sigprop.train.corpus import load_documents, split_documents
from sigprop.train.data import prepare_data
from sigprop.train.sweep import SweepSpec, pin_tokenizers, point_id, resolve, run_point
from sigprop.train.tokenizer import BPETokenizer

REPEATS = 3
BASE = {"model": {"arch": "decoder", "vocab_size": 512, "d_model": 64, "n_heads": 4, "max_seq_len": 32, "n_layers": 2},
        "data": {"source": "pydoc", "seq_len": 32, "max_chars": 200000},
        "train": {"steps": 1, "batch_size": 8, "eval_batches": 1}}


def timed(fn) -> float:
    out = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _worker_ready() -> None:
    import sigprop.train.run  # noqa: F401  (what a sweep worker imports)


def start_worker(method: str) -> None:
    p = multiprocessing.get_context(method).Process(target=_worker_ready)
    p.start()
    p.join()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = SweepSpec(BASE, {"optim.lr": [1e-3]}, Path(tmp))
        cfg = resolve(spec)[0][1]
        docs = load_documents("pydoc", "**/*.txt", "text", 200000)
        train_docs = split_documents(docs, cfg.data.val_fraction, 0)[0]
        path = Path(tmp) / "tok.json"
        rows = {"train BPE tokenizer": timed(lambda: BPETokenizer.train(train_docs, 512).save(path)),
                "load pinned tokenizer": timed(lambda: BPETokenizer.load(path))}
        raw = cfg.to_dict()
        raw["data"]["tokenizer"] = str(path)
        pinned = from_mapping(RunConfig, raw)
        rows["prepare_data (pinned tokenizer)"] = timed(lambda: prepare_data(pinned, Path(tmp), save_tokenizer=False))
        for method in ("fork", "spawn"):
            rows[f"worker process start ({method} + imports)"] = timed(functools.partial(start_worker, method))
        (point, c), = pin_tokenizers(spec, resolve(spec))
        rows["whole 1-step point, in-process"] = timed(lambda: run_point(point_id(spec, point), point, c.to_dict()))
    for name, t in rows.items():
        print(f"| {name} | {t:.2f} s |")


if __name__ == "__main__":
    main()
