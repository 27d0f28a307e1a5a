"""The shortcut factor of each post-norm sublayer: the share of its output gradient that reaches its input along
the shortcut.

A post-norm sublayer y = N(α⊙x + βf(x)) divides by the scale of the sum, so its Jacobian along the shortcut is
N's Jacobian (≈ identity / rms of the sum, projected) times α: the gradient at x along the shortcut is the
gradient at y times s = rms(α⊙x) / rms(α⊙x + βf(x)). Through a stack of post-norm sublayers the gradient that
reaches block b from the top is scaled by the product of s over the sublayers above it; s < 1 when the branch
βf(x) grows against α⊙x (as training grows a Post-LN stack's branches against a fixed α), and over hundreds of
sublayers that product vanishes (docs/admin.md).
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import torch
from torch import nn

from ..nn.block import Sublayer


def post_sublayers(model: nn.Module) -> list[Sublayer]:
    """``model``'s post-norm sublayers in module order (the forward order of sigprop's stacks)."""
    return [m for m in model.modules() if isinstance(m, Sublayer) and m.placement == "post"]


@contextlib.contextmanager
def shortcut_factors(model: nn.Module) -> Iterator[list[float]]:
    """Within the block, the first forward of ``model`` fills the yielded list with each post-norm sublayer's
    shortcut factor s (module docstring), in forward order (later forwards, such as an activation-checkpointing
    recompute, add nothing); empty for a model without post-norm sublayers."""
    subs = post_sublayers(model)
    found: list[float] = []

    def hook(res: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        if len(found) < len(subs):
            with torch.no_grad():
                x = args[0]
                short = res.alpha.to(x.dtype) * x
                found.append(float(short.float().pow(2).mean().sqrt() / out.float().pow(2).mean().sqrt()))

    hooks = [s.residual.register_forward_hook(hook) for s in subs]
    try:
        yield found
    finally:
        for h in hooks:
            h.remove()


def shortcut_deficit(factors: Sequence[float]) -> float:
    """D = −Σ log10 s over ``factors`` (one forward's shortcut factors): the decades by which the shortcut path
    alone scales a gradient from the top of the post-norm stack to its bottom."""
    return -sum(math.log10(f) for f in factors)
