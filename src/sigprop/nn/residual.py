"""Scaled residual add y = α·x + β·f(x) (λ/γ in the Shaped Transformer, λ/β in DeepScaleLM)."""
from __future__ import annotations

import torch
from torch import nn

from .maps import scalar
from .roles import tag


class Residual(nn.Module):
    """y = α x + β f, with α, β fixed buffers or trainable scalars."""

    def __init__(self, alpha: float, beta: float, learnable: bool = False) -> None:
        super().__init__()
        self.built = (float(alpha), float(beta))      # the weights it was built with (read on the meta device)
        a, b = torch.tensor(float(alpha)), torch.tensor(float(beta))
        if learnable:
            self.alpha, self.beta = nn.Parameter(a), nn.Parameter(b)
            tag(self.alpha, "constant")
            tag(self.beta, "constant")
        else:
            self.register_buffer("alpha", a)
            self.register_buffer("beta", b)

    def forward(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return self.alpha.to(x.dtype) * x + self.beta.to(x.dtype) * fx

    def values(self) -> tuple[float, float]:
        """(α, β) as floats: the current values, or the built ones on the meta device."""
        return (scalar(self.alpha, self.built[0], "residual alpha"), scalar(self.beta, self.built[1], "residual beta"))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha.item():.4g}, beta={self.beta.item():.4g}"
