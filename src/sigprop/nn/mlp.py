"""Position-wise feed-forward block: fc2(φ(fc1(x))), d → d_ff → d."""
from __future__ import annotations

import torch
from torch import nn

from ..theory.moments.blocks import Serial, serial
from ..theory.moments.linear import Linear
from ..theory.moments.state import Moments
from .maps import component_of, weight_var, zero_bias
from .roles import tag_linear
from .shaped_relu import ShapedReLU

ACTIVATIONS = ("relu", "gelu", "shaped_relu")


def make_activation(kind: str, width: int, c_plus: float = 0.0, c_minus: float = -1.0,
                    mode: str = "fixed") -> nn.Module:
    """ReLU, exact-erf GeLU, or `ShapedReLU` (shaping width, c±, mode used only by the latter).

    Args:
        kind: "relu", "gelu" or "shaped_relu".
        width: the shaping width (`ShapedReLU`).
        c_plus: c₊ (`ShapedReLU`).
        c_minus: c₋ (`ShapedReLU`).
        mode: the shaping mode (`ShapedReLU`).

    Raises:
        ValueError: an unknown ``kind`` or ``mode``.
    """
    if kind == "relu":
        return nn.ReLU()
    if kind == "gelu":
        return nn.GELU()
    if kind == "shaped_relu":
        return ShapedReLU(width, c_plus, c_minus, mode)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {kind!r}")


class MLP(nn.Module):
    """x: (..., d) -> (..., d): fc2(act(fc1(x))), the two Linear layers tagged "ffn_in" and "ffn_out".

    Args:
        d_model: the stream width d.
        d_ff: the hidden width.
        activation: the activation module (`make_activation`).
        bias: biases in the two Linear layers.
    """

    def __init__(self, d_model: int, d_ff: int, activation: nn.Module, bias: bool = False) -> None:
        super().__init__()
        self.fc1 = tag_linear(nn.Linear(d_model, d_ff, bias=bias), "ffn_in")
        self.act = activation
        self.fc2 = tag_linear(nn.Linear(d_ff, d_model, bias=bias), "ffn_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def moment_map(self, L: int | float | None = None, memory: Moments | None = None, memory_len: int | None = None
                   ) -> Serial:
        """Linear(d → d_ff) · activation · Linear(d_ff → d), from the two weights' init stds. Token-wise: the
        branch arguments of `Attention.moment_map` (sequence length, memory) leave it unchanged."""
        for name in ("fc1", "fc2"):
            zero_bias(getattr(self, name), f"MLP {name}")
        fc1, fc2 = self.fc1, self.fc2
        return serial(Linear(fc1.in_features, fc1.out_features, weight_var(fc1.weight, "MLP fc1.weight")),
                      component_of(self.act, "MLP activation"),
                      Linear(fc2.in_features, fc2.out_features, weight_var(fc2.weight, "MLP fc2.weight")))
