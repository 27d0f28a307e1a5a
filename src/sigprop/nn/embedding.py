"""Input embeddings: summed token + learned position tables, and ViT patches with a class token."""
from __future__ import annotations

import torch
from torch import nn

from .roles import tag, tag_linear


class TokenEmbedding(nn.Module):
    """x = E_tok[ids] + E_pos[0..T); ids: (B, T) -> (B, T, d). ``n_tables`` = 2 summed tables."""

    n_tables = 2

    def __init__(self, vocab_size: int, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_seq_len, d_model)
        tag(self.tok.weight, "embed")
        tag(self.pos.weight, "pos")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.pos.num_embeddings:
            raise ValueError(f"sequence length {t} exceeds max_seq_len {self.pos.num_embeddings}")
        return self.tok(ids) + self.pos(torch.arange(t, device=ids.device))


class PatchEmbedding(nn.Module):
    """Images (B, C, H, W) -> tokens (B, 1 + (H/p)(W/p), d): [cls; W_p · patch] + E_pos."""

    n_tables = 2

    def __init__(self, image_size: int, patch_size: int, in_channels: int, d_model: int,
                 bias: bool = False) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be divisible by patch_size ({patch_size})")
        self.patch_size = patch_size
        n_patches = (image_size // patch_size) ** 2
        self.proj = tag_linear(nn.Linear(in_channels * patch_size ** 2, d_model, bias=bias), "patch")
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos = nn.Parameter(torch.zeros(1, n_patches + 1, d_model))
        tag(self.cls, "cls")
        tag(self.pos, "pos")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        patches = nn.functional.unfold(images, kernel_size=p, stride=p).transpose(1, 2)  # (B, N, C·p·p)
        x = self.proj(patches)                                                          # (B, N, d)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
