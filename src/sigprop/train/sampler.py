"""Data order as a pure function of the data position (examples consumed so far).

Epoch e visits all examples in a permutation seeded by (seed, e); the global batch at
position p is the examples p, p+1, ..., p+B-1 of that sequence. Every rank computes the
same global batch and keeps its own contiguous share, so N ranks with B/N examples each
see exactly what one process with B sees, and a checkpoint needs only p to resume.
"""
from __future__ import annotations

import torch

from ..fields import FieldError


def _seed(*parts: int) -> int:
    """A 63-bit seed mixing integer parts (splitmix-style), stable across runs and platforms."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h >> 1


def generator(*parts: int) -> torch.Generator:
    """A CPU torch.Generator seeded from integer parts (e.g. seed, data position)."""
    return torch.Generator().manual_seed(_seed(*parts))


class EpochSampler:
    """Example indices for any data position; a fresh seeded permutation each epoch."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError("EpochSampler needs at least one example")
        self.n, self.seed = n, seed
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = torch.randperm(self.n, generator=generator(self.seed, epoch))
        return self._perm

    def indices(self, position: int, count: int) -> torch.Tensor:
        """Indices of examples ``position .. position+count-1`` of the infinite sequence: (count,)."""
        out = []
        for p in range(position, position + count):
            epoch, i = divmod(p, self.n)
            out.append(self._permutation(epoch)[i])
        return torch.stack(out)


def shard_bounds(global_batch: int, world_size: int, rank: int, grad_accum: int
                 ) -> list[tuple[int, int]]:
    """Row ranges of this rank's micro-batches inside a global batch."""
    per_micro, rem = divmod(global_batch, world_size * grad_accum)
    if rem or per_micro == 0:
        raise FieldError(f"train.batch_size={global_batch} must be a positive multiple of "
                         f"world_size x train.grad_accum = {world_size} x {grad_accum}")
    start = rank * per_micro * grad_accum
    return [(start + k * per_micro, start + (k + 1) * per_micro) for k in range(grad_accum)]
