"""Chebyshev tables of the Gaussian-logit softmax functionals: the fast path of `Attention`.

`Attention` needs, per input, the row averages R_k(β) (k = F2, F22, Z1, Z2, B, Bz of
`softmax.row_functionals`, averaged over the rows' key counts) and the pair averages P_k(β, ρ)
(K1, K2, CK of `softmax.pair_functionals`, averaged over query pairs), each at a few dozen
fluctuation nodes (β² w, ρ̂). They depend on the input only through (β, ρ) and on the model only
through (L, causal), and they are analytic in both (Gaussian expectations of entire functions,
even in β), so tensor Chebyshev interpolation on β ∈ [0, β_max], ρ ∈ [−1, 1] converges
geometrically. One table per (L, causal) is built from the exact functionals at the nodes
(O(L) row quadratures and O(L²) query-pair key counts, once) and then answers by a few polynomial
evaluations (their cost: docs/moments.md §3). Causal tables also keep the
per-row profiles F2(n), B(n), n = 1..L (`profiles`, for the per-position backward of `causal`).

Transforms: the positive functionals are interpolated in log (relative accuracy where they are
small, e.g. F2 ~ e^{β²}/n); Z1 = 1/n + O(β²) and K2 (signed) linearly (log Z1 has a near-singularity
at β ~ i/√n). The tables and the attention moments built on them are within 1e-3 relative of the exact
functionals (tests/test_predict.py; the measured errors: docs/moments.md §3). Outside β_max (where the exact
quadrature itself loses accuracy) the caller falls back to the exact path.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .softmax import pair_functionals, row_functionals

BETA_MAX = 3.0                     # largest logit scale β tabulated (β² = 9)
ROW_NODES = 20                     # Chebyshev nodes in β for the row averages
PAIR_NODES = (10, 10)              # Chebyshev nodes in (β, ρ) for the pair averages
ROW_KEYS = ("F2", "F22", "Z1", "Z2", "B", "Bz")
PROFILE_KEYS = ("F2", "B")         # per key count n (causal rows), for `causal`; interpolated linearly (B = 0 at n = 1)
PAIR_KEYS = ("K1", "K2", "CK")
LINEAR = ("Z1", "K2")              # interpolated as is; the others in log when positive at every node
_FEW_POINTS = 64                   # `_vander` by cosines up to this many points, else by the recurrence
_DEGREES = np.arange(float(max(ROW_NODES, *PAIR_NODES)))


@lru_cache(maxsize=16)
def key_counts(L: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Keys per row (n_i = i causal, else L) and per query pair (n1 < n2 causal, else (L, L)); read-only."""
    if causal:
        return np.arange(1, L + 1, dtype=float), np.stack(np.triu_indices(L, 1), 1) + 1.0
    return np.array([float(L)]), np.array([[L, L]], dtype=float)


def exact_rows(beta2: float, L: int, causal: bool, dof: int = 0) -> dict[str, float]:
    """Row averages of the exact row functionals at logit variance ``beta2`` (``dof``: `softmax.RowSums`): those of
    ROW_KEYS, and with ``dof`` also Bzz (`qk_norm`)."""
    f = row_functionals(beta2, key_counts(L, causal)[0], dof)
    return {k: float(np.mean(f[k])) for k in (*ROW_KEYS, "Bzz") if k in ROW_KEYS or dof}


def exact_profiles(beta2: float | np.ndarray, L: int, dof: int = 0) -> np.ndarray:
    """(len(PROFILE_KEYS), L): F2 and B of a causal row with n = 1..L keys at logit variance ``beta2`` (one, or
    one per row; ``dof``: `softmax.RowSums`)."""
    n = key_counts(L, True)[0]
    if not np.ndim(beta2):
        f = row_functionals(float(beta2), n, dof)
        return np.stack([f[k] for k in PROFILE_KEYS])
    rows = [row_functionals(float(b), n[i:i + 1], dof) for i, b in enumerate(beta2)]
    return np.array([[f[k][0] for f in rows] for k in PROFILE_KEYS])


