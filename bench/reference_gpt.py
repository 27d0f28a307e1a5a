"""A plain Pre-LN GPT (nanoGPT-style, fused QKV, SDPA attention): the speed reference for bench/throughput.py.

Same shapes as a sigprop decoder with scheme="preln", activation="relu", bias=False: learned
positions, LayerNorm, d → d_ff → d ReLU MLP, tied output embedding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)      # (B, H, T, dh)
                   for y in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Layer(nn.Module):
    def __init__(self, d: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SelfAttention(d, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d, d_ff, bias=False), nn.ReLU(), nn.Linear(d_ff, d, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ReferenceGPT(nn.Module):
    """ids (B, T) -> logits (B, T, V)."""

    def __init__(self, vocab_size: int, max_seq_len: int, d: int, n_layers: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, d), nn.Embedding(max_seq_len, d)
        self.layers = nn.ModuleList(Layer(d, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.ln_f(x) @ self.tok.weight.t()
