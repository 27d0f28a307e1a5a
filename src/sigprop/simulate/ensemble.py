"""Ensembles of finite networks at initialization: token covariance V_l = X_l X_lᵀ/n after every layer.

The networks are sigprop's own modules (`networks`): one layer, built and initialized once, is run for S
independent networks at a time by `torch.func.functional_call` under `torch.vmap`, each network with its own
weights, drawn from the std the init pass recorded on each weight (`propagate`). Two samplers, one law:

* ``method="weights"``  full weight matrices: n_out·n_in normals per projection and network.
* ``method="gaussian"`` each weight only on the row space of the input it multiplies: a forward pre-hook on
  every random projection (an attention module, for its fused Q, K, V; every other Linear) rewrites the input
  x (m × n_in) in an orthonormal basis O of its rows (QR of xᵀ, exact for rank-deficient x too), x = (x O) Oᵀ,
  and the weight drawn is W O, n_out × m, i.i.d. N(0, σ²) like W because O is orthonormal and independent of
  W. So x Wᵀ = (x O)(W O)ᵀ exactly: n_out·m normals per projection. Forward only (a gradient also needs W off
  that row space), so `gradient_norms` draws full weights.

X0 = √n R0 Oᵀ with Haar-random orthonormal O ∈ R^{n×m} per sample, so X0 X0ᵀ/n = V0 exactly.
Samples are processed in chunks (bounded memory); results are deterministic given all arguments.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Iterable

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..fields import check_value, invalid
from ..nn import Attention
from ..nn.roles import init_std_of
from ..theory.sde import check_covariance, psd_root
from .networks import SHAPED_BLOCKS, BlockParams, block_name, layer

Tensor = torch.Tensor
Weights = dict[str, Tensor]
METHODS = ("gaussian", "weights")
DEPRECATED_METHODS = {"gram": "gaussian"}
_CHUNK_ELEMENTS = 1 << 22  # ≈ 32 MiB of float64 per drawn tensor


def block_params(block: str, width: int, *, gamma: float | None, tau0: float, c_plus: float,
                 c_minus: float, n_k: int | None) -> BlockParams:
    """Validate the arguments of `block` (a current name) and bundle them; gamma is required for shaped blocks only."""
    if n_k is not None and check_value(n_k, int, "n_k") < 1:
        raise ValueError(invalid("n_k", n_k, ">= 1"))
    if block in SHAPED_BLOCKS:
        if gamma is None:
            raise ValueError(f"gamma is required for block {block!r} (in (0, 1])")
    elif gamma is not None:
        raise ValueError(f"gamma is only used by {SHAPED_BLOCKS}, not by {block!r}")
    return BlockParams(width=width, gamma=1.0 if gamma is None else gamma, tau0=tau0,
                       c_plus=c_plus, c_minus=c_minus, n_k=n_k or 0)


def method_name(method: str) -> str:
    """``method`` itself, or the sampler a deprecated name now runs (with a DeprecationWarning)."""
    if method in DEPRECATED_METHODS:
        new = DEPRECATED_METHODS[method]
        warnings.warn(f"method {method!r} is deprecated; the networks are sigprop's modules, sampled by {new!r} "
                      "(same law)", DeprecationWarning, stacklevel=3)
        return new
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def initial_tokens(V0: Tensor, width: int, samples: int, generator: torch.Generator) -> Tensor:
    """X0 (samples, m, width) with X0 X0ᵀ/width = V0 exactly: √n R0 Oᵀ, O Haar with orthonormal columns."""
    m = V0.shape[-1]
    if width < m:
        raise ValueError(f"width must be >= the number of tokens m={m}, got {width}")
    Q, T = torch.linalg.qr(torch.randn(samples, width, m, generator=generator, dtype=torch.float64))
    O = Q * torch.sign(T.diagonal(dim1=-2, dim2=-1)).unsqueeze(-2)  # sign fix makes O Haar-distributed
    R0 = psd_root(V0.to(torch.float64))[0]
    return (math.sqrt(width) * R0 @ O.mT).to(V0.dtype)


def _in_row_basis(module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: the input x (..., n_in) as x O, O (n_in, r) an orthonormal basis of its rows."""
    x = args[0]
    O = torch.linalg.qr(x.reshape(-1, x.shape[-1]).mT).Q
    return (x @ O, *args[1:])


