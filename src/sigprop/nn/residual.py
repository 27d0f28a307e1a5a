"""Scaled residual add y = α·x + β·f(x) (λ/γ in the Shaped Transformer, λ/β in DeepScaleLM, ω/1 in Admin)."""
from __future__ import annotations

import torch
from torch import nn

from .maps import scalar
from .roles import tag


class Residual(nn.Module):
    """y = α x + β f, with α, β fixed buffers or trainable scalars.

    ``width``: α is instead a trainable per-channel vector of ``width`` entries (Admin's shortcut ω, role
    "constant"), every entry built equal to ``alpha``; β stays a scalar (trainable iff ``learnable``).

    Args:
        alpha: the shortcut weight α.
        beta: the branch weight β.
        learnable: α and β are trainable parameters (role "constant") instead of buffers.
        width: a per-channel α of this many entries (above).
    """

    def __init__(self, alpha: float, beta: float, learnable: bool = False, width: int | None = None) -> None:
        super().__init__()
        self.built = (float(alpha), float(beta))      # the weights it was built with (read on the meta device)
        a = torch.tensor(float(alpha)) if width is None else torch.full((width,), float(alpha))
        b = torch.tensor(float(beta))
        for name, value, trained in (("alpha", a, learnable or width is not None), ("beta", b, learnable)):
            if trained:
                setattr(self, name, nn.Parameter(value))
                tag(getattr(self, name), "constant")
            else:
                self.register_buffer(name, value)

    def forward(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return self.alpha.to(x.dtype) * x + self.beta.to(x.dtype) * fx

    @torch.no_grad()
    def reset_alpha(self, alpha: float) -> None:
        """Set α (every channel of a per-channel α) and the value it counts as built with (read on the meta device)."""
        self.built = (float(alpha), self.built[1])
        if not self.alpha.is_meta:
            self.alpha.fill_(float(alpha))

    def values(self) -> tuple[float, float]:
        """(α, β) as floats: the current values (a per-channel α must be uniform, as built), or the built ones
        on the meta device."""
        return (scalar(self.alpha, self.built[0], "residual alpha"), scalar(self.beta, self.built[1], "residual beta"))

    def extra_repr(self) -> str:
        if self.alpha.ndim:
            return f"alpha=per channel ({self.alpha.numel()}), built {self.built[0]:.4g}, beta={self.beta.item():.4g}"
        return f"alpha={self.alpha.item():.4g}, beta={self.beta.item():.4g}"
