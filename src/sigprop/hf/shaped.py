"""Shaped attention inside `transformers` models, through the attention interface.

Every HF self-attention module computes Q, K, V (and RoPE, and the KV-cache update) itself, then
calls ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``. Registering ``"sigprop_shaped"``
there swaps only the mixing step for `sigprop.nn.ShapedAttention`'s fused form

    A V = γ₁ V + Softmax(Q Kᵀ/τ + mask) V − γ₂ C V,     τ = τ₀ √(n · n_k),

with C V the (cumulative) masked mean of V (`sigprop.nn.shaped_attention.Shaping.shape`), so the
model keeps its forward signature, KV cache and ``generate()``. With a cache the T queries are the
last T of the S keys (``DynamicCache``): identity and C rows are the last T rows. The model's own
``scaling`` is ignored (τ replaces it); attention dropout acts on the Softmax term only.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.shaped_attention import Shaping

NAME = "sigprop_shaped"


class ShapedMix(Shaping, nn.Module):
    """τ₀ and `Shaping`'s γ₁, γ₂ per head (fixed buffers, or trainable for ``mode="learn"``) of one HF attention
    module; the mixing step is `Shaping.shape`, the one `sigprop.nn.ShapedAttention` runs."""

    def __init__(self, n_heads: int, d_model: int, causal: bool, tau0: float = 1.0, gamma1: float = 1.0,
                 gamma2: float = 1.0, mode: str = "fixed") -> None:
        super().__init__()
        self.d_model, self.causal, self.tau0 = d_model, causal, tau0
        self.init_shaping(n_heads, gamma1, gamma2, mode)

    def scale(self, d_head: int) -> float:
        """1/τ = 1/(τ₀ √(n · n_k))."""
        return 1.0 / (self.tau0 * math.sqrt(self.d_model * d_head))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                dropout: float = 0.0) -> torch.Tensor:
        """q: (B, H, T, dh), k, v: (B, H_kv, S, dh), mask: (B, 1, T, S) bool or None -> (B, H, T, dh)."""
        t, s = q.shape[-2], k.shape[-2]
        rep = q.shape[1] // k.shape[1]                                       # grouped-query attention
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)     # (B, H, S, dh)
        if mask is None and self.causal and 1 < t != s:
            raise NotImplementedError("shaped attention needs the queries to be the last keys")
        key_mask = None if mask is None else padding_of(mask, self.causal)           # (B, S)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and self.causal and t > 1,
                                           scale=self.scale(q.shape[-1]), dropout_p=dropout)
        return self.shape(y, v, self.causal, key_mask)


def padding_of(mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """The key-padding mask (B, S) of a (B, 1, T, S) boolean mask that is padding ∧ (bottom-right causal).

    Any other pattern (packed sequences, sliding windows, custom masks) is refused: C must be the
    softmax of all-zero logits under the same mask, which `masked_mean` computes only for these.
    """
    if mask.dtype != torch.bool:
        raise NotImplementedError(f"shaped attention needs a boolean mask, got {mask.dtype}")
    t, s = mask.shape[-2:]
    keys = mask.any(-2)[:, 0]                                                # (B, S)
    want = keys[:, None, None, :]
    if causal:
        want = want & torch.ones(t, s, dtype=torch.bool, device=mask.device).tril(s - t)
    if not torch.equal(want.expand_as(mask), mask):
        raise NotImplementedError("shaped attention supports padding and causal masks only "
                                  "(not packed sequences, sliding windows or custom masks)")
    return keys


def shaped_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None,
                             dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` entry: returns ((B, T, H, dh), no weights)."""
    return module.sigprop_shape(query, key, value, attention_mask, dropout).transpose(1, 2), None


def shaped_mask(**kwargs) -> torch.Tensor | None:
    """HF's SDPA (boolean) mask, after checking the queries are the last keys (no static cache)."""
    from transformers.masking_utils import sdpa_mask

    q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    if int(q_offset) + kwargs["q_length"] != int(kv_offset) + kwargs["kv_length"]:
        raise NotImplementedError("shaped attention needs the queries to be the last keys: use the default "
                                  "DynamicCache, not a static or sliding-window cache")
    return sdpa_mask(**kwargs)


def register() -> None:
    """Make ``"sigprop_shaped"`` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, shaped_attention_forward)
    AttentionMaskInterface.register(NAME, shaped_mask)
