"""Autoregressive sampling from a decoder LM."""
from __future__ import annotations

import torch
from torch import nn

from ..diagnostics.measure import output_tensor


@torch.no_grad()
def sample(model: nn.Module, ids: torch.Tensor, max_new_tokens: int, max_seq_len: int,
           temperature: float = 1.0, top_k: int = 0, gen: torch.Generator | None = None) -> torch.Tensor:
    """Extend ``ids`` (B, T) by ``max_new_tokens`` tokens -> (B, T + max_new_tokens).

    The model sees the last ``max_seq_len`` tokens; temperature 0 is greedy; top_k > 0
    samples among the k most likely tokens only.
    """
    if temperature < 0 or top_k < 0:
        raise ValueError(f"temperature ({temperature}) and top_k ({top_k}) must be >= 0")
    for _ in range(max_new_tokens):
        logits = output_tensor(model(ids[:, -max_seq_len:]))[:, -1].float()     # (B, V)
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(logits.softmax(-1), 1, generator=gen)
        ids = torch.cat([ids, nxt.to(ids.device)], dim=1)
    return ids
