"""LLaMA family (``llama``, ``mistral``, ``qwen2``): Pre-RMSNorm, RoPE, gated MLP, one embedding table.

Block: x ← x + attn(N₁(x));  x ← x + W_d(φ(W_g N₂(x)) ⊙ W_u N₂(x));  final ``norm``. RoPE rotates
each query and key by a position-dependent orthogonal map, so |q|, |k| and, for independent
Gaussian weights, the law of every logit q·k are unchanged: the Q/K/V/O rules of a scheme apply
as they are. Only the gated MLP needs a new rule (`sigprop.theory.gated.gated_output_moment`).

Scheme ``shaped`` drops the attention RMSNorm and the final norm but keeps the RMSNorm in front of
the gated MLP, and its SiLU gate: φ(a)·b is homogeneous of degree 2 in x (for ReLU-like φ), so
without a norm the branch scales like |x|² and the stream's fixed point |x|²/d = 1 is unstable
(v ← λ²v + γ²v² grows any excess by λ² + 2γ² = 1 + γ² per block; with every norm removed and a
shaped-ReLU gate, a 48-layer, width-64 model reached inf at block 28 in float32). A shaped-ReLU gate
would not make φ(a)·b near-linear either: it tends to a·b, not to a map close to the identity.
"""
from __future__ import annotations

from typing import Any, Iterator

from torch import nn

from .base import Family, Piece, ResidualSite, linear_pieces, norm_pieces


class Llama(Family):
    model_types = ("llama", "mistral", "qwen2")
    placement = "pre"
    n_tables = 1                                   # token table only; positions enter through RoPE
    gated = True

    def mirror(self, config: Any) -> dict[str, Any]:
        # activation "gelu": the smooth-activation rules of the schemes give unit gate/up pre-activations
        # (σ² = 1/d); apply() then corrects W_down from m₂(GeLU) to the gate's m₂ (`sigprop.theory.gated.gated_output_moment`).
        return dict(arch="decoder", vocab_size=config.vocab_size, d_model=config.hidden_size,
                    n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
                    d_ff=config.intermediate_size, max_seq_len=config.max_position_embeddings,
                    norm_type="rmsnorm", activation="gelu", dropout=0.0,
                    bias=bool(getattr(config, "attention_bias", False)))

    def blocks(self, base: nn.Module) -> list[nn.Module]:
        return list(base.layers)

    def sites(self, block: nn.Module) -> list[ResidualSite]:
        return [ResidualSite("attn", block.input_layernorm, 0, block.self_attn, block.post_attention_layernorm,
                             out_is_input=True),
                ResidualSite("mlp", block.post_attention_layernorm, 0, block.mlp, block, out_is_input=False)]

    def pieces(self, base: nn.Module) -> Iterator[Piece]:
        yield Piece(base.embed_tokens.weight, "embed", None, tuple(base.embed_tokens.weight.shape))
        for layer, block in enumerate(base.layers):
            attn, mlp = block.self_attn, block.mlp
            for module, role in ((attn.q_proj, "q"), (attn.k_proj, "k"), (attn.v_proj, "v"), (attn.o_proj, "o"),
                                 (mlp.gate_proj, "ffn_in"), (mlp.up_proj, "ffn_in"), (mlp.down_proj, "ffn_out")):
                yield from linear_pieces(module, role, layer)
            yield from norm_pieces(block.input_layernorm, layer)
            yield from norm_pieces(block.post_attention_layernorm, layer)
        yield from norm_pieces(base.norm, None)

    def norm_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(b, "input_layernorm") for b in base.layers] + [(base, "norm")]      # the MLP keeps its norm

    def act_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(b.mlp, "act_fn") for b in base.layers]

    def attentions(self, base: nn.Module) -> list[nn.Module]:
        return [b.self_attn for b in base.layers]
