"""BERT (``model_type="bert"``): Post-LN, embedding LayerNorm, three summed embedding tables.

Layer: h ← LN(h + D(O·attn(h)))  (``attention.output``);  h ← LN(h + D(W₂ φ(W₁ h)))  (``output``).
Both output modules receive the skip as their second argument and end in a dropout, the branch.

Moment maps: word + position + token-type tables (the token-type row of a single segment is shared by every
position: collision 1; given ``token_type_ids``, their own collision), the embedding LayerNorm and dropout;
attention with its probability dropout, then ``attention.output.dense`` and dropout, Post-LN
(`PostNormResidual`, its input the previous norm's output); MLP ``intermediate`` · activation · ``output.dense``
· dropout; the MLM head (``BertForMaskedLM``: transform dense · activation · LayerNorm, then the tied
decoder), or none for the bare ``BertModel`` (its pooler does not reach ``last_hidden_state``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from torch import nn

from ..theory.moments.embedding import Embedding
from ..theory.moments.state import Component
from .base import Family, Piece, ResidualSite, linear_pieces, mirror_activation, norm_pieces, tied_head

if TYPE_CHECKING:
    from .walk import Walk


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

    def block_slot(self, base: nn.Module) -> tuple[nn.Module, str]:
        return base.encoder, "layer"

    def output_projections(self, block: nn.Module, kind: str) -> list[nn.Module]:
        return [block.attention.output.dense if kind == "attn" else block.output.dense]

    def sites(self, block: nn.Module) -> list[ResidualSite]:
        attn_out, mlp_out = block.attention.output, block.output
        return [ResidualSite("attn", attn_out, 1, attn_out.dropout, attn_out, out_is_input=False),
                ResidualSite("mlp", mlp_out, 1, mlp_out.dropout, mlp_out, out_is_input=False)]

    def backbone_pieces(self, base: nn.Module) -> Iterator[Piece]:
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

    def input_maps(self, walk: Walk, base: nn.Module) -> list[Component | None]:
        from .walk import collision
        emb = walk.model.base_model.embeddings
        types = walk.batch.get("token_type_ids") if isinstance(walk.batch, dict) else None
        tables = (walk.table_var(emb.word_embeddings, "embed", "word embedding"),
                  walk.table_var(emb.position_embeddings, "pos", "position embedding"),
                  walk.table_var(emb.token_type_embeddings, "pos", "token-type embedding"))
        shared = 1.0 if types is None else collision(types)
        return [Embedding(tables, (collision(walk.ids), 0.0, shared)),
                walk.component(emb.LayerNorm, "embedding LayerNorm"), walk.component(emb.dropout, "embedding dropout")]

    def branch_maps(self, walk: Walk, block: nn.Module, kind: str, L: int) -> list[Component | None]:
        if kind == "attn":
            att, out = block.attention.self, block.attention.output
            q, k, v = (walk.linear(m, role, f"attention {role}").weight_var
                       for m, role in ((att.query, "q"), (att.key, "k"), (att.value, "v")))
            o = walk.linear(out.dense, "o", "attention output.dense").weight_var
            p = att.dropout.p if att.training else 0.0
            return [walk.attention(att, L, (q, k, v, o), att.num_attention_heads, att.all_head_size, att.is_causal, p),
                    walk.component(out.dropout, "attention output dropout")]
        return [walk.linear(block.intermediate.dense, "ffn_in", "intermediate.dense"),
                walk.component(block.intermediate.intermediate_act_fn, "MLP activation"),
                walk.linear(block.output.dense, "ffn_out", "output.dense"),
                walk.component(block.output.dropout, "MLP output dropout")]

    def site_norm(self, block: nn.Module, kind: str) -> nn.Module:
        return block.attention.output.LayerNorm if kind == "attn" else block.output.LayerNorm

    def head_maps(self, walk: Walk, model: nn.Module) -> list[Component | None]:
        if model is model.base_model:
            return []
        predictions = getattr(getattr(model, "cls", None), "predictions", None)
        if predictions is None or not hasattr(predictions, "transform"):
            raise NotImplementedError(f"{type(model).__name__}: its head has no moment map (the MLM head and the "
                                      "bare BertModel have)")
        t = predictions.transform
        if bool(predictions.bias.detach().any()):
            raise NotImplementedError("MLM head bias is non-zero; the moment maps describe zero biases")
        return [walk.linear(t.dense, "head", "MLM transform dense"),
                walk.component(t.transform_act_fn, "MLM activation"),
                walk.component(t.LayerNorm, "MLM LayerNorm"), tied_head(walk, model, predictions.decoder)]
