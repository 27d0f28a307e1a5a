"""The loss a run must beat to count as training: the unigram level, and the margin below it.

A model that ignores its input reaches the *unigram level*: the cross-entropy of the held-out targets under the
training split's token frequencies (for a classifier, its class prior). A run *trains* if it ends at least
`TRAIN_MARGIN` nats below that level (`trains`); a run that does not has stalled on the plateau, or failed.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from .config import RunConfig, load_config
from .data import DataBundle, prepare_data
from .objectives import IGNORE
from .sampler import generator
from .trainer import EVAL_STREAM

TRAIN_MARGIN = 0.1       # nats below the unigram level a run must end to count as training


def trains(loss: float, unigram: float, margin: float = TRAIN_MARGIN) -> bool:
    """A run *trains* if its final held-out loss is finite and at least ``margin`` nats below the unigram
    level (module docstring)."""
    return math.isfinite(loss) and loss <= unigram - margin


def unigram_nll(train_tokens: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """U = −mean log p̂(t) over the ``targets`` t that carry a loss (``IGNORE`` entries skipped, as the
    training loss skips them: masked LM scores only its picked positions), p̂(k) = (n_k + 1) / (N + V), the
    add-one-smoothed frequencies of the N ``train_tokens`` over V = ``vocab_size`` ids."""
    counts = torch.bincount(train_tokens.flatten(), minlength=vocab_size).double() + 1.0
    scored = targets[targets != IGNORE]
    return float(-(counts / counts.sum()).log()[scored].mean())


def unigram_loss(run_dir: str | Path) -> float:
    """`unigram_nll` of a finished run's evaluation targets under its training split's frequencies (same
    tokenizer, split and evaluation batch as the run): the loss of a model that learned token frequencies
    and ignores the context. For a classifier (digits) the same of its labels: the class prior's cross-entropy,
    the loss of a model that ignores the image."""
    run_dir = Path(run_dir)
    digits = load_config(run_dir / "config.toml").objective == "digits"
    cfg = load_config(run_dir / "config.toml", [] if digits else [f'data.tokenizer="{run_dir / "tokenizer.json"}"'])
    data = prepare_data(cfg, run_dir, save_tokenizer=False)
    n = min(len(data.val), cfg.train.eval_batches * cfg.train.batch_size)
    return unigram_level(cfg, data, data.val.batch(torch.arange(n), generator(cfg.train.seed, EVAL_STREAM)).targets)


def unigram_level(cfg: RunConfig, data: DataBundle, targets: torch.Tensor) -> float:
    """`unigram_nll` of ``targets`` under the frequencies of ``data``'s training split: its tokens, or for a
    classifier (digits) its labels (the class prior)."""
    if cfg.objective == "digits":
        return unigram_nll(data.train.labels, targets, cfg.model.n_classes)
    return unigram_nll(data.train.tokens, targets, data.tokenizer.vocab_size)
