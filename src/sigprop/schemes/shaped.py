"""Shaped Transformer (Noci et al. 2023): no LayerNorm, shaped attention, shaped ReLU, λ/γ residual.

x ← λ x + γ f(x) at every sublayer with λ² + γ² = 1 (γ = ``residual_gamma``, default 0.2), so
the stream's second moment is preserved: E|x'|² = λ²E|x|² + γ²E|f|² = E|x|² when E|f|² = E|x|².
Init keeps E|f|² = E|x|² (each weight N(0, 1/fan_in), the shaped ReLU has unit second moment,
shaped attention ≈ identity): Q, K, V, O, FFN_in ~ N(0, 1/d), FFN_out ~ N(0, 1/d_ff);
embeddings N(0, 1/T) for T summed tables so V^{αα} = |x_α|²/d ≈ 1. With ``qk_scaling="weights"``
Q, K ~ N(0, n^{-3/2}) and the attention temperature drops its √n (`ShapedAttention`).
"""
from __future__ import annotations

import math
from typing import Any

from ..fields import FieldError
from .base import ParamInfo, Scheme, Site

DEFAULT_GAMMA = 0.2


def unit_residual(cfg: Any, default_beta: float) -> tuple[float, float]:
    """(λ, β) with λ² + β² = 1: β from ``cfg.residual_gamma`` (else the default), λ from
    ``cfg.residual_lambda`` if given (validated by ModelConfig) else √(1 − β²)."""
    beta = default_beta if cfg.residual_gamma is None else cfg.residual_gamma
    lam = math.sqrt(1.0 - beta * beta) if cfg.residual_lambda is None else cfg.residual_lambda
    return lam, beta


class Shaped(Scheme):
    name = "shaped"
    norm_placements = ("none",)
    attention = "shaped"
    learnable_residual = True

    def check(self, cfg: Any) -> None:
        if cfg.activation not in ("relu", "shaped_relu"):
            raise FieldError(f"ModelConfig.activation must be one of ('relu', 'shaped_relu') for scheme "
                             f"'shaped' (it shapes the ReLU), got {cfg.activation!r}")

    def activation(self, cfg: Any) -> str:
        return "shaped_relu"

    def residual(self, cfg: Any, site: Site) -> tuple[float, float]:
        return unit_residual(cfg, DEFAULT_GAMMA)

    def std(self, cfg: Any, p: ParamInfo) -> float:
        if p.role in ("q", "k") and cfg.qk_scaling == "weights":
            return p.fan_in ** -0.75               # N(0, n^{-3/2}): the 1/√n of τ moved into the weights
        if p.role in ("q", "k", "v", "o", "ffn_in", "ffn_out", "patch", "head"):
            return 1.0 / math.sqrt(p.fan_in)
        if p.role in ("embed", "pos", "cls"):
            return math.sqrt(1.0 / 2)      # two summed tables (token|patch + position)
        raise KeyError(f"scheme 'shaped' has no init rule for role {p.role!r}")
