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

Moment maps: the token table (no dropout); RMSNorm; attention with grouped-query heads (the maps take
``num_attention_heads``: query heads sharing one K/V head give uncorrelated contributions, because each writes
through its own independent block of W_O, so every variance and covariance adds as for separate heads) and
its probability dropout; the gated MLP (`sigprop.theory.moments.gated.GatedMLP`, SiLU by quadrature); the
final norm; the LM head, untied by default.

RoPE: `sigprop.theory.moments.rope.RopeAttention` with the rotary module's own frequencies (``inv_freq``, so
linear, llama3 and yarn frequency rules are read as they are); its ``attention_scaling`` multiplies cos and sin,
so the logits by its square, folded into the query variance. Rules whose frequencies change with the sequence
length at run time (``dynamic``, ``longrope``) are refused by name. Every frequency zero (the identity rotation)
takes the closed-form `Attention` map.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from torch import nn

from ..theory.moments.embedding import Embedding
from ..theory.moments.gated import GatedMLP
from ..theory.moments.rope import RopeAttention
from ..theory.moments.state import Component
from .base import Family, Piece, ResidualSite, linear_pieces, norm_pieces

if TYPE_CHECKING:
    from .walk import Walk


class Llama(Family):
    model_types = ("llama", "mistral", "qwen2")
    placement = "pre"
    n_tables = 1                                   # token table only; positions enter through RoPE
    gated = True

    def mirror(self, config: Any) -> dict[str, Any]:
        # activation "gelu": the smooth-activation rules of the schemes give unit gate/up pre-activations
        # (σ² = 1/d); apply() then corrects W_down from m₂(GeLU) to the gate's m₂
        # (`sigprop.theory.gated.gated_output_moment`).
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

    def input_maps(self, walk: Walk, base: nn.Module) -> list[Component | None]:
        from .walk import collision
        return [Embedding((walk.table_var(base.embed_tokens, "embed", "token embedding"),), (collision(walk.ids),))]

    def branch_maps(self, walk: Walk, block: nn.Module, kind: str, L: int) -> list[Component | None]:
        if kind == "mlp":
            mlp = block.mlp
            gate, up, down = (walk.linear(m, role, name) for m, role, name in (
                (mlp.gate_proj, "ffn_in", "MLP gate_proj"), (mlp.up_proj, "ffn_in", "MLP up_proj"),
                (mlp.down_proj, "ffn_out", "MLP down_proj")))
            return [GatedMLP(gate.d_in, gate.d_out, gate.weight_var, up.weight_var, down.weight_var,
                             walk.component(mlp.act_fn, "MLP gate activation"))]
        attn = block.self_attn
        rotary = walk.model.base_model.rotary_emb
        window = (attn.sliding_window if hasattr(attn, "sliding_window")
                  else getattr(attn.config, "sliding_window", None))
        if window is not None and L > window:
            raise NotImplementedError(f"sliding-window attention (window {window} < {L} tokens) has no moment map")
        n_heads, d = attn.config.num_attention_heads, attn.config.hidden_size
        if n_heads * attn.head_dim != d:
            raise NotImplementedError(f"attention with head_dim {attn.head_dim} × {n_heads} heads ≠ hidden_size {d} "
                                      "has no moment map")
        q, k, v, o = (walk.linear(m, role, f"attention {name}").weight_var for m, role, name in (
            (attn.q_proj, "q", "q_proj"), (attn.k_proj, "k", "k_proj"), (attn.v_proj, "v", "v_proj"),
            (attn.o_proj, "o", "o_proj")))
        p = attn.attention_dropout if attn.training else 0.0
        frequencies, scaling = _rope(rotary, attn.head_dim)
        mix = walk.attention(attn, L, (q * scaling ** 4, k, v, o), n_heads, d, attn.is_causal, p)
        return [RopeAttention(mix, frequencies) if any(frequencies) else mix]

    def site_norm(self, block: nn.Module, kind: str) -> nn.Module:
        return block.input_layernorm if kind == "attn" else block.post_attention_layernorm

    def final_norm(self, base: nn.Module) -> nn.Module:
        return base.norm


def _rope(rotary: nn.Module, head_dim: int) -> tuple[tuple[float, ...], float]:
    """The rotary module's frequencies θ_p and its cos/sin scaling; refuses what `RopeAttention` does not map."""
    kind = getattr(rotary, "rope_type", "default")
    if kind in ("dynamic", "longrope"):
        raise NotImplementedError(f"RoPE type {kind!r} has no moment map: its frequencies change with the sequence "
                                  "length at run time")
    inv_freq = rotary.inv_freq.detach().double()
    if 2 * inv_freq.numel() != head_dim:
        raise NotImplementedError(f"partial RoPE ({inv_freq.numel()} planes for head_dim {head_dim}) has no moment map")
    return tuple(inv_freq.tolist()), float(getattr(rotary, "attention_scaling", 1.0))
