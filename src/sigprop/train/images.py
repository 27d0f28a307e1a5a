"""Image classification on scikit-learn's 8x8 digits (1797 images, shipped inside sklearn)."""
from __future__ import annotations

import torch

from ..extras import require
from .objectives import Batch


class Digits:
    """Labelled images as an example set: ``batch(idx)`` -> ((B, 1, 8, 8),) and (B,) labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> Batch:
        return Batch((self.images[idx],), self.labels[idx])


def load_digits_split(val_fraction: float, seed: int) -> tuple[Digits, Digits]:
    """Train/validation sets: pixels scaled to [0, 1] then standardised with the train mean/std;
    the split is a seeded permutation of the examples."""
    sklearn_datasets = require("sklearn.datasets", "data.source='digits'",
                               "pip install 'sigprop[train]' (or pip install scikit-learn)")
    d = sklearn_datasets.load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0       # (N, 1, 8, 8)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(val_fraction * len(y)))
    val, train = perm[:n_val], perm[n_val:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return Digits(x[train], y[train]), Digits(x[val], y[val])