def restrict_to_rows(module: nn.Module) -> nn.Module:
    """Register `_in_row_basis` on every random projection of ``module``: on each `Attention` (its Q, K, V run
    fused, not as modules) and on every other `nn.Linear`. Its weights must then be drawn as W O, of shape
    (fan_out, m) (`weight_shapes` with ``rows``)."""
    fused = set()
    for sub in module.modules():
        if isinstance(sub, Attention):
            sub.register_forward_pre_hook(_in_row_basis)
            fused |= {id(sub.q_proj), id(sub.k_proj), id(sub.v_proj)}
    for sub in module.modules():
        if isinstance(sub, nn.Linear) and id(sub) not in fused:
            sub.register_forward_pre_hook(_in_row_basis)
    return module


def weight_shapes(module: nn.Module, rows: int | None = None) -> dict[str, tuple[float, tuple[int, ...]]]:
    """The random parameters of ``module``, those with a recorded init std σ: name -> (σ, shape), the shape
    (fan_out, ``rows``) for `restrict_to_rows`. The others (norm gains, shaping constants) are not redrawn."""
    out = {}
    for name, p in module.named_parameters():
        std = init_std_of(p)
        if std is not None:
            out[name] = (std, tuple(p.shape) if rows is None else (p.shape[0], rows))
    return out


def draw(shapes: dict[str, tuple[float, tuple[int, ...]]], samples: int, generator: torch.Generator,
         dtype: torch.dtype) -> Weights:
    """Independent weights of ``samples`` networks: σ·N(0, 1) of shape (samples, *shape) per entry of ``shapes``
    (`weight_shapes`), all from one call of the generator."""
    sizes = [samples * math.prod(shape) for _, shape in shapes.values()]
    flat = torch.randn(sum(sizes), generator=generator, dtype=dtype)
    return {name: part.view(samples, *shape).mul_(std)
            for (name, (std, shape)), part in zip(shapes.items(), flat.split(sizes))}


def batched(module: nn.Module) -> Callable[[Weights, Tensor], Tensor]:
    """(weights (S, ...), X (S, m, n)) -> (S, m, n): network s runs ``module`` on its one sequence X[s], with
    weights[s]."""
    def one(weights: Weights, x: Tensor) -> Tensor:
        return functional_call(module, weights, (x.unsqueeze(0),)).squeeze(0)
    step = torch.vmap(one)

    def run(weights: Weights, X: Tensor) -> Tensor:
        with sdpa_kernel(SDPBackend.MATH):      # the math kernel's ops have vmap batching rules
            return step(weights, X)
    return run


def covariance(X: Tensor) -> Tensor:
    """Token covariance X Xᵀ/n, (S, m, m)."""
    return X @ X.mT / X.shape[-1]


def propagate(module: nn.Module, weights: Iterable[Weights], X0: Tensor) -> Tensor:
    """V_l (S, depth+1, m, m) of S networks from X0 (S, m, n), layer l being ``module`` with weights[l−1] (one
    stacked dict per layer, as `draw` or `torch.func.stack_module_state` gives). A network whose covariance
    overflows is NaN from that layer on (its later layers would be computed from a meaningless state)."""
    step, X = batched(module), X0
    V = covariance(X)
    overflowed = ~torch.isfinite(V).all(-1).all(-1)
    out = [V.masked_fill(overflowed[:, None, None], math.nan)]
    with torch.no_grad():
        for w in weights:
            X = step(w, X)
            V = covariance(X)
            overflowed |= ~torch.isfinite(V).all(-1).all(-1)
            out.append(V.masked_fill(overflowed[:, None, None], math.nan))
    return torch.stack(out, 1)


