"""The networks the ensembles simulate, assembled from sigprop's own modules (`sigprop.nn`).

One layer of a block is a sequence of `Sublayer`s of width n with one head (key width n_k = n), no
biases, weights N(0, 1/fan_in) drawn by `sigprop.schemes.initialize` under the shaped scheme's rule (the
W/√n convention, entries of W N(0, 1)), and λ = √(1 − γ²). Attention has no output projection: the
value-only layer the covariance SDEs describe (`sigprop.theory.sde`). With Y = (X W_Q/√n)(X W_K/√n)ᵀ:

  resnet                Sublayer(MLP(n → n → n, ShapedReLU), λ, γ):  X' = λX + γ √c φ_s(X W_pre/√n) W_post/√n
  shaped_attention      Sublayer(ShapedAttention, λ, γ):   X' = λX + γ(I + Softmax(Y/τ) − 11ᵀ/m)X W_V/√n, τ = τ₀√(n n_k)
  shaped                shaped attention, then resnet (one shaped-Transformer layer)
  no_centering          ShapedAttention with γ₂ = 0:       A = I + Softmax(Y/τ)         (ablations)
  no_identity           ShapedAttention(identity=False):   A = Softmax(Y/τ) − 11ᵀ/m
  standard_temperature  ShapedAttention(qk_scaling="weights"), W_Q, W_K N(0, 1/n): τ = τ₀√n_k
  softmax               Sublayer(Attention, 1, 1):                    X' = X + Softmax(Y/√n_k) X W_V/√n
  preln                 Sublayer(Attention, LayerNorm, "pre", 1, 1):  X' = X + softmax-attention(LN(X))
  postln                Sublayer(Attention, LayerNorm, "post", 1, 1): X' = LN(X + softmax-attention(X))

LayerNorm has unit gain, zero shift and ε = 1e-5. ``attention`` is the deprecated name of ``shaped_attention``.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from ..fields import NONNEGATIVE, SQUARABLE, SQUARABLE_POSITIVE, Range, check_fields, current_value
from ..models.config import ModelConfig
from ..nn import MLP, Attention, ShapedAttention, ShapedReLU, Sublayer, make_norm
from ..schemes import get_scheme, initialize

SHAPED_BLOCKS = ("resnet", "shaped_attention", "shaped", "no_centering", "no_identity", "standard_temperature")
VANILLA_BLOCKS = ("softmax", "preln", "postln")
BLOCKS = SHAPED_BLOCKS + VANILLA_BLOCKS
DEPRECATED_BLOCKS = {"attention": "shaped_attention"}


def block_name(block: str) -> str:
    """``block`` itself, or the current name of a deprecated one (with a DeprecationWarning); ValueError if unknown."""
    return current_value("block", block, BLOCKS, DEPRECATED_BLOCKS, stacklevel=4)


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
        if self.n_k not in (0, self.width):
            raise NotImplementedError(f"n_k={self.n_k}: the simulated networks run sigprop's one-head attention "
                                      f"modules, whose key width is the width n={self.width}; no module has another")

    @property
    def lam(self) -> float:
        return math.sqrt(1.0 - self.gamma**2)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build under ``dtype``, so the modules' scalar buffers (λ, γ, γ₁, γ₂, s₋) hold their values at that precision."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _sublayers(block: str, p: BlockParams) -> list[Sublayer]:
    n, lam, gamma = p.width, p.lam, p.gamma

    def shaped(**options: object) -> Sublayer:
        return Sublayer(ShapedAttention(n, 1, tau0=p.tau0, output_proj=False, **options), None, "none", lam, gamma)

    def resnet() -> Sublayer:
        return Sublayer(MLP(n, n, ShapedReLU(n, p.c_plus, p.c_minus)), None, "none", lam, gamma)

    def softmax(placement: str) -> Sublayer:
        norm = None if placement == "none" else make_norm("layernorm", n)
        return Sublayer(Attention(n, 1, output_proj=False), norm, placement, 1.0, 1.0)

    return {
        "resnet": lambda: [resnet()],
        "shaped_attention": lambda: [shaped()],
        "shaped": lambda: [shaped(), resnet()],
        "no_centering": lambda: [shaped(gamma2=0.0)],
        "no_identity": lambda: [shaped(identity=False)],
        "standard_temperature": lambda: [shaped(qk_scaling="weights")],
        "softmax": lambda: [softmax("none")],
        "preln": lambda: [softmax("pre")],
        "postln": lambda: [softmax("post")],
    }[block]()


def layer(block: str, p: BlockParams, dtype: torch.dtype = torch.float64) -> nn.Sequential:
    """One layer of ``block`` (a current name, see `block_name`) at ``dtype``, initialized: x (B, m, n) -> (B, m, n).
    Its weights carry the std they were drawn with (`sigprop.nn.roles.init_std_of`), which the ensembles redraw."""
    cfg = ModelConfig(scheme="shaped", d_model=p.width, n_heads=1, d_ff=p.width, n_layers=1)
    with _default_dtype(dtype):
        module = nn.Sequential(*_sublayers(block, p))
    initialize(module, cfg, get_scheme(cfg.scheme))
    return module
