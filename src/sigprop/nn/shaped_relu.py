"""Shaped ReLU (Li, Nica, Roy 2022): φ_s(x) = √c · (s₊ max(x, 0) + s₋ min(x, 0)).

s± = 1 + c±/√n, so the activation tends to the identity as the width n grows and each layer
perturbs the kernel by O(1/n); c = 1/E[φ(g)²] = 2/(s₊² + s₋²) (g ~ N(0, 1)) keeps unit second
moment. Kernel drift: n·(E[φ_s(u)φ_s(v)] − ρ) → ν(ρ), `sigprop.theory.kernels.shaped_relu_nu`.
s₋ is a fixed buffer ("fixed"; "recover" schedules it to 0 with `set_slope`, recovering a
ReLU) or trainable ("learn").
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..theory.kernels import shaped_relu_slopes
from ..theory.moments.pointwise import ShapedReLU as ShapedReLUMap
from .maps import scalar
from .roles import tag
from .shaped_attention import SHAPING_MODES


class ShapedReLU(nn.Module):
    """Elementwise shaped ReLU with normalization; any input shape.

    Args:
        width: the width n the slopes s± = 1 + c±/√n are shaped for.
        c_plus: c₊ of the positive slope.
        c_minus: c₋ of the negative slope.
        mode: "fixed", "recover" (s₋ set by the trainer's schedule, `set_slope`) or "learn" (s₋ trainable).

    Raises:
        ValueError: an unknown ``mode``.
    """

    def __init__(self, width: int, c_plus: float = 0.0, c_minus: float = -1.0, mode: str = "fixed") -> None:
        super().__init__()
        if mode not in SHAPING_MODES:
            raise ValueError(f"mode must be one of {SHAPING_MODES}, got {mode!r}")
        self.width, self.mode, self.c_plus = width, mode, c_plus
        self.s_plus, s_minus, _ = shaped_relu_slopes(width, c_plus, c_minus)
        self.built_s_minus = s_minus
        s_minus = torch.tensor(s_minus)
        if mode == "learn":
            self.s_minus = nn.Parameter(s_minus)
            tag(self.s_minus, "constant")
        else:
            self.register_buffer("s_minus", s_minus)

    @torch.no_grad()
    def set_slope(self, s_minus: float) -> None:
        """Set the negative slope s₋ (the Recover schedule drives it to 0)."""
        self.s_minus.fill_(s_minus)

    def moment_map(self) -> ShapedReLUMap:
        """The shaped-ReLU map at this module's width, c₊ and current s₋ (s₋ = 1 + c₋/√n read back as c₋,
        so a Recover-scheduled slope maps exactly)."""
        s_minus = scalar(self.s_minus, self.built_s_minus, "shaped ReLU s_minus")
        return ShapedReLUMap(self.width, self.c_plus, (s_minus - 1.0) * math.sqrt(self.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s_minus = self.s_minus.to(x.dtype)
        scale = torch.rsqrt((self.s_plus ** 2 + s_minus ** 2) / 2)
        return scale * (s_minus * x + (self.s_plus - s_minus) * torch.relu(x))   # = s₊x⁺ + s₋x⁻
