"""Residual sublayers and transformer blocks; the norm placement and α, β come from the scheme.

Sublayer (one residual site), with D = dropout:
  pre:      x ← α x + β D(f(N(x)))
  post:     x ← N(α x + β D(f(x)))
  none:     x ← α x + β D(f(x))
  out:      x ← α x + β D(N(f(x)))          a norm on the branch output (OLMo 2, arXiv 2501.00656)
  sandwich: x ← α x + β D(N₂(f(N₁(x))))     norms on the branch input and output (Gemma 2, arXiv 2408.00118;
                                            Peri-LN, Kim et al. 2025, arXiv 2502.02732)
Block: self-attention sublayer, optional cross-attention sublayer, MLP sublayer.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..theory.moments.blocks import parts, serial
from ..theory.moments.norm import LayerNorm as LayerNormMap
from ..theory.moments.postnorm import PostNormResidual
from ..theory.moments.residual import Residual as ResidualMap
from ..theory.moments.state import Component, Moments
from .maps import component_of
from .residual import Residual

PLACEMENTS = ("pre", "post", "none", "out", "sandwich")
INPUT_NORMED = ("pre", "sandwich")        # a norm N (N₁) on the branch input
OUTPUT_NORMED = ("out", "sandwich")       # a norm N (N₂) on the branch output, before dropout and the add


class Sublayer(nn.Module):
    """Wraps ``fn`` with its norms, residual scaling and dropout. ``norm``: the norm on the branch input ("pre",
    "sandwich") or after the add ("post"); ``out_norm``: the norm on the branch output ("out", "sandwich");
    ``residual_width``: a per-channel trainable α (`Residual`'s ``width``).

    Args:
        fn: the branch (attention or MLP).
        norm: the branch-input norm ("pre", "sandwich") or the norm after the add ("post"); None otherwise.
        placement: "pre", "post", "none", "out" or "sandwich".
        alpha: the shortcut weight α.
        beta: the branch weight β.
        dropout: the dropout rate on the branch output.
        learn_residual: α and β trainable.
        residual_width: a per-channel trainable α of this many entries.
        out_norm: the branch-output norm ("out", "sandwich"); None otherwise.

    Raises:
        ValueError: an unknown ``placement``, or a ``norm`` or ``out_norm`` given where the placement has
            none (or missing where it has one).
    """

    def __init__(self, fn: nn.Module, norm: nn.Module | None, placement: str, alpha: float,
                 beta: float, dropout: float = 0.0, learn_residual: bool = False,
                 residual_width: int | None = None, out_norm: nn.Module | None = None) -> None:
        super().__init__()
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        for name, module, needed in (("norm", norm, placement in INPUT_NORMED or placement == "post"),
                                     ("out_norm", out_norm, placement in OUTPUT_NORMED)):
            if (module is not None) != needed:
                raise ValueError(f"placement {placement!r} needs {'a' if needed else 'no'} {name}")
        self.fn, self.norm, self.out_norm, self.placement = fn, norm, out_norm, placement
        self.residual = Residual(alpha, beta, learn_residual, residual_width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        h = self.norm(x) if self.placement in INPUT_NORMED else x
        f = self.fn(h, *args, **kwargs)
        if self.out_norm is not None:
            f = self.out_norm(f)
        y = self.residual(x, self.drop(f))
        return self.norm(y) if self.placement == "post" else y


    def site_maps(self, L: int | float, memory: Moments | None = None, memory_len: int | None = None) -> SiteMaps:
        """This residual site's maps over ``L`` tokens (``memory``: see `Attention.moment_map`; every branch module's
        ``moment_map`` takes the same arguments): the residual's current α, β, f's map read off its own weights
        (`sigprop.nn.maps`), its norms and dropout."""
        alpha, beta = self.residual.values()
        return SiteMaps(alpha, beta, tuple(parts(self.fn.moment_map(L, memory, memory_len))),
                        None if self.norm is None else component_of(self.norm, "sublayer norm"),
                        None if self.out_norm is None else component_of(self.out_norm, "branch output norm"),
                        component_of(self.drop, "sublayer dropout"))

    def moment_map(self, L: int | float, memory: Moments | None = None, memory_len: int | None = None,
                   first: bool = False, last: bool = False) -> Component:
        """This residual site's moment map (`sublayer_map` of `site_maps`); ``first``: the stack's first site (its
        input is no norm's output), ``last``: its last (its gradient comes through the head)."""
        return sublayer_map(self.site_maps(L, memory, memory_len), self.placement, normalized_input=not first,
                            last=last)


@dataclass(frozen=True)
class SiteMaps:
    """The moment maps of one residual site, for every model family: its weights α, β, its branch f (maps in
    order), the site's norm (before the branch, or after the add under "post"), the norm on the branch output and
    the branch dropout; None: absent (or a norm removed)."""

    alpha: float
    beta: float
    branch: tuple[Component, ...]
    norm: Component | None = None
    out_norm: Component | None = None
    dropout: Component | None = None


def sublayer_map(site: SiteMaps, placement: str, normalized_input: bool = True, last: bool = False) -> Component:
    """The moment map of one residual site, f = the branch, then its output norm N₂ and dropout D:
      pre, sandwich: Residual(α, β, N · f · N₂ · D);   none, out: Residual(α, β, f · N₂ · D);
      post: PostNormResidual(α, β, f · D) with the norm's O(1/d) effects (`sigprop.theory.moments.postnorm`): its input
            is a previous norm's output if ``normalized_input``, and the ``last`` site's gradient comes through a
            random linear map (the head), whose alignment with the normalized output it carries (2 for LayerNorm,
            1 for RMSNorm).
    A norm on the branch output is its map on f's output moments (variance 1, correlation its mean cosine;
    backward ÷ f's variance), exact as for a norm on the stream."""
    f = [*site.branch, *(c for c in (site.out_norm, site.dropout) if c is not None)]
    norm = site.norm
    if norm is None or placement != "post":
        return ResidualMap(site.alpha, site.beta, serial(*([] if norm is None else [norm]), *f))
    centered = isinstance(norm, LayerNormMap)
    return PostNormResidual(site.alpha, site.beta, serial(*f), norm.d, centered, normalized_input=normalized_input,
                            upstream_align=(2.0 if centered else 1.0) if last else 0.0)


def sites_chain(sites: Sequence[SiteMaps], placement: str, normalized_input: bool) -> list[Component]:
    """The maps of a stack's residual sites in forward order (`sublayer_map` of each): the first reads the stack's
    input, a norm's output iff ``normalized_input``; the others a previous site's; the last's gradient comes through
    the head."""
    return [sublayer_map(site, placement, normalized_input=n > 0 or normalized_input, last=n == len(sites) - 1)
            for n, site in enumerate(sites)]


class Block(nn.Module):
    """x: (B, T, d) -> (B, T, d); ``memory`` (B, S, d) feeds the cross-attention sublayer if any.

    Args:
        attn: the self-attention sublayer.
        mlp: the MLP sublayer.
        cross: the cross-attention sublayer (encoder–decoder decoder blocks), between the two.
    """

    def __init__(self, attn: Sublayer, mlp: Sublayer, cross: Sublayer | None = None) -> None:
        super().__init__()
        self.attn, self.cross, self.mlp = attn, cross, mlp

    def sublayers(self) -> list[tuple[str, Sublayer]]:
        """(kind, sublayer) of every residual site, in execution order: "attn", "cross" (if any), "mlp"."""
        return [(kind, sub) for kind, sub in (("attn", self.attn), ("cross", self.cross), ("mlp", self.mlp))
                if sub is not None]

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attn(x, key_mask=key_mask)
        if self.cross is not None:
            x = self.cross(x, kv=memory, key_mask=memory_mask)
        return self.mlp(x)
