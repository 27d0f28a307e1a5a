"""DeepNorm (Wang et al. 2022, DeepNet): x ← LN(α x + G(x)), FFN/V/O init scaled by β.

N encoder layers, M decoder layers:
  encoder-only  α = (2N)^{1/4},            β = (8N)^{-1/4}
  decoder-only  α = (2M)^{1/4},            β = (8M)^{-1/4}
  enc-dec       encoder α = 0.81(N⁴M)^{1/16}, β = 0.87(N⁴M)^{-1/16};  decoder α = (3M)^{1/4}, β = (12M)^{-1/4}
β multiplies the Xavier-normal init of FFN, V and O; Q, K are Xavier normal with gain 1
(full d×d matrices: std √(1/d)); embeddings N(0, 1/d). Invariant: the model update per
step is bounded by O(1) independent of depth (DeepNet Thm. 4.1).
"""
from __future__ import annotations

from typing import Any

from .base import ParamInfo, Scheme, Site, stack_layers, xavier_std


def deepnorm_constants(arch: str, stack: str, n_enc: int, n_dec: int) -> tuple[float, float]:
    """(α, β) of the published table for ``stack`` ("enc" | "dec") of ``arch``."""
    if arch == "encdec":
        if stack == "enc":
            return 0.81 * (n_enc ** 4 * n_dec) ** (1 / 16), 0.87 * (n_enc ** 4 * n_dec) ** (-1 / 16)
        return (3 * n_dec) ** 0.25, (12 * n_dec) ** -0.25
    n = n_enc if stack == "enc" else n_dec
    return (2 * n) ** 0.25, (8 * n) ** -0.25


class DeepNorm(Scheme):
    name = "deepnorm"
    norm_placements = ("post",)
    learnable_residual = True

    def _constants(self, cfg: Any, stack: str) -> tuple[float, float]:
        return deepnorm_constants(cfg.arch, stack, stack_layers(cfg, "enc"), stack_layers(cfg, "dec"))

    def residual(self, cfg: Any, site: Site) -> tuple[float, float]:
        return self._constants(cfg, site.stack)[0], 1.0

    def std(self, cfg: Any, p: ParamInfo) -> float:
        if p.role in ("q", "k"):
            return xavier_std(p.fan_in, p.fan_out)
        if p.role in ("v", "o", "ffn_in", "ffn_out"):
            return self._constants(cfg, p.stack)[1] * xavier_std(p.fan_in, p.fan_out)
        return super().std(cfg, p)
