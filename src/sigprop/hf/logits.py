"""The attention logits of a `transformers` model, as its attention function computes them (Q and K after RoPE).

`watch_attention_logits` routes the model's attention function through one that first hands each watched module's
masked logits to a sink (`sigprop.models.adapter.Adapter.watch_logits`), then calls the model's own function.
Models on HF's "eager" path (a per-model function) hand none.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from ..models.adapter import LogitsSink

RECORDING = "sigprop_record"


def attention_logits(module: nn.Module, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                     scaling: float | None) -> torch.Tensor:
    """QKᵀ·scale (the shaped models' τ) with the mask applied (masked entries −inf); q (B, H, T, dh), k (B, H_kv, S,
    dh) -> (B, H, T, S)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    shaped = getattr(module, "sigprop_shape", None)
    scale = shaped.scale(q.shape[-1]) if shaped is not None else (scaling or q.shape[-1] ** -0.5)
    logits = (q @ k.transpose(-2, -1)) * scale                                 # (B, H, T, S)
    t, s = logits.shape[-2:]
    if mask is None and module.is_causal:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    return logits


@contextmanager
def watch_attention_logits(model: nn.Module, keys: dict[nn.Module, tuple[str, int, str]], sink: LogitsSink
                           ) -> Iterator[None]:
    """Inside the context every attention module in ``keys`` hands `attention_logits` to ``sink`` under its key."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = model.config._attn_implementation
    if inner not in ALL_ATTENTION_FUNCTIONS or inner not in ALL_MASK_ATTENTION_FUNCTIONS:
        yield                                                               # "eager": a per-model function
        return

    def forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple:
        if module in keys:
            with torch.no_grad():
                sink(keys[module], attention_logits(module, query, key, attention_mask, kwargs.get("scaling")))
        return ALL_ATTENTION_FUNCTIONS[inner](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(RECORDING, forward)
    AttentionMaskInterface.register(RECORDING, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    model.set_attn_implementation(RECORDING)
    try:
        yield
    finally:
        model.set_attn_implementation(inner)
