"""A stack of transformer blocks assembled from a `ModelConfig` and its scheme.

The scheme supplies the norm placement, attention kind, activation and every (α, β); this
file only wires modules together, so adding a scheme never touches it.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..nn import MLP, Attention, Block, ShapedAttention, Sublayer, make_activation, make_norm
from ..nn.block import INPUT_NORMED, OUTPUT_NORMED, sites_chain
from ..nn.maps import component_of
from ..nn.roles import tag_site
from ..schemes import Scheme, Site, get_scheme
from ..theory.moments.state import Component, Moments
from .config import ModelConfig


def make_attention(cfg: ModelConfig, scheme: Scheme, causal: bool, self_attention: bool = True) -> Attention:
    """The scheme's attention module; shaped cross-attention has no identity term (T ≠ S)."""
    if scheme.attention == "shaped":
        return ShapedAttention(cfg.d_model, cfg.n_heads, causal=causal, tau0=cfg.tau0, mode=cfg.shaping,
                               identity=self_attention, bias=cfg.bias, qk_scaling=cfg.qk_scaling)
    return Attention(cfg.d_model, cfg.n_heads, causal=causal, bias=cfg.bias, scale=scheme.attention_scale(cfg),
                     qk_norm=cfg.norm_type if cfg.qk_norm else None)


class Stack(nn.Module):
    """``n`` blocks of stack ``name`` ("enc" | "dec"), plus a final norm unless the norms sit after the add
    ("post") or nowhere ("none"): Pre-LN, "out" (OLMo 2) and "sandwich" (Gemma) stacks end with one.

    x: (B, T, d) -> (B, T, d). With ``activation_checkpointing`` set, a training forward keeps
    only each block's input and recomputes the block in backward (non-reentrant
    `torch.utils.checkpoint`, RNG state replayed, so dropout masks and gradients are unchanged):
    activation memory of L block inputs plus one block's intermediates, instead of every block's.
    """

    activation_checkpointing: bool = False

    def __init__(self, cfg: ModelConfig, name: str, n: int, causal: bool, cross: bool = False) -> None:
        super().__init__()
        scheme = get_scheme(cfg.scheme)
        placement = cfg.norm_placement

        def sublayer(fn: nn.Module, layer: int, kind: str) -> Sublayer:
            alpha, beta = scheme.residual(cfg, Site(name, layer, kind))
            norm = make_norm(cfg.norm_type, cfg.d_model) if placement in (*INPUT_NORMED, "post") else None
            out_norm = make_norm(cfg.norm_type, cfg.d_model) if placement in OUTPUT_NORMED else None
            sub = Sublayer(fn, norm, placement, alpha, beta, cfg.dropout, cfg.learn_residual,
                           cfg.d_model if scheme.channel_residual else None, out_norm)
            sub.site = Site(name, layer, kind)          # read by sigprop.diagnostics
            return sub

        blocks = []
        for layer in range(n):
            act = make_activation(scheme.activation(cfg), cfg.d_model, cfg.c_plus, cfg.c_minus, cfg.shaping)
            block = Block(
                attn=sublayer(make_attention(cfg, scheme, causal), layer, "attn"),
                cross=sublayer(make_attention(cfg, scheme, False, False), layer, "cross") if cross else None,
                mlp=sublayer(MLP(cfg.d_model, cfg.d_ff, act, cfg.bias), layer, "mlp"),
            )
            tag_site(block, name, layer)
            blocks.append(block)
        self.blocks = nn.ModuleList(blocks)
        final = placement not in ("post", "none")
        self.final_norm = make_norm(cfg.norm_type, cfg.d_model) if final else nn.Identity()

    @property
    def placement(self) -> str:
        """Where the sublayers' norms sit: "pre", "post", "none", "out" or "sandwich" (`sigprop.nn.block`)."""
        return self.blocks[0].attn.placement

    def moment_chain(self, L: int | float, memory: Moments | None = None, memory_len: int | None = None
                     ) -> tuple[list[tuple[int, str] | None], list[Component]]:
        """Every residual site's moment map in forward order (`sites_chain` of each `Sublayer.site_maps`;
        cross-attention sites read ``memory``), then the final norm; with the record label of each map's output:
        (layer, sublayer), 1-based, or None for the final norm."""
        sites = [(i, kind, sub) for i, block in enumerate(self.blocks) for kind, sub in block.sublayers()]
        labels: list[tuple[int, str] | None] = [(i + 1, kind) for i, kind, _ in sites]
        maps = [sub.site_maps(L, memory if kind == "cross" else None, memory_len) for _, kind, sub in sites]
        chain = sites_chain(maps, self.placement, normalized_input=False)
        if not isinstance(self.final_norm, nn.Identity):
            labels.append(None)
            chain.append(component_of(self.final_norm, "final norm"))
        return labels, chain

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                x = checkpoint(block, x, key_mask, memory, memory_mask, use_reentrant=False)
            else:
                x = block(x, key_mask, memory, memory_mask)
        return self.final_norm(x)
