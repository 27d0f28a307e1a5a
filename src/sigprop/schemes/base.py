"""The scheme interface, and the one init pass every scheme shares.

A scheme decides, from a `ModelConfig`: where norms sit, which attention and activation the
blocks use, the residual weights (α, β) of every sublayer, the initial std of every parameter
role, and its optimizer rule (`OptimRule`: multipliers on the learning rate, Adam ε and weight
decay). Model code and the trainer ask; they never branch on scheme names. The width
parametrization (``ModelConfig.parametrization``, `sigprop.schemes.mup`) acts through the same
methods, on top of every scheme.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from ..fields import FieldError
from ..nn.roles import role_of, set_init_std, site_of
from ..theory.moments.state import Component, Moments
from . import mup

ChainOf = Callable[[str, Moments | None], list[Component]]    # (stack, memory) -> the stack's moment maps


@dataclass(frozen=True)
class Site:
    """One residual site: ``stack`` "enc"/"dec", 0-based ``layer``, ``sublayer`` "attn"/"cross"/"mlp"."""

    stack: str
    layer: int
    sublayer: str


@dataclass(frozen=True)
class ParamInfo:
    """What an init rule may know about a parameter. Linear weights are (fan_out, fan_in).

    Attributes:
        role: the parameter's role tag (`sigprop.nn.roles`).
        stack: "enc" / "dec" for a parameter inside a block, else None.
        layer: its 0-based block, else None.
        shape: its shape.
    """

    role: str
    stack: str | None
    layer: int | None
    shape: tuple[int, ...]

    @property
    def fan_in(self) -> int:
        return self.shape[-1]

    @property
    def fan_out(self) -> int:
        return self.shape[0]


@dataclass(frozen=True)
class OptimRule:
    """Per-parameter optimizer multipliers on ``optim.lr``, ``optim.eps`` and ``optim.weight_decay``."""

    lr: float = 1.0
    eps: float = 1.0
    weight_decay: float = 1.0

    def __mul__(self, other: "OptimRule") -> "OptimRule":
        return OptimRule(self.lr * other.lr, self.eps * other.eps, self.weight_decay * other.weight_decay)


def stack_layers(cfg: Any, stack: str) -> int:
    """Number of blocks in ``stack``: the decoder of an encdec has ``n_dec_layers``."""
    return cfg.n_dec_layers if (stack == "dec" and cfg.arch == "encdec") else cfg.n_layers


def sublayers_per_block(cfg: Any, stack: str) -> int:
    """Residual branches per block: 3 in an encdec decoder (self, cross, MLP), else 2."""
    return 3 if (stack == "dec" and cfg.arch == "encdec") else 2


def xavier_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    """Glorot normal: gain·√(2/(fan_in + fan_out))."""
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


class Scheme:
    """Base class: Xavier-style init, unit residual weights. Subclasses override what differs: each scheme's
    file states its invariant, paper and equations; `SCHEMES` registers one instance per scheme.

    Raises:
        FieldError: (`check`) a config field the scheme cannot honour.
        KeyError: (`std`) a parameter role the scheme has no init rule for.
    """

    name: ClassVar[str]
    norm_placements: ClassVar[tuple[str, ...]]  # allowed ModelConfig.norm_placement values, the first is the default
    attention: ClassVar[str] = "softmax"  # "softmax" | "shaped"
    learnable_residual: ClassVar[bool] = False  # its residual weights may be trained (ModelConfig.learn_residual);
    #                                             False where they are fixed by the rule (unit adds, (L₀/L)^α)
    channel_residual: ClassVar[bool] = False    # α is a trainable per-channel vector (Admin's ω), not a scalar

    def check(self, cfg: Any) -> None:
        """Raise ValueError for config fields this scheme cannot honour."""
        if cfg.residual_lambda is not None or cfg.residual_gamma is not None:
            raise FieldError(f"ModelConfig.residual_lambda/residual_gamma are used only by schemes "
                             f"'shaped' and 'dslm'; scheme {self.name!r} fixes its own residual weights")

    def calibrate(self, cfg: Any, model: nn.Module, inputs: tuple[torch.Tensor, ...] | None, chain_of: ChainOf
                  ) -> None:
        """Set the init values that depend on data: from forward passes on ``inputs`` (the model's positional
        inputs, e.g. the first training batch's), or without data (``inputs`` None) from the model's own moment
        maps, ``chain_of(stack, memory)`` (the maps of stack "enc"/"dec" in forward order, a decoder's cross-attention
        reading the encoder's output moments ``memory``); nothing for a scheme whose init is data-free."""

    def activation(self, cfg: Any) -> str:
        return cfg.activation

    def residual(self, cfg: Any, site: Site) -> tuple[float, float]:
        """(α, β) in x ← α x + β f(x)."""
        return 1.0, 1.0

    def std(self, cfg: Any, p: ParamInfo) -> float:
        """Standard (Xavier-like) init, as the DeepScaleLM baseline: Q, K, V √(2/(d + d_head)),
        O √(1/d), FFN √(2/(d + d_ff)), embeddings and heads √(1/d), patches Xavier."""
        d, dh = cfg.d_model, cfg.d_model // cfg.n_heads
        if p.role in ("q", "k", "v"):
            return xavier_std(d, dh)
        if p.role in ("ffn_in", "ffn_out", "patch"):
            return xavier_std(p.fan_in, p.fan_out)
        if p.role in ("o", "embed", "pos", "cls", "head"):
            return math.sqrt(1.0 / d)
        raise KeyError(f"scheme {self.name!r} has no init rule for role {p.role!r}")

    def init_std(self, cfg: Any, p: ParamInfo) -> float:
        """The std `initialize` draws with: ``std`` under the standard parametrization; under μP input
        roles take their std at the base width and an untied readout gets m^{-1/2} (`sigprop.schemes.mup`)."""
        if cfg.parametrization == "mup" and p.role in mup.INPUT:
            base = dataclasses.replace(cfg, d_model=cfg.base_width)
            return self.std(base, dataclasses.replace(p, shape=mup.base_width_shape(cfg, p.role, p.shape)))
        return self.std(cfg, p) * mup.std_mult(cfg, p.role)

    def optim(self, cfg: Any, p: ParamInfo) -> OptimRule:
        """Optimizer multipliers of a trainable parameter: the width parametrization's (1 under "standard")
        for weights; norms, biases and scalars get 1 (and no weight decay, see `sigprop.train.optim`)."""
        lr = mup.lr_mult(cfg, p.role)
        return OptimRule(lr=lr, eps=lr, weight_decay=1.0 / lr)

    def attention_scale(self, cfg: Any) -> float | None:
        """Softmax attention's QKᵀ multiplier; None keeps the module's 1/√d_head (μP: 1/d_head)."""
        return mup.attention_scale(cfg)

    def logit_scale(self, cfg: Any) -> float:
        """Multiplier on the hidden state before tied-embedding logits: 1/√(d σ_e²), so logits
        have unit variance when the final hidden state does; under μP times `mup.readout_mult`."""
        s = self.init_std(cfg, ParamInfo("embed", None, None, (cfg.vocab_size, cfg.d_model)))
        return mup.readout_mult(cfg) / (s * math.sqrt(cfg.d_model))


@torch.no_grad()
def initialize(model: nn.Module, cfg: Any, scheme: Scheme) -> dict[str, int]:
    """Initialize every parameter of ``model`` from its role; returns counts per role.

    Weights ~ N(0, std²) with std from ``scheme.init_std``, recorded on the parameter (`set_init_std`) for
    the modules' moment maps; ``bias`` → 0; ``norm`` gains → 1; ``constant`` (shaping/residual scalars) keep
    the value their module was built with. Every parameter must carry a role: an untagged one is an error,
    never silently skipped. On the meta device only the stds are recorded.

    Args:
        model: the freshly constructed model, its parameters tagged by role (`sigprop.nn.roles`).
        cfg: its `ModelConfig`.
        scheme: the scheme whose ``init_std`` draws each weight.

    Returns:
        The number of parameters per role.

    Raises:
        RuntimeError: a parameter without a role tag, named.
        KeyError: a role the scheme has no init rule for.
    """
    counts: dict[str, int] = {}
    for name, p in model.named_parameters():          # shared (tied) parameters are listed once
        role = role_of(p)
        if role is None:
            raise RuntimeError(f"parameter {name!r} has no role tag; tag it where it is built")
        if role in ("bias", "norm"):
            if not p.is_meta:
                p.fill_(0.0 if role == "bias" else 1.0)
        elif role != "constant":
            stack, layer = site_of(p) or (None, None)
            std = scheme.init_std(cfg, ParamInfo(role, stack, layer, tuple(p.shape)))
            if not p.is_meta:                             # meta tensors hold no values: only the std is kept
                p.normal_(0.0, std)
            set_init_std(p, std)
        counts[role] = counts.get(role, 0) + 1
    return counts
