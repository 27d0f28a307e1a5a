"""Multi-head softmax attention on `scaled_dot_product_attention`.

out = Softmax(Q Kᵀ · scale + mask) V W_O,  Q = x W_Q, K = kv W_K, V = kv W_V  (per head),
with scale = 1/√d_head unless given. ``qk_norm`` (a `make_norm` kind) normalizes each head's queries
and keys over d_head before the product (Wortsman et al. 2023, arXiv 2309.14322; Dehghani et al.
2023). ``output_proj=False`` drops W_O (out = Softmax(·) V, the value-only layer of the covariance
SDEs; o_proj is then the identity). `ShapedAttention` subclasses this and changes only `mix`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..theory.moments.attention import Attention as AttentionMap
from ..theory.moments.cross_attention import CrossAttention, QueryView
from ..theory.moments.state import Component, Moments
from .maps import attention_logit_factor, qk_norm_of, weight_var, zero_bias
from .norm import make_norm
from .roles import tag_linear


def attention_mask(t: int, s: int, causal: bool, key_mask: torch.Tensor | None,
                   device: torch.device | None = None) -> torch.Tensor | None:
    """Boolean mask (B|1, 1, T, S), True where query i may attend key j; None when nothing is masked.

    key_mask: (B, S) bool, True for real tokens (False = padding).
    """
    mask = None
    if causal:
        mask = torch.ones(t, s, dtype=torch.bool, device=device).tril()[None, None]
    if key_mask is not None:
        km = key_mask.to(torch.bool)[:, None, None, :]   # (B, 1, 1, S)
        mask = km if mask is None else mask & km
    return mask


class Attention(nn.Module):
    """Standard multi-head attention. Projections ``q_proj, k_proj, v_proj, o_proj`` are `nn.Linear` (o_proj
    `nn.Identity` with ``output_proj=False``);
    `qkv` multiplies by the first three's weights in one fused matmul, so forward hooks on those
    three modules do not fire (their parameters are used as they are).

    Args:
        d_model: the stream width d.
        n_heads: heads H; each of width d_head = d/H.
        causal: mask each query's later keys.
        bias: biases in the projections.
        scale: the logit scale (default 1/√d_head).
        qk_norm: "layernorm" or "rmsnorm" on each head's queries and keys (qk-norm); None: none.
        output_proj: an output projection W_O (False: `nn.Identity`).

    Raises:
        ValueError: ``d_model`` not divisible by ``n_heads``, or an unknown ``qk_norm``.
    """

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, bias: bool = False,
                 scale: float | None = None, qk_norm: str | None = None, output_proj: bool = True) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.causal = d_model, n_heads, causal
        self.d_head = d_model // n_heads
        self.scale = 1.0 / math.sqrt(self.d_head) if scale is None else scale
        self.q_proj = tag_linear(nn.Linear(d_model, d_model, bias=bias), "q")
        self.k_proj = tag_linear(nn.Linear(d_model, d_model, bias=bias), "k")
        self.v_proj = tag_linear(nn.Linear(d_model, d_model, bias=bias), "v")
        self.o_proj = tag_linear(nn.Linear(d_model, d_model, bias=bias), "o") if output_proj else nn.Identity()
        self.q_norm = None if qk_norm is None else make_norm(qk_norm, self.d_head)
        self.k_norm = None if qk_norm is None else make_norm(qk_norm, self.d_head)

    def map_options(self) -> dict[str, float | bool]:
        """The attention map's options beyond the projections (softmax attention: none)."""
        return {}

    def map_temperature(self) -> float:
        """τ of the attention map's logit convention: √d_head for softmax attention."""
        return math.sqrt(self.d_head)

    def moment_map(self, L: int | float, memory: Moments | None = None, memory_len: int | None = None
                   ) -> Component:
        """This attention's moment map over ``L`` tokens: `sigprop.theory.moments.attention.Attention` from the
        projections' init stds, the causal mask and the module's logit scale; with ``memory`` (the moments
        of ``memory_len`` keys) the cross-attention map seen from the queries (`QueryView`). With qk-norm the
        map reads the norms' kind (its degrees of freedom) and gains instead of the Q and K stds
        (`sigprop.theory.moments.qk_norm`).
        Raises NotImplementedError for no output projection, qk-norm in cross-attention or with a non-uniform
        gain or a non-zero shift (no exact map), or weights not drawn by sigprop's init."""
        if isinstance(self.o_proj, nn.Identity):
            raise NotImplementedError("Attention with output_proj=False has no moment map: the maps describe a "
                                      "Gaussian output projection W_O")
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        for name in names:
            zero_bias(getattr(self, name), f"attention {name}")
        q, k, v, o = (weight_var(getattr(self, name).weight, f"attention {name}.weight") for name in names)
        options = self.map_options()
        if self.q_norm is not None:
            if memory is not None:
                raise NotImplementedError("cross-attention with qk_norm has no moment map: the normalized logits "
                                          "are derived for self-attention")
            (q, dof), (k, _) = (qk_norm_of(norm, f"attention {name}") for norm, name in ((self.q_norm, "q_norm"),
                                                                                       (self.k_norm, "k_norm")))
            options["qk_norm"] = dof
        q *= attention_logit_factor(self.scale, self.map_temperature())
        if memory is None:
            return AttentionMap(self.d_model, self.n_heads, L, q, k, v, o, causal=self.causal, **options)
        options.pop("gamma1", None)
        return QueryView(CrossAttention(self.d_model, self.n_heads, L, memory_len or L, q, k, v, o, **options),
                         memory)

    def _project(self, x: torch.Tensor, *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
        """x (B, T, d) through each of ``linears`` as one matmul against their stacked weights
        [W₁; W₂; ...] (biases stacked alike) -> one (B, H, T, dh) view per linear. The parameters stay
        separate (their own roles, init and checkpoint keys); only the product is fused."""
        w = torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight
        bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
        b, t, _ = x.shape
        ys = F.linear(x, w, bias).split(self.d_model, -1)                    # n × (B, T, d), row stride n·d
        return tuple(y.view(b, t, self.n_heads, self.d_head).transpose(1, 2) for y in ys)   # (B, H, T, dh)

    def qkv(self, x: torch.Tensor, kv: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head projections, each (B, H, T|S, dh); ``kv`` defaults to ``x`` (self-attention).
        Self-attention projects Q, K, V in one matmul, cross-attention K, V in one (`_project`)."""
        if kv is None:
            q, k, v = self._project(x, self.q_proj, self.k_proj, self.v_proj)
        else:
            (q,), (k, v) = self._project(x, self.q_proj), self._project(kv, self.k_proj, self.v_proj)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            key_mask: torch.Tensor | None) -> torch.Tensor:
        """Softmax(QKᵀ·scale + mask) V, (B, H, T, dh), without materializing the (T, S) matrix."""
        if key_mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)
        mask = attention_mask(q.shape[-2], k.shape[-2], self.causal, key_mask, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d), kv: (B, S, d) or None, key_mask: (B, S) bool -> (B, T, d)."""
        y = self.mix(*self.qkv(x, kv), key_mask)                          # (B, H, T, dh)
        return self.o_proj(y.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.d_model))

    def logits(self, q: torch.Tensor, k: torch.Tensor,
               key_mask: torch.Tensor | None) -> torch.Tensor:
        """Scaled logits QKᵀ·scale, (B, H, T, S), with masked entries set to -inf."""
        logits = (q @ k.transpose(-2, -1)) * self.scale
        mask = attention_mask(q.shape[-2], k.shape[-2], self.causal, key_mask, q.device)
        return logits if mask is None else logits.masked_fill(~mask, float("-inf"))

    def probabilities(self, q: torch.Tensor, k: torch.Tensor,
                      key_mask: torch.Tensor | None) -> torch.Tensor:
        """Explicit Softmax(QKᵀ·scale + mask), (B, H, T, S)."""
        return self.logits(q, k, key_mask).softmax(-1)

    def attention_matrix(self, x: torch.Tensor, kv: torch.Tensor | None = None,
                         key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The mixing matrix A with mix(Q, K, V) = A V, (B, H, T, S), for diagnostics."""
        q, k, _ = self.qkv(x, kv)
        return self.probabilities(q, k, key_mask)

    def max_logit(self, x: torch.Tensor, kv: torch.Tensor | None = None,
                  key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Largest unmasked scaled attention logit, a scalar tensor (a saturation diagnostic)."""
        q, k, _ = self.qkv(x, kv)
        return self.logits(q, k, key_mask).amax()
