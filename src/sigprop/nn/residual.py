"""Scaled residual add y = α·x + β·f(x) (λ/γ in the Shaped Transformer, λ/β in DeepScaleLM)."""
from __future__ import annotations

import torch
from torch import nn

from .roles import tag


class Residual(nn.Module):
    """y = α x + β f, with α, β fixed buffers or trainable scalars."""

    def __init__(self, alpha: float, beta: float, learnable: bool = False) -> None:
        super().__init__()
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

    def extra_repr(self) -> str:
        return f"alpha={self.alpha.item():.4g}, beta={self.beta.item():.4g}"
