"""BERT (``model_type="bert"``): Post-LN, embedding LayerNorm, three summed embedding tables.

Layer: h ← LN(h + D(O·attn(h)))  (``attention.output``);  h ← LN(h + D(W₂ φ(W₁ h)))  (``output``).
Both output modules receive the skip as their second argument and end in a dropout, the branch.
"""
from __future__ import annotations

from typing import Any, Iterator

from torch import nn

from .base import Family, Piece, ResidualSite, linear_pieces, mirror_activation, norm_pieces


class Bert(Family):
    model_types = ("bert",)
    placement = "post"
    n_tables = 3                                   # word + position + token type
    shared_tables = 1                              # token type 0 at every position (single-segment input)

    def mirror(self, config: Any) -> dict[str, Any]:
        if config.add_cross_attention:
            raise ValueError("sigprop.hf supports BERT without cross-attention (add_cross_attention=False)")
        return dict(arch="decoder" if config.is_decoder else "encoder", vocab_size=config.vocab_size,
                    d_model=config.hidden_size, n_layers=config.num_hidden_layers,
                    n_heads=config.num_attention_heads, d_ff=config.intermediate_size,
                    max_seq_len=config.max_position_embeddings, norm_type="layernorm",
                    activation=mirror_activation(config.hidden_act), dropout=config.hidden_dropout_prob, bias=True)

    def blocks(self, base: nn.Module) -> list[nn.Module]:
        return list(base.encoder.layer)

    def sites(self, block: nn.Module) -> list[ResidualSite]:
        attn_out, mlp_out = block.attention.output, block.output
        return [ResidualSite("attn", attn_out, 1, attn_out.dropout, attn_out, out_is_input=False),
                ResidualSite("mlp", mlp_out, 1, mlp_out.dropout, mlp_out, out_is_input=False)]

    def pieces(self, base: nn.Module) -> Iterator[Piece]:
        emb = base.embeddings
        yield Piece(emb.word_embeddings.weight, "embed", None, tuple(emb.word_embeddings.weight.shape))
        for table in (emb.position_embeddings, emb.token_type_embeddings):
            yield Piece(table.weight, "pos", None, tuple(table.weight.shape))
        yield from norm_pieces(emb.LayerNorm, None)
        for layer, block in enumerate(base.encoder.layer):
            attn = block.attention
            for module, role in ((attn.self.query, "q"), (attn.self.key, "k"), (attn.self.value, "v"),
                                 (attn.output.dense, "o"), (block.intermediate.dense, "ffn_in"),
                                 (block.output.dense, "ffn_out")):
                yield from linear_pieces(module, role, layer)
            yield from norm_pieces(attn.output.LayerNorm, layer)
            yield from norm_pieces(block.output.LayerNorm, layer)
        if base.pooler is not None:
            yield from linear_pieces(base.pooler.dense, "head", None)

    def norm_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        layers = base.encoder.layer
        return [(base.embeddings, "LayerNorm")] + [(m, "LayerNorm") for b in layers
                                                   for m in (b.attention.output, b.output)]

    def act_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(b.intermediate, "intermediate_act_fn") for b in base.encoder.layer]

    def attentions(self, base: nn.Module) -> list[nn.Module]:
        return [b.attention.self for b in base.encoder.layer]
