"""GPT-2 (``model_type="gpt2"``): Pre-LN, learned positions, fused ``c_attn``, Conv1D weights (in, out).

Block: x ← x + attn(ln_1(x));  x ← x + mlp(ln_2(x));  final ``ln_f``. ``c_attn`` holds
[W_Q | W_K | W_V] side by side, each initialized as its own (d, d) piece.

Moment maps: wte + wpe (two tables, the position rows distinct), ``drop``; attention from the three
``c_attn`` slices and ``c_proj`` with ``attn_dropout`` on the probabilities and ``resid_dropout``; MLP
Conv1D · activation · Conv1D · dropout, where "gelu" is the exact-erf GeLU and "gelu_new" (the tanh
approximation) its own quadrature map (`sigprop.theory.moments.pointwise.Smooth`); ``ln_f``; the tied LM head.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator

from torch import nn

from ..models.config import ModelConfig
from ..nn.maps import zero_bias
from ..theory.moments.embedding import Embedding
from ..theory.moments.state import Component
from .base import Family, Piece, ResidualSite, linear_pieces, mirror_activation, norm_pieces

if TYPE_CHECKING:
    from .walk import Walk


class GPT2(Family):
    model_types = ("gpt2",)
    placement = "pre"
    n_tables = 2                                   # wte + wpe

    def mirror(self, config: Any) -> dict[str, Any]:
        if config.add_cross_attention or config.scale_attn_by_inverse_layer_idx or not config.scale_attn_weights:
            raise ValueError("sigprop.hf supports GPT-2 without cross-attention and with the standard 1/√d_head "
                             "attention scale (add_cross_attention=False, scale_attn_weights=True, "
                             "scale_attn_by_inverse_layer_idx=False)")
        return dict(arch="decoder", vocab_size=config.vocab_size, d_model=config.n_embd, n_layers=config.n_layer,
                    n_heads=config.n_head, d_ff=config.n_inner or 4 * config.n_embd, max_seq_len=config.n_positions,
                    norm_type="layernorm", activation=mirror_activation(config.activation_function),
                    dropout=config.resid_pdrop, bias=True)

    def config_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(vocab_size=cfg.vocab_size, n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                    n_inner=cfg.d_ff, n_positions=cfg.max_seq_len, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    def block_slot(self, base: nn.Module) -> tuple[nn.Module, str]:
        return base, "h"

    def output_projections(self, block: nn.Module, kind: str) -> list[nn.Module]:
        """``attn.c_proj`` (and a cross-attention's ``c_proj``, whose add sits in the same block) or ``mlp.c_proj``."""
        if kind == "mlp":
            return [block.mlp.c_proj]
        cross = getattr(block, "crossattention", None)
        return [block.attn.c_proj] + ([] if cross is None else [cross.c_proj])

    def sites(self, block: nn.Module) -> list[ResidualSite]:
        return [ResidualSite("attn", block.ln_1, 0, block.attn, block.ln_2, out_is_input=True),
                ResidualSite("mlp", block.ln_2, 0, block.mlp, block, out_is_input=False)]

    def backbone_pieces(self, base: nn.Module) -> Iterator[Piece]:
        yield Piece(base.wte.weight, "embed", None, tuple(base.wte.weight.shape))
        yield Piece(base.wpe.weight, "pos", None, tuple(base.wpe.weight.shape))
        for layer, block in enumerate(base.h):
            attn = block.attn
            yield from qkv_pieces(attn, layer)
            yield Piece(attn.c_attn.bias, "bias", layer, tuple(attn.c_attn.bias.shape))
            yield from linear_pieces(attn.c_proj, "o", layer)
            yield from linear_pieces(block.mlp.c_fc, "ffn_in", layer)
            yield from linear_pieces(block.mlp.c_proj, "ffn_out", layer)
            yield from norm_pieces(block.ln_1, layer)
            yield from norm_pieces(block.ln_2, layer)
        yield from norm_pieces(base.ln_f, None)

    def norm_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(b, n) for b in base.h for n in ("ln_1", "ln_2")] + [(base, "ln_f")]

    def act_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(b.mlp, "act") for b in base.h]

    def attentions(self, base: nn.Module) -> list[nn.Module]:
        return [b.attn for b in base.h]

    def hf_init_std(self, config: Any, role: str) -> float:
        """``GPT2PreTrainedModel._init_weights``: N(0, initializer_range²) for every Conv1D, Linear and Embedding
        weight, then the ``c_proj`` of every attention and MLP (roles "o", "ffn_out") re-drawn at
        initializer_range/√(2·n_layer) (GPT-2's residual-path scaling, 2 residual adds per block)."""
        if role in ("o", "ffn_out"):
            return config.initializer_range / math.sqrt(2 * config.n_layer)
        return float(config.initializer_range)

    def input_maps(self, walk: Walk, base: nn.Module) -> list[Component | None]:
        from .walk import collision
        tables = (walk.table_var(base.wte, "embed", "token embedding wte"),
                  walk.table_var(base.wpe, "pos", "position embedding wpe"))
        return [Embedding(tables, (collision(walk.ids), 0.0)), walk.component(base.drop, "embedding dropout")]

    def branch_maps(self, walk: Walk, block: nn.Module, kind: str, L: int) -> list[Component | None]:
        if kind == "attn":
            attn = block.attn
            if attn.is_cross_attention or attn.scale_attn_by_inverse_layer_idx:
                raise NotImplementedError("GPT-2 cross-attention or inverse-layer-index attention scaling has no "
                                          "moment map")
            o = walk.linear(attn.c_proj, "o", "attention c_proj")
            zero_bias(attn.c_attn, "attention c_attn")
            q, k, v = (walk.var(p.tensor, p.role, f"attention c_attn {p.role} slice") for p in qkv_pieces(attn, None))
            p = attn.attn_dropout.p if attn.training else 0.0
            return [walk.attention(attn, L, (q, k, v, o.weight_var), attn.num_heads, attn.embed_dim, attn.is_causal,
                                   p),
                    walk.component(attn.resid_dropout, "attention resid_dropout")]
        mlp = block.mlp
        return [walk.linear(mlp.c_fc, "ffn_in", "MLP c_fc"), walk.component(mlp.act, "MLP activation"),
                walk.linear(mlp.c_proj, "ffn_out", "MLP c_proj"), walk.component(mlp.dropout, "MLP dropout")]

    def site_norm(self, block: nn.Module, kind: str) -> nn.Module:
        return block.ln_1 if kind == "attn" else block.ln_2

    def final_norm(self, base: nn.Module) -> nn.Module:
        return base.base_model.ln_f


def qkv_pieces(attn: nn.Module, layer: int | None) -> Iterator[Piece]:
    """The Q, K, V slices of ``c_attn.weight`` (d, 3d) = [Q | K | V], each (d, d)."""
    d = attn.embed_dim
    for i, role in enumerate(("q", "k", "v")):
        yield Piece(attn.c_attn.weight[:, i * d:(i + 1) * d], role, layer, (d, d))
