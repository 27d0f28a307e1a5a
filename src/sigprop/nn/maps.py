"""Each layer's moment map, read off the module: the wiring between `sigprop.nn` and `sigprop.theory.moments`.

A sigprop module carries a ``moment_map`` method (attention, MLP, sublayer, embeddings) that builds its
`sigprop.theory.moments` component from its own attributes — widths, heads, causal mask, logit scale,
dropout rate and mode, residual weights — and from the std each weight was drawn with, recorded on the
parameter by `sigprop.schemes.initialize` (`init_std_of`). Nothing is re-derived from a config, so a
prediction describes the module it was read from. The torch building blocks a sigprop model uses
(LayerNorm, RMSNorm, ReLU, GELU, Dropout) map through `component_of`. A module, weight or option without
an exact map raises `NotImplementedError` naming it; it never yields a silent number.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..theory.moments.dropout import Dropout
from ..theory.moments.norm import LayerNorm, RMSNorm
from ..theory.moments.pointwise import GeLU, ReLU
from ..theory.moments.state import Component
from .roles import init_std_of


def weight_var(param: torch.Tensor, what: str) -> float:
    """σ² of the Gaussian ``param`` was initialized from (recorded by `sigprop.schemes.initialize`)."""
    std = init_std_of(param)
    if std is None:
        raise NotImplementedError(f"{what} has no recorded init std: only weights drawn by "
                                  "sigprop.schemes.initialize (build_model) have a moment map")
    return std ** 2


def zero_bias(linear: nn.Linear, what: str) -> None:
    """Refuse a Linear whose bias is not the zero an init pass sets (the maps assume none)."""
    if linear.bias is not None and not linear.bias.is_meta and bool(linear.bias.detach().any()):
        raise NotImplementedError(f"{what} has a non-zero bias; the moment maps describe zero biases (init)")


def scalar(t: torch.Tensor | float, built: float, what: str) -> float:
    """The value of a scalar (or per-head, all equal) parameter or buffer: read from the tensor (the built value
    where the tensor holds it to float32 rounding), or ``built`` (the value the module was built with) when the
    model lives on the meta device."""
    if not isinstance(t, torch.Tensor):
        return float(t)
    if t.is_meta:
        return float(built)
    values = t.detach().flatten().double()
    if values.numel() and not torch.allclose(values, values[0].expand_as(values)):
        raise NotImplementedError(f"{what} differs between heads ({values.tolist()}); the moment maps take "
                                  "one value for all heads")
    if not values.numel():
        return float(built)
    value = float(values[0])
    # a float32 buffer holds the built value rounded: read it back as built, so a model and its meta twin agree
    return float(built) if math.isclose(value, built, rel_tol=1e-6) else value


def _unit_affine(norm: nn.Module, what: str) -> None:
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    for name, p, value in (("gain", weight, 1.0), ("shift", bias, 0.0)):
        if p is not None and not p.is_meta and not bool((p.detach() == value).all()):
            raise NotImplementedError(f"{what} has a trained {name}; the norm's moment map describes the init "
                                      f"value {value:g}")


def component_of(module: nn.Module, what: str) -> Component:
    """The moment map of a torch building block: LayerNorm/RMSNorm (unit gain, zero shift, as at init), ReLU,
    exact-erf GELU, Dropout (its rate in train mode, none in eval mode), or a module's own ``moment_map()``."""
    if isinstance(module, nn.LayerNorm):
        _unit_affine(module, what)
        return LayerNorm(module.normalized_shape[-1])
    if isinstance(module, nn.RMSNorm):
        _unit_affine(module, what)
        return RMSNorm(module.normalized_shape[-1])
    if isinstance(module, nn.ReLU):
        return ReLU()
    if isinstance(module, nn.GELU):
        if module.approximate != "none":
            raise NotImplementedError(f"{what}: GELU(approximate={module.approximate!r}) has no exact map "
                                      "(the exact-erf GELU has)")
        return GeLU()
    if isinstance(module, nn.Dropout):
        return Dropout(module.p if module.training else 0.0)
    if hasattr(module, "moment_map"):
        return module.moment_map()
    raise NotImplementedError(f"{what} ({type(module).__name__}) has no moment map")


def qk_norm_of(norm: nn.Module, what: str) -> tuple[float, int]:
    """(g², k) of a per-head query or key norm: its gain squared (one value for every coordinate, as at init) and
    the degrees of freedom of its output (LayerNorm d_k − 1: centring removes one; RMSNorm d_k), which the
    attention map reads under qk-norm (`sigprop.theory.moments.qk_norm`). A LayerNorm must have a zero shift."""
    bias = getattr(norm, "bias", None)
    if bias is not None and not bias.is_meta and bool(bias.detach().any()):
        raise NotImplementedError(f"{what} has a non-zero shift; the qk-norm map describes a zero shift (init)")
    gain = scalar(norm.weight, 1.0, f"{what} gain") if getattr(norm, "weight", None) is not None else 1.0
    d_k = norm.normalized_shape[-1]
    if isinstance(norm, nn.LayerNorm):
        return gain ** 2, d_k - 1
    if isinstance(norm, nn.RMSNorm):
        return gain ** 2, d_k
    raise NotImplementedError(f"{what} ({type(norm).__name__}) has no qk-norm map (LayerNorm and RMSNorm have)")


def attention_logit_factor(scale: float, tau_theory: float) -> float:
    """Factor on the query variance that gives the maps a module's logit scale.

    The attention maps read the logit scale only through σ_q²σ_k²/τ² (`sigprop.theory.moments.attention`),
    with τ = √d_k (softmax) or τ₀√(d·d_k) (shaped); a module computing QKᵀ·``scale`` is the map with
    σ_q² × (scale·τ)². Under the standard 1/√d_k this is 1; μP's 1/d_k and the shaped ``qk_scaling="weights"``
    temperature come out of the module's own ``scale``."""
    return (scale * tau_theory) ** 2
