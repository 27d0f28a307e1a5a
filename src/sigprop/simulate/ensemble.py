"""Ensembles of finite networks at initialization: token covariance V_l = X_l X_lᵀ/n after every layer.

Three samplers with the same law share the block maps of `blocks` (see `projectors`):

* ``method="weights"``  draws every n×n_out weight matrix explicitly: O(m n²) per projection.
* ``method="gaussian"`` draws X W/√n as R Z, R Rᵀ = XXᵀ/n, Z iid N(0, 1): O(m² n), exact in law;
  the logits need O(m²) numbers (Bartlett). Works for every block.
* ``method="gram"``     evolves V = XXᵀ/n alone (a Markov chain for LN-free blocks): O(m³) per
  residual update and O(m² n) only for the MLP pre-activation. Not for preln / postln.

X0 = √n R0 Oᵀ with Haar-random orthonormal O ∈ R^{n×m} per sample, so X0 X0ᵀ/n = V0 exactly.
Samples are processed in chunks (bounded memory); results are deterministic given all arguments.
"""
from __future__ import annotations

import math

import torch

from ..fields import check_value, invalid
from ..theory.sde import check_covariance, psd_root
from .blocks import BLOCK_MAPS, BLOCKS, LN_BLOCKS, SHAPED_BLOCKS, BlockParams
from .projectors import GaussianProjector, GramProjector, WeightProjector

Tensor = torch.Tensor
METHODS = ("gaussian", "gram", "weights")
_CHUNK_ELEMENTS = 1 << 22  # ≈ 32 MiB of float64 per drawn tensor


def _projector(method: str, generator: torch.Generator, width: int) -> WeightProjector:
    if method == "gram":
        return GramProjector(generator, width)
    return GaussianProjector(generator) if method == "gaussian" else WeightProjector(generator)


def block_params(block: str, width: int, *, gamma: float | None, tau0: float, c_plus: float,
                 c_minus: float, n_k: int | None) -> BlockParams:
    """Validate the arguments of `block` and bundle them; gamma is required for shaped blocks only."""
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
    if n_k is not None and check_value(n_k, int, "n_k") < 1:
        raise ValueError(invalid("n_k", n_k, ">= 1"))
    if block in SHAPED_BLOCKS:
        if gamma is None:
            raise ValueError(f"gamma is required for block {block!r} (in (0, 1])")
    elif gamma is not None:
        raise ValueError(f"gamma is only used by {SHAPED_BLOCKS}, not by {block!r}")
    return BlockParams(width=width, gamma=1.0 if gamma is None else gamma, tau0=tau0,
                       c_plus=c_plus, c_minus=c_minus, n_k=n_k or 0)


def initial_tokens(V0: Tensor, width: int, samples: int, generator: torch.Generator) -> Tensor:
    """X0 (samples, m, width) with X0 X0ᵀ/width = V0 exactly: √n R0 Oᵀ, O Haar with orthonormal columns."""
    m = V0.shape[-1]
    if width < m:
        raise ValueError(f"width must be >= the number of tokens m={m}, got {width}")
    Q, T = torch.linalg.qr(torch.randn(samples, width, m, generator=generator, dtype=torch.float64))
    O = Q * torch.sign(T.diagonal(dim1=-2, dim2=-1)).unsqueeze(-2)  # sign fix makes O Haar-distributed
    R0 = psd_root(V0.to(torch.float64))[0]
    return (math.sqrt(width) * R0 @ O.mT).to(V0.dtype)


