"""Gemma 3 family, text model (``gemma3_text``): sandwich norms, qk-norm, a scaled embedding, (1 + w) gains.

Block (Gemma 3 technical report, arXiv 2503.19786; the sandwich of Gemma 2, arXiv 2408.00118), placement
"sandwich":

    x ← x + N₂(W_O attn(N₁(x)));  x ← x + N₄(W_d(φ(W_g N₃(x)) ⊙ W_u N₃(x)));  final ``norm``,

every N an RMSNorm whose gain is 1 + w (w = 0 at init: `Family.norm_offset` = 1), φ the tanh GeLU (GeGLU, its
map by quadrature, `sigprop.theory.moments.gated.GatedMLP`); q_norm and k_norm per head (d_k coordinates, before
RoPE); logits scaled by ``query_pre_attn_scalar``^{-1/2} (the module's ``scaling``); the token table's output times
√d (``embed_scale``: the stream enters with variance d σ_e²); the LM head tied to the table. Each layer type has its
own rotary frequencies (``rope_parameters`` per type: local and global bases), read for the layer it walks.

Sliding-window layers attend to the last ``sliding_window`` keys: within the window (sequence length ≤ window)
the mask is the causal one and no moment changes; a longer sequence is refused by name. Logit soft-capping
(``attn_logit_softcapping``, ``final_logit_softcapping``: tanh on the logits) has no map and is refused by name,
as is ``use_bidirectional_attention`` (the walk traces a causal LM's backward per position).

Schemes: ``depth_mup`` and ``completep`` (their rules hold under "sandwich"), and ``dslm``, whose Pre-LN stds for
the branch input N₁(x) hold the branch before N₂ at unit variance (`sigprop.schemes.dslm`); ``shaped`` is refused
(removing the norms leaves the gated MLP unnormalized). `sigprop.hf.apply` sets the norms' w = 0 (gain 1), divides
the table's std by √d so the stream enters with the scheme's variance, and multiplies the tied logits by √d to match.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from ..theory.moments.state import Component
from .llama import Llama, _rope

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from .walk import Walk


class Gemma3(Llama):
    model_types = ("gemma3_text",)
    placement = "sandwich"
    site_norms: ClassVar[dict[str, tuple[str | None, str | None]]] = {
        "attn": ("input_layernorm", "post_attention_layernorm"),
        "mlp": ("pre_feedforward_layernorm", "post_feedforward_layernorm")}
    qk_norms = True
    norm_offset = 1.0

    def config_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        """LLaMA's, with the logits scaled by d_k^{-1/2} (``query_pre_attn_scalar`` = d_k, as Gemma 3's released
        sizes set it; the family's default, 256, belongs to its 256-wide heads)."""
        return {**super().config_fields(cfg), "query_pre_attn_scalar": cfg.d_head}

    def embed_scale(self, base: nn.Module) -> float:
        return float(base.embed_tokens.embed_scale.to(base.embed_tokens.weight.dtype))

    def rope(self, base: nn.Module, attn: nn.Module) -> tuple[tuple[float, ...], float]:
        """The frequencies and scaling of ``attn``'s layer type (``{type}_inv_freq``, ``{type}_attention_scaling``)."""
        rotary, kind = base.rotary_emb, attn.layer_type
        return _rope(rotary.rope_type[kind], getattr(rotary, f"{kind}_inv_freq"),
                     getattr(rotary, f"{kind}_attention_scaling"), attn.head_dim)

    def branch_maps(self, walk: Walk, block: nn.Module, kind: str, L: int) -> list[Component | None]:
        cap = block.self_attn.attn_logit_softcapping
        if kind == "attn" and cap is not None:
            raise NotImplementedError(f"attention logit soft-capping (attn_logit_softcapping={cap}) has no moment map")
        if kind == "attn" and getattr(block.self_attn.config, "use_bidirectional_attention", False):
            raise NotImplementedError("bidirectional attention (use_bidirectional_attention=True) in a causal LM: the "
                                      "walk traces a causal stack's backward per position, so it has no map here")
        return super().branch_maps(walk, block, kind, L)

    def head_maps(self, walk: Walk, model: nn.Module) -> list[Component | None]:
        cap = getattr(model.config, "final_logit_softcapping", None)
        if model is not model.base_model and cap is not None:
            raise NotImplementedError(f"final logit soft-capping (final_logit_softcapping={cap}) has no moment map")
        return super().head_maps(walk, model)
