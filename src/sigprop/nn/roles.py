"""Parameter roles: every parameter is tagged when it is built, so an init pass cannot miss one.

A role names what a weight *is* (``"q"``, ``"ffn_in"``, ``"embed"``, ...), independent of the
attribute name that holds it. Schemes map roles to initial values; `sigprop.schemes.initialize`
walks ``model.parameters()`` and refuses an untagged parameter.
"""
from __future__ import annotations

import torch
from torch import nn

ROLES = (
    "embed",      # token embedding table (V, d)
    "pos",        # learned position table (T, d)
    "patch",      # ViT patch projection weight (d, C*p*p)
    "cls",        # ViT class token (1, 1, d)
    "q", "k", "v", "o",          # attention projections, weight (out, in)
    "ffn_in", "ffn_out",         # MLP projections
    "head",       # untied output head (ViT classifier, MLM transform)
    "bias",       # any bias vector: zero at init
    "norm",       # LayerNorm/RMSNorm gain: one at init
    "constant",   # shaping and residual scalars: set by the module that owns them
)


def tag(param: nn.Parameter | torch.Tensor, role: str) -> None:
    """Attach ``role`` to ``param`` (must be one of `ROLES`)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    param._sigprop_role = role  # type: ignore[attr-defined]


def tag_linear(linear: nn.Linear, role: str) -> nn.Linear:
    """Tag a Linear's weight with ``role`` and its bias (if any) as ``"bias"``; returns it."""
    tag(linear.weight, role)
    if linear.bias is not None:
        tag(linear.bias, "bias")
    return linear


def tag_norm(norm: nn.Module) -> nn.Module:
    """Tag a norm's affine parameters: gain ``"norm"``, shift ``"bias"``."""
    for name, p in norm.named_parameters(recurse=False):
        tag(p, "norm" if name == "weight" else "bias")
    return norm


def tag_site(module: nn.Module, stack: str, layer: int) -> None:
    """Record which stack (``"enc"``/``"dec"``) and layer index every parameter below ``module`` sits in."""
    for p in module.parameters():
        p._sigprop_site = (stack, layer)  # type: ignore[attr-defined]


def set_init_std(param: torch.Tensor, std: float) -> None:
    """Record the std ``param`` was drawn with (`sigprop.schemes.initialize`); the moment maps read it."""
    param._sigprop_init_std = float(std)  # type: ignore[attr-defined]


def init_std_of(param: torch.Tensor) -> float | None:
    """The std recorded by `set_init_std`, or None for a parameter no sigprop init pass has drawn."""
    return getattr(param, "_sigprop_init_std", None)


def role_of(param: torch.Tensor) -> str | None:
    return getattr(param, "_sigprop_role", None)


def site_of(param: torch.Tensor) -> tuple[str, int] | None:
    return getattr(param, "_sigprop_site", None)
