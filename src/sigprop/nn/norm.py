"""Normalization layers by name: LayerNorm (mean and variance over features) and RMSNorm."""
from __future__ import annotations

from torch import nn

from .roles import tag_norm

NORM_TYPES = ("layernorm", "rmsnorm")


def make_norm(kind: str, d: int) -> nn.Module:
    """LayerNorm: (x − mean)/√(var + ε)·g + b;  RMSNorm: x/√(mean(x²) + ε)·g. Affine params tagged.

    Args:
        kind: "layernorm" or "rmsnorm".
        d: the normalized width.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind == "layernorm":
        return tag_norm(nn.LayerNorm(d))
    if kind == "rmsnorm":
        return tag_norm(nn.RMSNorm(d, eps=1e-6))
    raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {kind!r}")
