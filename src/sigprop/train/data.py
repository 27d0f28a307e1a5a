"""From a run config to train/validation example sets (corpus -> split -> BPE -> objective)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from ..console.errors import UserError
from .config import RunConfig
from .corpus import load_documents, split_documents
from .images import load_digits_split
from .objectives import TEXT_OBJECTIVES, Batch
from .tokenizer import SPECIALS, BPETokenizer


class ExampleSet(Protocol):
    """What the trainer needs from a data set."""

    def __len__(self) -> int: ...
    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> Batch: ...


@dataclass
class DataBundle:
    """Train and validation sets, plus the tokenizer for text runs (None for images).

    Attributes:
        train: the training examples.
        val: the validation examples.
        tokenizer: the run's tokenizer; None for the digits images.
    """

    train: ExampleSet
    val: ExampleSet
    tokenizer: BPETokenizer | None


def get_tokenizer(cfg: RunConfig, train_docs: list[str], run_dir: Path) -> BPETokenizer:
    """The run's tokenizer: the saved one on resume, else ``data.tokenizer``, else BPE trained
    on the train split. Raises if it has more tokens than ``model.vocab_size``."""
    saved = run_dir / "tokenizer.json"
    if cfg.train.resume and saved.exists():
        tok = BPETokenizer.load(saved, field="tokenizer")
    elif cfg.data.tokenizer:
        tok = BPETokenizer.load(cfg.data.tokenizer)
    else:
        tok = BPETokenizer.train(train_docs, cfg.model.vocab_size)
    if tok.vocab_size > cfg.model.vocab_size:
        raise UserError(f"the tokenizer has {tok.vocab_size} tokens but model.vocab_size="
                        f"{cfg.model.vocab_size}; raise model.vocab_size")
    return tok


def _check_size(cfg: RunConfig, split: str, n_tokens: int, n_examples: int, need: int,
                extra: int) -> None:
    if n_examples < need:
        t = need * cfg.data.seq_len + extra
        raise UserError(
            f"corpus data.source={cfg.data.source!r} is too small: its {split} split has {n_tokens} "
            f"tokens, need at least {t} ({need} example(s) of data.seq_len={cfg.data.seq_len}); "
            f"add text or lower train.batch_size / data.seq_len")


def prepare_data(cfg: RunConfig, run_dir: Path, save_tokenizer: bool = True) -> DataBundle:
    """Build the data of a run; writes tokenizer.json into ``run_dir`` if ``save_tokenizer``.

    Args:
        cfg: the run's config (``data`` and ``train`` sections, ``model.vocab_size``).
        run_dir: the run folder.
        save_tokenizer: write the trained tokenizer there (rank 0 only, under torchrun).

    Returns:
        The `DataBundle`: train and validation sets and the tokenizer (None for the digits images).

    Raises:
        UserError: a corpus that cannot be loaded or is too small for a batch of ``data.seq_len``, or a
            tokenizer larger than ``model.vocab_size``.
    """
    d = cfg.data
    if cfg.objective == "digits":
        train, val = load_digits_split(d.val_fraction, cfg.train.seed)
        return DataBundle(train, val, None)
    docs = load_documents(d.source, d.pattern, d.text_column, d.max_chars)
    train_docs, val_docs = split_documents(docs, d.val_fraction, cfg.train.seed)
    tok = get_tokenizer(cfg, train_docs, run_dir)
    if save_tokenizer:
        tok.save(run_dir / "tokenizer.json")
    kind = TEXT_OBJECTIVES[cfg.objective]
    sets = []
    for split, split_docs, need in (("train", train_docs, cfg.train.batch_size), ("validation", val_docs, 1)):
        tokens = tok.encode_corpus(split_docs)
        s = kind(tokens, d.seq_len, tok.vocab_size, d.mask_prob, d.span_len, len(SPECIALS),
                 tok.mask_id, tok.bos_id)
        _check_size(cfg, split, len(tokens), len(s), need, kind.extra)
        sets.append(s)
    return DataBundle(sets[0], sets[1], tok)
