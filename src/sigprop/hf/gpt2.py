"""GPT-2 (``model_type="gpt2"``): Pre-LN, learned positions, fused ``c_attn``, Conv1D weights (in, out).

Block: x ← x + attn(ln_1(x));  x ← x + mlp(ln_2(x));  final ``ln_f``. ``c_attn`` holds
[W_Q | W_K | W_V] side by side, each initialized as its own (d, d) piece.
"""
from __future__ import annotations

from typing import Any, Iterator

from torch import nn

from .base import Family, Piece, ResidualSite, linear_pieces, mirror_activation, norm_pieces


class GPT2(Family):
    model_types = ("gpt2",)
    placement = "pre"
    n_tables = 2                                   # wte + wpe
    exact_mirror = True                            # = sigprop's decoder with bias=True (GeLU-tanh ≈ GeLU)

    def mirror(self, config: Any) -> dict[str, Any]:
        if config.add_cross_attention or config.scale_attn_by_inverse_layer_idx or not config.scale_attn_weights:
            raise ValueError("sigprop.hf supports GPT-2 without cross-attention and with the standard 1/√d_head "
                             "attention scale (add_cross_attention=False, scale_attn_weights=True, "
                             "scale_attn_by_inverse_layer_idx=False)")
        return dict(arch="decoder", vocab_size=config.vocab_size, d_model=config.n_embd, n_layers=config.n_layer,
                    n_heads=config.n_head, d_ff=config.n_inner or 4 * config.n_embd, max_seq_len=config.n_positions,
                    norm_type="layernorm", activation=mirror_activation(config.activation_function),
                    dropout=config.resid_pdrop, bias=True)

    def blocks(self, base: nn.Module) -> list[nn.Module]:
        return list(base.h)

    def sites(self, block: nn.Module) -> list[ResidualSite]:
        return [ResidualSite("attn", block.ln_1, 0, block.attn, block.ln_2, out_is_input=True),
                ResidualSite("mlp", block.ln_2, 0, block.mlp, block, out_is_input=False)]

    def pieces(self, base: nn.Module) -> Iterator[Piece]:
        yield Piece(base.wte.weight, "embed", None, tuple(base.wte.weight.shape))
        yield Piece(base.wpe.weight, "pos", None, tuple(base.wpe.weight.shape))
        for layer, block in enumerate(base.h):
            attn, d = block.attn, block.attn.embed_dim
            for i, role in enumerate(("q", "k", "v")):                 # c_attn.weight: (d, 3d) = [Q | K | V]
                yield Piece(attn.c_attn.weight[:, i * d:(i + 1) * d], role, layer, (d, d))
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
