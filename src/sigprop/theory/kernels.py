"""Gaussian expectations of activations: the kernels every moment map and SDE drift uses.

For (u, v) jointly Gaussian with unit variances and correlation rho:

* ``relu_kernel(rho)``   = E[relu(u) relu(v)] / E[relu(u)^2]
                         = (sqrt(1-rho^2) + (pi - arccos rho) rho) / pi          (Cho & Saul, degree 1)
* ``shaped_relu_nu(rho, c_plus, c_minus)``
                         = (c_plus - c_minus)^2 / (2 pi) * (sqrt(1-rho^2) - rho arccos rho),
  the drift of the shaped-ReLU kernel (Li, Nica, Roy 2022): with s± = 1 + c±/sqrt(n),
  c = 1/E[phi_s(g)^2], n * (c E[phi_s(u) phi_s(v)] - rho) -> nu(rho) as n -> inf.
  The seed text prints it with both signs flipped; nu >= 0 and nu(1) = 0 here.

All functions accept floats or tensors and work elementwise.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

Tensorish = float | torch.Tensor


def _acos(rho: Tensorish) -> Tensorish:
    if isinstance(rho, torch.Tensor):
        return torch.arccos(rho.clamp(-1.0, 1.0))
    return math.acos(max(-1.0, min(1.0, rho)))


def _sqrt1m2(rho: Tensorish) -> Tensorish:
    if isinstance(rho, torch.Tensor):
        return (1.0 - rho * rho).clamp_min(0.0).sqrt()
    return math.sqrt(max(0.0, 1.0 - rho * rho))


def relu_kernel(rho: Tensorish) -> Tensorish:
    """Normalized degree-1 arc-cosine kernel: E[relu(u)relu(v)] / E[relu(u)^2] for unit Gaussians."""
    return (_sqrt1m2(rho) + (math.pi - _acos(rho)) * rho) / math.pi


def shaped_relu_nu(rho: Tensorish, c_plus: float = 0.0, c_minus: float = -1.0) -> Tensorish:
    """Shaped-ReLU kernel drift nu(rho) = (c+ - c-)^2/(2 pi) (sqrt(1-rho^2) - rho arccos rho)."""
    return (c_plus - c_minus) ** 2 / (2 * math.pi) * (_sqrt1m2(rho) - rho * _acos(rho))


@lru_cache(maxsize=8)
def _hermite(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights (float64) with sum_i w_i f(x_i) ≈ E[f(g)], g ~ N(0, 1)."""
    import numpy as np

    x, w = np.polynomial.hermite_e.hermegauss(n)
    return torch.from_numpy(x), torch.from_numpy(w / w.sum())


def gaussian_moment(f, var: float = 1.0, n: int = 101) -> float:
    """E[f(x)], x ~ N(0, var), by Gauss–Hermite quadrature (exact for polynomials of degree < 2n; smooth f)."""
    x, w = _hermite(n)
    return float((w * f(x * math.sqrt(var))).sum())


def gaussian_kernel(f, rho: float, var: float = 1.0, n: int = 101) -> float:
    """E[f(u) f(v)] for (u, v) ~ N(0, var·[[1, ρ], [ρ, 1]]), by 2-D Gauss–Hermite quadrature.

    u = σ g₁, v = σ(ρ g₁ + √(1−ρ²) g₂). Smooth f (GeLU) converge exponentially in n; kinked f
    (ReLU) only algebraically, so they use their closed forms instead.
    """
    x, w = _hermite(n)
    s = math.sqrt(var)
    u = s * x[:, None]
    v = s * (rho * x[:, None] + math.sqrt(max(0.0, 1.0 - rho * rho)) * x[None, :])
    return float((w[:, None] * w[None, :] * f(u) * f(v)).sum())


def tabulated(kernel, n: int = 401):
    """A tensor ρ ↦ kernel(ρ) (entrywise, float64) from ``n`` samples on [−1, 1] and linear interpolation
    (error ≤ max|κ''|/(2(n−1)²) on smooth kernels), for maps applied to whole token Gram matrices."""
    xs = torch.linspace(-1.0, 1.0, n, dtype=torch.float64)
    ys = torch.tensor([float(kernel(float(x))) for x in xs], dtype=torch.float64)

    def apply(rho: torch.Tensor) -> torch.Tensor:
        pos = (rho.clamp(-1.0, 1.0) + 1.0) * ((n - 1) / 2)
        lo = pos.floor().clamp(0, n - 2).long()
        frac = pos - lo
        return ys[lo] * (1 - frac) + ys[lo + 1] * frac
    return apply


def shaped_relu_slopes(width: int, c_plus: float = 0.0, c_minus: float = -1.0) -> tuple[float, float, float]:
    """(s₊, s₋, c): slopes s± = 1 + c±/√n of the shaped ReLU at width n and c = 2/(s₊² + s₋²) = 1/E[φ_s(g)²].

    At finite width the kernel drift is exactly c·ν: n·(c E[φ_s(u)φ_s(v)] − ρ) = c·ν(ρ) for unit
    Gaussians (u, v) with correlation ρ, so c − 1 = O(n^{-1/2}) is the finite-width factor on the drift.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    s_plus = 1.0 + c_plus / math.sqrt(width)
    s_minus = 1.0 + c_minus / math.sqrt(width)
    return s_plus, s_minus, 2.0 / (s_plus**2 + s_minus**2)