def exact_pairs(beta2: float, rho: float | np.ndarray, L: int, causal: bool) -> dict[str, float | np.ndarray]:
    """Pair averages of the exact pair functionals at logit variance ``beta2`` and logit correlation ``rho``
    (one, or an array: one value each)."""
    return pair_functionals(beta2, rho, key_counts(L, causal)[1])


def _nodes(n: int) -> np.ndarray:
    return np.cos(np.pi * (np.arange(n) + 0.5) / n)            # Chebyshev points of the first kind


def _values(f: dict[str, float], keys: tuple[str, ...]) -> list[float]:
    return [f[k] for k in keys]


def _fit(values: np.ndarray, keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """values (..., k) at the nodes → transformed values and a per-key log flag."""
    logged = np.array([k not in LINEAR and bool(np.all(values[..., i] > 0)) for i, k in enumerate(keys)])
    out = values.copy()
    out[..., logged] = np.log(values[..., logged])
    return out, logged


def _vander(x: np.ndarray, n: int) -> np.ndarray:
    """Chebyshev Vandermonde T_0..T_{n−1} at x ∈ [−1, 1], (len(x), n): cos(j·arccos x) at a few points; at many
    (the per-row profiles) by the recurrence T_{j+1} = 2x T_j − T_{j−1}, stable on [−1, 1] and a few times
    cheaper there (n vector steps instead of n·len(x) cosines)."""
    x = np.minimum(np.maximum(x, -1.0), 1.0)
    if len(x) <= _FEW_POINTS:
        return np.cos(np.arccos(x)[:, None] * _DEGREES[:n])
    out = np.empty((n, len(x)))
    out[0] = 1.0
    out[1:2] = x
    twice = 2 * x
    for j in range(2, n):
        np.multiply(twice, out[j - 1], out=out[j])
        out[j] -= out[j - 2]
    return out.T


def _untransform(values: np.ndarray, logged: np.ndarray, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    values[..., logged] = np.exp(values[..., logged])
    return {k: values[..., i] for i, k in enumerate(keys)}


class RowTable:
    """Row averages R_k(β) (and causal per-row profiles) for ``L`` keys (``causal`` masking)."""

    def __init__(self, L: int, causal: bool) -> None:
        xb = _nodes(ROW_NODES)
        per_n = [row_functionals((BETA_MAX * (x + 1) / 2) ** 2, key_counts(L, causal)[0]) for x in xb]
        rows = np.array([[float(np.mean(f[k])) for k in ROW_KEYS] for f in per_n])
        values, self.row_log = _fit(rows, ROW_KEYS)
        self.row_coef = np.linalg.solve(_vander(xb, ROW_NODES), values)                           # (nb, k)
        profiles = np.array([[f[k] for k in PROFILE_KEYS] for f in per_n]) if causal else None    # (nb, k, L)
        self.profile_coef = (None if profiles is None
                             else np.einsum("bi,ikl->bkl", np.linalg.inv(_vander(xb, ROW_NODES)), profiles))
        self._by_row = (None if profiles is None                                                  # (L, b, k)
                        else np.ascontiguousarray(self.profile_coef.transpose(2, 0, 1)))

    @staticmethod
    def covers(beta2: float) -> bool:
        return beta2 <= BETA_MAX ** 2

    def rows(self, beta2: np.ndarray) -> dict[str, np.ndarray]:
        """R_k at each entry of ``beta2`` (all <= β_max²)."""
        x = 2 * np.sqrt(beta2) / BETA_MAX - 1
        return _untransform(_vander(x, ROW_NODES) @ self.row_coef, self.row_log, ROW_KEYS)

    def profiles(self, beta2: np.ndarray) -> np.ndarray:
        """(len(beta2), len(PROFILE_KEYS), L): per-row F2 and B of a causal table (n = 1..L keys)."""
        if self.profile_coef is None:
            raise ValueError("per-row profiles are tabulated for causal tables only")
        nb, k, L = self.profile_coef.shape
        vander = _vander(2 * np.sqrt(beta2) / BETA_MAX - 1, ROW_NODES)
        return (vander @ self.profile_coef.reshape(nb, k * L)).reshape(len(beta2), k, L)

    def profiles_by_row(self, beta2: np.ndarray) -> np.ndarray:
        """(P, len(PROFILE_KEYS), L): per-row F2 and B of a causal table with row i (n = i + 1 keys) read at its
        own logit variance ``beta2[p, i]`` ((P, L), all <= β_max²)."""
        if self.profile_coef is None:
            raise ValueError("per-row profiles are tabulated for causal tables only")
        p, L = beta2.shape
        vander = _vander((2 * np.sqrt(beta2) / BETA_MAX - 1).T.ravel(), ROW_NODES).reshape(L, p, ROW_NODES)
        return (vander @ self._by_row).transpose(1, 2, 0)                   # per row l: (p, b) @ (b, k)


@lru_cache(maxsize=16)
def row_table(L: int, causal: bool) -> RowTable:
    """The row table for (L, causal), built on first use (what the attention gain needs: no pairs, which cost
    O(L²) causal query pairs)."""
    return RowTable(L, causal)


class FunctionalTable:
    """Row averages R_k(β) (`RowTable`) and pair averages P_k(β, ρ) for ``L`` keys (``causal`` masking)."""

    def __init__(self, L: int, causal: bool) -> None:
        self.L, self.causal = L, causal
        self.row_table = row_table(L, causal)
        nb, nr = PAIR_NODES
        xb, xr = _nodes(nb), _nodes(nr)
        pairs = np.array([np.stack(_values(exact_pairs((BETA_MAX * (x + 1) / 2) ** 2, xr, L, causal), PAIR_KEYS), -1)
                          for x in xb])                                                             # (nb, nr, k)
        values, self.pair_log = _fit(pairs, PAIR_KEYS)
        inv_b, inv_r = np.linalg.inv(_vander(xb, nb)), np.linalg.inv(_vander(xr, nr))
        self.pair_coef = np.einsum("bi,rj,ijk->brk", inv_b, inv_r, values)                        # (nb, nr, k)

    covers = staticmethod(RowTable.covers)

    def rows(self, beta2: np.ndarray) -> dict[str, np.ndarray]:
        """R_k at each entry of ``beta2`` (all <= β_max²)."""
        return self.row_table.rows(beta2)

    def profiles(self, beta2: np.ndarray) -> np.ndarray:
        """(len(beta2), len(PROFILE_KEYS), L): per-row F2 and B of a causal table (n = 1..L keys)."""
        return self.row_table.profiles(beta2)

    def profiles_by_row(self, beta2: np.ndarray) -> np.ndarray:
        """`RowTable.profiles_by_row`: row i read at its own logit variance ``beta2[:, i]``."""
        return self.row_table.profiles_by_row(beta2)

    def pairs(self, beta2: np.ndarray, rho: np.ndarray) -> dict[str, np.ndarray]:
        """P_k at each (beta2, rho) entry."""
        x = 2 * np.sqrt(beta2) / BETA_MAX - 1
        vb, vr = _vander(x, PAIR_NODES[0]), _vander(rho, PAIR_NODES[1])
        basis = (vb[:, :, None] * vr[:, None, :]).reshape(len(x), -1)                    # T_b(x) T_r(ρ)
        return _untransform(basis @ self.pair_coef.reshape(basis.shape[1], -1), self.pair_log, PAIR_KEYS)


@lru_cache(maxsize=16)
def functional_table(L: int, causal: bool) -> FunctionalTable:
    """The table for (L, causal), built on first use."""
    return FunctionalTable(L, causal)
