"""One-layer maps X -> X' (batched over samples, X (S, m, n)) of the networks the ensembles simulate.

Every random weight enters only through logits, projections X W/√n and residual updates with fresh
W (entries N(0, 1)); the maps draw those through a `Projector` (see `projectors`), so the explicit
weight sampler and the Gaussian-equivalent samplers share this one implementation.

Blocks (λ = √(1 − γ²), Y = (X W_Q/√n)(X W_K/√n)ᵀ with W_Q, W_K ∈ R^{n×n_k}):
  resnet                X' = λX + γ √c φ_s(X W_pre/√n) W_post/√n        (shaped ReLU, hidden width n)
  attention             X' = λX + γ (I + Softmax(Y/τ) − 11ᵀ/m) X W_V/√n,   τ = τ₀√(n n_k)
  shaped                attention block, then resnet block (one shaped-Transformer layer)
  softmax               X' = X + Softmax(Y/√n_k) X W_V/√n    (vanilla, no LayerNorm, Fig. 1 baseline)
  preln                 X' = X + softmax-attention(LN(X))
  postln                X' = LN(X + softmax-attention(X))
  no_centering          attention with A = I + Softmax(Y/τ)                 (Fig. 4 ablations)
  no_identity           attention with A = Softmax(Y/τ) − 11ᵀ/m
  standard_temperature  attention with τ = τ₀√n_k
The vanilla baselines use the standard temperature √n_k and Q/K weights of variance 1/n (our W/√n
convention), so their logits are O(1) at unit token norm. LN has no affine part and eps = 1e-5.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from ..fields import NONNEGATIVE, SQUARABLE, SQUARABLE_POSITIVE, Range, check_fields
from ..theory.kernels import shaped_relu_slopes

Tensor = torch.Tensor

SHAPED_BLOCKS = ("resnet", "attention", "shaped", "no_centering", "no_identity", "standard_temperature")
VANILLA_BLOCKS = ("softmax", "preln", "postln")
LN_BLOCKS = ("preln", "postln")  # need the tokens X themselves, not only XXᵀ/n
BLOCKS = SHAPED_BLOCKS + VANILLA_BLOCKS


class Projector(Protocol):
    """Draws the random projections of a state X (see `projectors`) by fresh Gaussian weights."""

    def project(self, X: Tensor, out: int) -> Tensor:
        """X W/√n, W ∈ R^{n×out} with N(0, 1) entries; (S, m, out)."""

    def logits(self, X: Tensor, n_k: int) -> Tensor:
        """(X W_Q/√n)(X W_K/√n)ᵀ for independent W_Q, W_K ∈ R^{n×n_k}; (S, m, m)."""

    def residual(self, X: Tensor, source: Tensor, B: Tensor | None, lam: float, gamma: float) -> Tensor:
        """λX + γ B (source W/√n) for a fresh W ∈ R^{n×n}; B (S, m, m), None for the identity."""


@dataclass(frozen=True)
class BlockParams:
    """Hyper-parameters of a block: width n, residual weight γ (λ = √(1−γ²)), τ₀, c±, key width n_k (0: n)."""

    width: int
    gamma: float
    tau0: float = 1.0
    c_plus: float = 0.0
    c_minus: float = -1.0
    n_k: int = 0

    def __post_init__(self) -> None:
        check_fields(self, "", {"width": Range(1), "gamma": Range(0.0, 1.0, lo_open=True), "tau0": SQUARABLE_POSITIVE,
                                "c_plus": SQUARABLE, "c_minus": SQUARABLE, "n_k": NONNEGATIVE})

    @property
    def keys(self) -> int:
        return self.n_k or self.width

    @property
    def lam(self) -> float:
        return math.sqrt(1.0 - self.gamma**2)


def attention_matrix(Y: Tensor, tau: float, identity: bool = True, centering: bool = True) -> Tensor:
    """Softmax(Y/τ) (row-wise), plus I if `identity`, minus 11ᵀ/m if `centering`; (S, m, m)."""
    A = torch.softmax(Y / tau, dim=-1)
    m = Y.shape[-1]
    if centering:
        A = A - 1.0 / m
    if identity:
        A = A + torch.eye(m, dtype=Y.dtype)
    return A


def shaped_relu(Z: Tensor, width: int, c_plus: float = 0.0, c_minus: float = -1.0) -> Tensor:
    """√c φ_s(Z) = √c (s₊ max(Z, 0) + s₋ min(Z, 0)), s± = 1 + c±/√width, c = 2/(s₊² + s₋²)."""
    s_plus, s_minus, c = shaped_relu_slopes(width, c_plus, c_minus)
    return math.sqrt(c) * torch.where(Z >= 0, s_plus * Z, s_minus * Z)


def layer_norm(X: Tensor) -> Tensor:
    """Per-token LayerNorm over the width, no affine parameters."""
    return F.layer_norm(X, X.shape[-1:])


def _residual_attention(X: Tensor, proj: Projector, p: BlockParams, tau: float,
                        identity: bool = True, centering: bool = True) -> Tensor:
    A = attention_matrix(proj.logits(X, p.keys), tau, identity, centering)
    return proj.residual(X, X, A, p.lam, p.gamma)


def _shaped_tau(p: BlockParams) -> float:
    return p.tau0 * math.sqrt(p.width * p.keys)


def _attention(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return _residual_attention(X, proj, p, _shaped_tau(p))


def _resnet(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    H = shaped_relu(proj.project(X, p.width), p.width, p.c_plus, p.c_minus)
    return proj.residual(X, H, None, p.lam, p.gamma)


def _shaped(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return _resnet(_attention(X, proj, p), proj, p)


def _no_centering(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return _residual_attention(X, proj, p, _shaped_tau(p), centering=False)


def _no_identity(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return _residual_attention(X, proj, p, _shaped_tau(p), identity=False)


def _standard_temperature(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return _residual_attention(X, proj, p, p.tau0 * math.sqrt(p.keys))


def _vanilla_attention(X: Tensor, source: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    """X + Softmax(Y/√n_k) (source W_V/√n), logits Y of `source`."""
    A = attention_matrix(proj.logits(source, p.keys), math.sqrt(p.keys), identity=False, centering=False)
    return proj.residual(X, source, A, 1.0, 1.0)


def _softmax(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return _vanilla_attention(X, X, proj, p)


def _preln(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return _vanilla_attention(X, layer_norm(X), proj, p)


def _postln(X: Tensor, proj: Projector, p: BlockParams) -> Tensor:
    return layer_norm(_vanilla_attention(X, X, proj, p))


BLOCK_MAPS: dict[str, Callable[[Tensor, Projector, BlockParams], Tensor]] = {
    "resnet": _resnet, "attention": _attention, "shaped": _shaped,
    "no_centering": _no_centering, "no_identity": _no_identity,
    "standard_temperature": _standard_temperature,
    "softmax": _softmax, "preln": _preln, "postln": _postln,
}