def _prepare(V0: Tensor, depth: int, samples: int, dtype: torch.dtype) -> Tensor:
    if check_value(depth, int, "depth") < 0 or check_value(samples, int, "samples") < 1:
        raise ValueError(f"depth must be >= 0 and samples >= 1, got depth={depth}, samples={samples}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    V0 = torch.as_tensor(V0, dtype=torch.float64)
    if V0.ndim != 2:
        raise ValueError(f"V0 must have shape (m, m), got {tuple(V0.shape)}")
    check_covariance(V0)
    return V0.to(dtype)


def _chunk_size(per_sample: int, samples: int, chunk: int | None) -> int:
    if chunk is not None:
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        return chunk
    return max(1, min(samples, _CHUNK_ELEMENTS // per_sample))


def simulate(block: str, V0: Tensor, width: int, depth: int, samples: int, seed: int = 0,
             method: str = "gaussian", *, gamma: float | None = None, tau0: float = 1.0,
             c_plus: float = 0.0, c_minus: float = -1.0, n_k: int | None = None,
             dtype: torch.dtype = torch.float64, chunk: int | None = None) -> Tensor:
    """Token covariances (samples, depth+1, m, m) of `samples` random networks of `depth` `block`s.

    V0 (m, m) symmetric PSD; width n ≥ m; gamma ∈ (0, 1] for the shaped blocks (see `networks`) and must be
    omitted for softmax / preln / postln; n_k only n (NotImplementedError otherwise: no module has another key
    width). method: "gaussian" or "weights", same law (module docstring). A sample whose covariance overflows
    the dtype is NaN from that layer on, so `isfinite` tells exactly which networks overflowed; this never raises.
    """
    block, method = block_name(block), method_name(method)
    p = block_params(block, width, gamma=gamma, tau0=tau0, c_plus=c_plus, c_minus=c_minus, n_k=n_k)
    V0 = _prepare(V0, depth, samples, dtype)
    m = V0.shape[-1]
    module = layer(block, p, dtype)
    rows = m if method == "gaussian" else None
    if rows is not None:
        restrict_to_rows(module)
    shapes = weight_shapes(module, rows)
    gen = torch.Generator().manual_seed(check_value(seed, int, "seed"))
    size = _chunk_size(width * (rows or width), samples, chunk)
    runs = []
    for lo in range(0, samples, size):
        X0 = initial_tokens(V0, width, min(size, samples - lo), gen)
        runs.append(propagate(module, (draw(shapes, len(X0), gen, dtype) for _ in range(depth)), X0))
    return torch.cat(runs)


def gradient_norms(block: str, V0: Tensor, width: int, depth: int, samples: int, seed: int = 0, *,
                   gamma: float | None = None, tau0: float = 1.0, c_plus: float = 0.0,
                   c_minus: float = -1.0, n_k: int | None = None, dtype: torch.dtype = torch.float64,
                   chunk: int | None = None) -> Tensor:
    """‖∂ℓ/∂X_l‖_F² for each layer input X_l, l = 0..depth−1: tensor (samples, depth).

    Full weights, autograd; ℓ = ⟨X_depth, G⟩/√(m n) with one fixed G ~ N(0, 1) per sample,
    so for an identity network every entry is ≈ 1.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    block = block_name(block)
    p = block_params(block, width, gamma=gamma, tau0=tau0, c_plus=c_plus, c_minus=c_minus, n_k=n_k)
    V0 = _prepare(V0, depth, samples, dtype)
    module = layer(block, p, dtype)
    step, shapes = batched(module), weight_shapes(module)
    gen = torch.Generator().manual_seed(check_value(seed, int, "seed"))
    m = V0.shape[-1]
    out = torch.empty(samples, depth, dtype=dtype)
    size = _chunk_size(width * width, samples, chunk)
    for lo in range(0, samples, size):
        X = initial_tokens(V0, width, min(size, samples - lo), gen).requires_grad_(True)
        inputs = []
        with torch.enable_grad():
            for _ in range(depth):
                X.retain_grad()
                inputs.append(X)
                X = step(draw(shapes, len(X), gen, dtype), X)
            G = torch.randn(X.shape, generator=gen, dtype=dtype)
            ((X * G).sum() / math.sqrt(m * width)).backward()
        out[lo:lo + len(X)] = torch.stack([x.grad.pow(2).sum((-2, -1)) for x in inputs], dim=1)
    return out
