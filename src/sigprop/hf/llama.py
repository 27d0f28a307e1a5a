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

The block layout is data (`Llama.site_norms`, `Llama.qk_norms`), so the LLaMA-like families with other norm
placements or qk-norm (`sigprop.hf.qwen3`, `sigprop.hf.olmo2`, `sigprop.hf.gemma3`) subclass this one and state
only where they differ.

RoPE: `sigprop.theory.moments.rope.RopeAttention` with the rotary module's own frequencies (``inv_freq``, so
linear, llama3 and yarn frequency rules are read as they are); its ``attention_scaling`` multiplies cos and sin,
so the logits by its square, folded into the query variance. Rules whose frequencies change with the sequence
length at run time (``dynamic``, ``longrope``) are refused by name. Every frequency zero (the identity rotation)
takes the closed-form `Attention` map.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterator

import torch
from torch import nn

from ..models.config import ModelConfig
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
    # per residual site: the block's norm attribute on the branch input and on the branch output (None: none)
    site_norms: ClassVar[dict[str, tuple[str | None, str | None]]] = {
        "attn": ("input_layernorm", None), "mlp": ("post_attention_layernorm", None)}
    qk_norms: ClassVar[bool] = False               # the attention has q_norm and k_norm (qk-norm)

    def mirror(self, config: Any) -> dict[str, Any]:
        # activation "gelu": the smooth-activation rules of the schemes give unit gate/up pre-activations
        # (σ² = 1/d); apply() then corrects W_down from m₂(GeLU) to the gate's m₂
        # (`sigprop.theory.gated.gated_output_moment`).
        return dict(arch="decoder", vocab_size=config.vocab_size, d_model=config.hidden_size,
                    n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
                    d_ff=config.intermediate_size, max_seq_len=config.max_position_embeddings,
                    norm_type="rmsnorm", activation="gelu", dropout=0.0,
                    bias=bool(getattr(config, "attention_bias", False)), qk_norm=self.qk_norms)

    def config_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        """One key-value head per query head (no grouping), heads of width d_model / n_heads."""
        return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                    num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads, head_dim=cfg.d_head,
                    intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_seq_len, attention_dropout=0.0)

    def block_slot(self, base: nn.Module) -> tuple[nn.Module, str]:
        return base, "layers"

    def output_projections(self, block: nn.Module, kind: str) -> list[nn.Module]:
        return [block.self_attn.o_proj if kind == "attn" else block.mlp.down_proj]

    def _norm(self, block: nn.Module, kind: str, where: int) -> nn.Module | None:
        name = self.site_norms[kind][where]
        return None if name is None else getattr(block, name)

    def sites(self, block: nn.Module) -> list[ResidualSite]:
        # the skip x is the first positional argument of the branch input's norm, else of the block (attention,
        # whose module takes keywords) or of the MLP; g is the output of the branch's output norm, else the branch's
        attn_in, mlp_in = self._norm(block, "attn", 0), self._norm(block, "mlp", 0)
        attn_out, mlp_out = self._norm(block, "attn", 1), self._norm(block, "mlp", 1)
        mlp_first = mlp_in if mlp_in is not None else block.mlp
        return [ResidualSite("attn", attn_in if attn_in is not None else block, 0,
                             attn_out if attn_out is not None else block.self_attn, mlp_first, out_is_input=True),
                ResidualSite("mlp", mlp_first, 0, mlp_out if mlp_out is not None else block.mlp, block,
                             out_is_input=False)]

    def _block_norms(self, block: nn.Module) -> list[nn.Module]:
        norms = [getattr(block, name) for kind in ("attn", "mlp") for name in self.site_norms[kind] if name]
        return norms + ([block.self_attn.q_norm, block.self_attn.k_norm] if self.qk_norms else [])

    def backbone_pieces(self, base: nn.Module) -> Iterator[Piece]:
        yield Piece(base.embed_tokens.weight, "embed", None, tuple(base.embed_tokens.weight.shape))
        for layer, block in enumerate(base.layers):
            attn, mlp = block.self_attn, block.mlp
            for module, role in ((attn.q_proj, "q"), (attn.k_proj, "k"), (attn.v_proj, "v"), (attn.o_proj, "o"),
                                 (mlp.gate_proj, "ffn_in"), (mlp.up_proj, "ffn_in"), (mlp.down_proj, "ffn_out")):
                yield from linear_pieces(module, role, layer)
            for norm in self._block_norms(block):
                yield from norm_pieces(norm, layer)
        yield from norm_pieces(base.norm, None)

    def norm_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        qk = [(b.self_attn, name) for b in base.layers for name in ("q_norm", "k_norm")] if self.qk_norms else []
        attn = [(b, name) for b in base.layers if (name := self.site_norms["attn"][0]) is not None]
        return attn + qk + [(base, "norm")]                                                 # the MLP keeps its norm

    def act_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(b.mlp, "act_fn") for b in base.layers]

    def attentions(self, base: nn.Module) -> list[nn.Module]:
        return [b.self_attn for b in base.layers]

    def input_maps(self, walk: Walk, base: nn.Module) -> list[Component | None]:
        from .walk import collision
        var = walk.table_var(base.embed_tokens, "embed", "token embedding") * self.embed_scale(base) ** 2
        return [Embedding((var,), (collision(walk.ids),))]

    def branch_maps(self, walk: Walk, block: nn.Module, kind: str, L: int) -> list[Component | None]:
        if kind == "mlp":
            mlp = block.mlp
            gate, up, down = (walk.linear(m, role, name) for m, role, name in (
                (mlp.gate_proj, "ffn_in", "MLP gate_proj"), (mlp.up_proj, "ffn_in", "MLP up_proj"),
                (mlp.down_proj, "ffn_out", "MLP down_proj")))
            return [GatedMLP(gate.d_in, gate.d_out, gate.weight_var, up.weight_var, down.weight_var,
                             walk.component(mlp.act_fn, "MLP gate activation"))]
        attn = block.self_attn
        window = (attn.sliding_window if hasattr(attn, "sliding_window")
                  else getattr(attn.config, "sliding_window", None))
        if window is not None and L > window:
            raise NotImplementedError(f"sliding-window attention (window {window} < {L} tokens) has no moment map")
        n_heads, d = attn.config.num_attention_heads, attn.config.hidden_size
        if n_heads * attn.head_dim != d:
            raise NotImplementedError(f"attention with head_dim {attn.head_dim} × {n_heads} heads ≠ hidden_size {d} "
                                      "has no moment map")
        projections = [walk.linear(m, role, f"attention {name}") for m, role, name in (
            (attn.q_proj, "q", "q_proj"), (attn.k_proj, "k", "k_proj"), (attn.v_proj, "v", "v_proj"),
            (attn.o_proj, "o", "o_proj"))]
        q, k, v, o = (linear.weight_var for linear in projections)
        dof, span, checks = 0, None, []
        if self.qk_norms and not isinstance(attn.q_norm, nn.Identity):
            (q, dof, check_q), (k, width, check_k) = (walk.qk_norm(norm, f"attention {name}", linear) for
                                                      norm, name, linear in ((attn.q_norm, "q_norm", projections[0]),
                                                                             (attn.k_norm, "k_norm", projections[1])))
            span = None if (dof, width) == (attn.head_dim,) * 2 else (dof, width)   # one norm over every head
            dof, checks = attn.head_dim, [check_q, check_k]
        p = attn.attention_dropout if attn.training else 0.0
        frequencies, scaling = self.rope(walk.model.base_model, attn)
        mix = walk.attention(attn, L, (q * scaling ** 4, k, v, o), n_heads, d, attn.is_causal, p, qk_norm=dof)
        return [*checks, RopeAttention(mix, frequencies, qk_span=span) if any(frequencies) or span else mix]

    def rope(self, base: nn.Module, attn: nn.Module) -> tuple[tuple[float, ...], float]:
        """The rotary frequencies θ_p and cos/sin scaling ``attn`` reads (`_rope`): the backbone's one rotary module."""
        rotary = base.rotary_emb
        return _rope(getattr(rotary, "rope_type", "default"), rotary.inv_freq,
                     getattr(rotary, "attention_scaling", 1.0), attn.head_dim)

    def site_norm(self, block: nn.Module, kind: str) -> nn.Module:
        norm = self._norm(block, kind, 0)
        return nn.Identity() if norm is None else norm

    def output_norm(self, block: nn.Module, kind: str) -> nn.Module:
        norm = self._norm(block, kind, 1)
        return nn.Identity() if norm is None else norm

    def final_norm(self, base: nn.Module) -> nn.Module:
        return base.base_model.norm


def _rope(kind: str, inv_freq: torch.Tensor, scaling: float, head_dim: int) -> tuple[tuple[float, ...], float]:
    """The rotary frequencies θ_p (``inv_freq``) and cos/sin ``scaling`` of a rotary rule ``kind``; refuses what
    `RopeAttention` does not map."""
    if kind in ("dynamic", "longrope"):
        raise NotImplementedError(f"RoPE type {kind!r} has no moment map: its frequencies change with the sequence "
                                  "length at run time")
    inv_freq = inv_freq.detach().double()
    if 2 * inv_freq.numel() != head_dim:
        raise NotImplementedError(f"partial RoPE ({inv_freq.numel()} planes for head_dim {head_dim}) has no moment map")
    return tuple(inv_freq.tolist()), float(scaling)