def _prepare(block: str, V0: Tensor, width: int, depth: int, samples: int, method: str,
             dtype: torch.dtype, params: dict) -> tuple[Tensor, BlockParams]:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "gram" and block in LN_BLOCKS:
        raise ValueError(f"method 'gram' needs an LN-free block, not {block!r}; use 'gaussian'")
    if check_value(depth, int, "depth") < 0 or check_value(samples, int, "samples") < 1:
        raise ValueError(f"depth must be >= 0 and samples >= 1, got depth={depth}, samples={samples}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    p = block_params(block, width, **params)
    V0 = torch.as_tensor(V0, dtype=torch.float64)
    if V0.ndim != 2:
        raise ValueError(f"V0 must have shape (m, m), got {tuple(V0.shape)}")
    check_covariance(V0)
    return V0.to(dtype), p


def _chunk_size(method: str, samples: int, m: int, width: int, chunk: int | None) -> int:
    if chunk is not None:
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        return chunk
    per_sample = width * width if method == "weights" else m * width
    return max(1, min(samples, _CHUNK_ELEMENTS // per_sample))


def simulate(block: str, V0: Tensor, width: int, depth: int, samples: int, seed: int = 0,
             method: str = "gaussian", *, gamma: float | None = None, tau0: float = 1.0,
             c_plus: float = 0.0, c_minus: float = -1.0, n_k: int | None = None,
             dtype: torch.dtype = torch.float64, chunk: int | None = None) -> Tensor:
    """Token covariances (samples, depth+1, m, m) of `samples` random networks of `depth` `block`s.

    V0 (m, m) symmetric PSD; width n ≥ m; n_k defaults to width; gamma ∈ (0, 1] for the shaped
    blocks (see `blocks` for the list) and must be omitted for softmax / preln / postln.
    method: "gaussian", "gram" (fastest; LN-free blocks) or "weights" — same law (module docstring).
    A sample whose covariance overflows the dtype is NaN from that layer on (its later layers would
    be computed from a meaningless root), so `isfinite` tells exactly which networks overflowed; this
    never raises.
    """
    V0, p = _prepare(block, V0, width, depth, samples, method, dtype,
                     dict(gamma=gamma, tau0=tau0, c_plus=c_plus, c_minus=c_minus, n_k=n_k))
    step = BLOCK_MAPS[block]
    gen = torch.Generator().manual_seed(check_value(seed, int, "seed"))
    m = V0.shape[-1]
    out = torch.empty(samples, depth + 1, m, m, dtype=dtype)
    size = _chunk_size(method, samples, m, width, chunk)
    for lo in range(0, samples, size):
        proj = _projector(method, gen, width)
        X = proj.initial(initial_tokens(V0, width, min(size, samples - lo), gen))
        rows = slice(lo, lo + len(X))
        overflowed = torch.zeros(len(X), dtype=torch.bool)
        for layer in range(depth + 1):
            if layer:
                X = step(X, proj, p)
            V = proj.covariance(X)
            overflowed |= ~torch.isfinite(V).all(-1).all(-1)
            out[rows, layer] = V.masked_fill(overflowed[:, None, None], math.nan)
    return out


def gradient_norms(block: str, V0: Tensor, width: int, depth: int, samples: int, seed: int = 0, *,
                   gamma: float | None = None, tau0: float = 1.0, c_plus: float = 0.0,
                   c_minus: float = -1.0, n_k: int | None = None, dtype: torch.dtype = torch.float64,
                   chunk: int | None = None) -> Tensor:
    """‖∂ℓ/∂X_l‖_F² for each layer input X_l, l = 0..depth−1: tensor (samples, depth).

    Explicit weights, autograd; ℓ = ⟨X_depth, G⟩/√(m n) with one fixed G ~ N(0, 1) per sample,
    so for an identity network every entry is ≈ 1.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    V0, p = _prepare(block, V0, width, depth, samples, "weights", dtype,
                     dict(gamma=gamma, tau0=tau0, c_plus=c_plus, c_minus=c_minus, n_k=n_k))
    step = BLOCK_MAPS[block]
    gen = torch.Generator().manual_seed(check_value(seed, int, "seed"))
    m = V0.shape[-1]
    out = torch.empty(samples, depth, dtype=dtype)
    size = _chunk_size("weights", samples, m, width, chunk)
    for lo in range(0, samples, size):
        X = initial_tokens(V0, width, min(size, samples - lo), gen).requires_grad_(True)
        proj = WeightProjector(gen)
        inputs = []
        with torch.enable_grad():
            for _ in range(depth):
                X.retain_grad()
                inputs.append(X)
                X = step(X, proj, p)
            G = torch.randn(X.shape, generator=gen, dtype=dtype)
            ((X * G).sum() / math.sqrt(m * width)).backward()
        out[lo:lo + len(X)] = torch.stack([x.grad.pow(2).sum((-2, -1)) for x in inputs], dim=1)
    return out
