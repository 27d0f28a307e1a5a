"""Covariances over the L token positions of one feature, (L, L): the helpers every per-position map shares.

A per-position state is a symmetric matrix X over positions: C_jk = Cov(x_j^a, x_k^a) forward, G_jk = E[g_j^a g_k^a]
backward (`causal`). Its position means are the exchangeable `Moments` it summarizes: variance the mean diagonal,
covariance the mean off-diagonal.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .postnorm import PostNormResidual
from .residual import Residual
from .state import Moments, ratio, replace


@lru_cache(maxsize=8)
def later(L: int) -> np.ndarray:
    """max(j, k) over position pairs, (L, L) (read-only)."""
    idx = np.arange(L)
    out = np.maximum.outer(idx, idx)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=8)
def upper(L: int) -> np.ndarray:
    """1[j < k] over position pairs, (L, L) (read-only)."""
    out = np.triu(np.ones((L, L)), 1)
    out.flags.writeable = False
    return out


def tail(x: np.ndarray) -> np.ndarray:
    """Σ_{i ≥ j} x_i for every j (a reversed cumulative sum)."""
    return np.cumsum(x[::-1])[::-1]


def residual_sum(c: Residual | PostNormResidual, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """α²X + β²Y of the residual sublayer ``c`` (its input's and its branch's covariances), written into ``Y``
    when it is not ``X`` (a branch's result is a new array unless the branch is the identity)."""
    if Y is X:
        return (c.alpha ** 2 + c.beta ** 2) * X
    if c.beta != 1.0:
        Y *= c.beta ** 2
    Y += X if c.alpha == 1.0 else c.alpha ** 2 * X
    return Y


def alike(v: np.ndarray) -> bool:
    """Whether every position's value is the same."""
    return bool(v.max() == v.min())


def gains(G: np.ndarray, on: np.ndarray | float, off: np.ndarray | float) -> np.ndarray:
    """G with its diagonal times ``on`` and its off-diagonal times ``off`` (scalars, or per-position
    vectors: entry (j, k) × off_j off_k)."""
    if isinstance(off, np.ndarray):
        out = off[:, None] * off
        out *= G
    else:
        out = G * off
    out.flat[::len(G) + 1] = np.diagonal(G) * on
    return out


def position_means(M: np.ndarray) -> tuple[float, float]:
    """(mean diagonal, mean off-diagonal) of an (L, L) covariance over positions."""
    L = len(M)
    var = float(M.trace()) / L
    return var, (float(M.sum()) - L * var) / (L * (L - 1))


def grad_summary(G: np.ndarray, m: Moments) -> Moments:
    """``m`` with the position-averaged gradient moments of G."""
    var, cov = position_means(G)
    return replace(m, grad_var=var, grad_corr=ratio(cov, var))


def uniform(m: Moments, L: int) -> np.ndarray:
    """The exchangeable covariance over L positions: σ² on the diagonal, rσ² off it."""
    out = np.full((L, L), m.cov)
    out.flat[::L + 1] = m.var
    return out


def summary(C: np.ndarray, m: Moments) -> Moments:
    """``m`` with C's position means: variance the mean diagonal, correlation the mean off-diagonal over it."""
    var, cov = position_means(C)
    return replace(m, var=var, corr=ratio(cov, var))
