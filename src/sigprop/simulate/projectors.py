"""Samplers of the random projections the block maps use; all three have the same law.

A block touches its random weights only through (a) logits (X W_Q/√n)(X W_K/√n)ᵀ, (b) projections
X W/√n, and (c) residual updates X' = λX + γ B (S W/√n) with S = X or S = H, B an m×m mixing
matrix (the attention matrix) or the identity. W is always fresh, N(0, 1) entries.

* `WeightProjector` — explicit W: O(m n²) work, n² normals per projection.
* `GaussianProjector` — X W/√n =ᵈ R Z with R Rᵀ = XXᵀ/n, Z ∈ R^{m×out} iid N(0, 1): O(m² n)
  work, m·out normals. Logits: (R Z_Q)(R Z_K)ᵀ = R (Z_Q Z_Kᵀ) Rᵀ and Z_Q Z_Kᵀ =ᵈ G Fᵀ, F Fᵀ ~
  Wishart_m(I, n_k), F from Bartlett's decomposition (m² + m numbers) when n_k ≥ m.
* `GramProjector` — the state is V = XXᵀ/n itself (LN-free blocks only). With X = √n R_X O_X,
  S = √n R_S O_S (O orthonormal rows), E = O_X Wᵀ O_Sᵀ is m×m iid N(0, 1) and, independently,
  (O_S W)(O_S W)ᵀ − EᵀE ~ Wishart_m(I, n − m), so
  X' X'ᵀ/n = λ²V + λγ(C + Cᵀ) + γ² B R_S (EᵀE + Wishart)R_Sᵀ Bᵀ/n,  C = R_X E R_Sᵀ Bᵀ/√n,
  exactly, with O(m³) work; only the MLP pre-activation still needs m·n normals.

Roots R come from `sigprop.theory.sde.psd_root`: Cholesky, or the eigen-root for singular Gram
matrices (identical tokens, rank collapse) — exact, no jitter.
"""
from __future__ import annotations

import math

import torch

from ..theory.sde import psd_root

Tensor = torch.Tensor


def wishart_factor(samples: int, m: int, dof: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """F (samples, m, min(m, dof)) with F Fᵀ ~ Wishart_m(I, dof): Bartlett's lower-triangular factor
    (F_ii = √χ²_{dof−i}, F_ij ~ N(0, 1) for i > j) when dof ≥ m, else dof columns of normals."""
    if dof < m:
        return torch.randn(samples, m, dof, generator=generator, dtype=dtype)
    F = torch.randn(samples, m, m, generator=generator, dtype=dtype).tril(-1)
    k = (dof - torch.arange(m, dtype=dtype)).expand(samples, m)
    # χ²_k = 2·Gamma(k/2); torch's public Chi2 cannot take a Generator.
    F.diagonal(dim1=-2, dim2=-1).copy_((2 * torch._standard_gamma(k / 2, generator=generator)).sqrt())
    return F


def _mix(B: Tensor | None, Z: Tensor) -> Tensor:
    return Z if B is None else B @ Z


class WeightProjector:
    """Explicit weight matrices W (S, n, out); the state is X (S, m, n)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.gen = generator

    def project(self, X: Tensor, out: int) -> Tensor:
        """X W/√n, (S, m, out)."""
        S, _, n = X.shape
        return X @ torch.randn(S, n, out, generator=self.gen, dtype=X.dtype) / math.sqrt(n)

    def logits(self, X: Tensor, n_k: int) -> Tensor:
        """(X W_Q/√n)(X W_K/√n)ᵀ, (S, m, m)."""
        return self.project(X, n_k) @ self.project(X, n_k).mT

    def residual(self, X: Tensor, source: Tensor, B: Tensor | None, lam: float, gamma: float) -> Tensor:
        """λX + γ B (source W/√n), W ∈ R^{n×n}; B (S, m, m) or None for the identity."""
        return lam * X + gamma * _mix(B, self.project(source, X.shape[-1]))

    def initial(self, X0: Tensor) -> Tensor:
        """The state for initial tokens X0 (S, m, n)."""
        return X0

    @staticmethod
    def covariance(X: Tensor) -> Tensor:
        """Token covariance (S, m, m) of a state."""
        return X @ X.mT / X.shape[-1]


class GaussianProjector(WeightProjector):
    """X W/√n drawn as R Z with R Rᵀ = XXᵀ/n; logits via the Bartlett factor. The state is X."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__(generator)
        self._key: Tensor | None = None
        self._R: Tensor | None = None

    def root(self, X: Tensor) -> Tensor:
        """R (S, m, m) with R Rᵀ = XXᵀ/n, cached for the last X (Q, K, V projections share it)."""
        if X is not self._key:
            self._key, self._R = X, psd_root(X @ X.mT / X.shape[-1])[0]
        return self._R

    def _normal(self, like: Tensor, *shape: int) -> Tensor:
        return torch.randn(like.shape[0], *shape, generator=self.gen, dtype=like.dtype)

    def project(self, X: Tensor, out: int) -> Tensor:
        R = self.root(X)
        return R @ self._normal(R, R.shape[-1], out)

    def logits(self, X: Tensor, n_k: int) -> Tensor:
        R = self.root(X)
        S, m, _ = R.shape
        F = wishart_factor(S, m, n_k, self.gen, R.dtype)
        return R @ self._normal(R, m, F.shape[-1]) @ F.mT @ R.mT


class GramProjector(GaussianProjector):
    """The state is V (S, m, m) = XXᵀ/n (LN-free blocks only); `width` is n."""

    def __init__(self, generator: torch.Generator, width: int) -> None:
        super().__init__(generator)
        self.width = width
        self.state: Tensor | None = None

    def initial(self, X0: Tensor) -> Tensor:
        self.state = X0 @ X0.mT / self.width
        return self.state

    def root(self, X: Tensor) -> Tensor:
        """Root of the state V, or of HHᵀ/n for a (S, m, n) matrix H."""
        if X is not self._key:
            self._key, self._R = X, psd_root(X if X is self.state else X @ X.mT / self.width)[0]
        return self._R

    def residual(self, V: Tensor, source: Tensor, B: Tensor | None, lam: float, gamma: float) -> Tensor:
        n, Rx = self.width, self.root(V)
        Rs = Rx if source is V else psd_root(source @ source.mT / n)[0]
        S, m, _ = V.shape
        E = self._normal(V, m, m)
        F = wishart_factor(S, m, n - m, self.gen, V.dtype)
        C = _mix(B, Rs @ E.mT @ Rx.mT).mT / math.sqrt(n)  # X Z'ᵀ Bᵀ/n
        M = _mix(B, Rs @ (E.mT @ E + F @ F.mT) @ Rs.mT / n)
        M = M if B is None else M @ B.mT  # B Z'Z'ᵀ Bᵀ/n
        self.state = lam**2 * V + lam * gamma * (C + C.mT) + gamma**2 * M
        return self.state

    @staticmethod
    def covariance(V: Tensor) -> Tensor:
        return V
