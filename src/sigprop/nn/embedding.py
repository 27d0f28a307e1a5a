"""Input embeddings: summed token + learned position tables, and ViT patches with a class token."""
from __future__ import annotations

import torch
from torch import nn

from ..theory.moments.embedding import Embedding as EmbeddingMap
from ..theory.moments.embedding import PatchEmbedding as PatchEmbeddingMap
from .maps import weight_var, zero_bias
from .roles import tag, tag_linear


def check_ids(ids: torch.Tensor, vocab_size: int, max_seq_len: int) -> None:
    """Raise ValueError unless ``ids`` is an integer tensor (batch, seq) with 1 <= seq <= max_seq_len and
    every id in [0, vocab_size). (The id range is not checked while torch.compile traces.)"""
    if not isinstance(ids, torch.Tensor) or ids.dtype not in _INT_DTYPES or ids.ndim != 2:
        got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"token ids must be an integer tensor (batch, seq), got {got}")
    if not 1 <= ids.shape[1] <= max_seq_len:
        raise ValueError(f"sequence length {ids.shape[1]} must be in [1, max_seq_len={max_seq_len}]")
    if ids.numel() and not torch.compiler.is_compiling():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token ids must be in [0, vocab_size={vocab_size}), got ids in [{lo}, {hi}]")


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class TokenEmbedding(nn.Module):
    """x = E_tok[ids] + E_pos[0..T); ids: (B, T) -> (B, T, d). ``n_tables`` = 2 summed tables.

    Args:
        vocab_size: rows of the token table.
        max_seq_len: rows of the position table (the longest sequence).
        d_model: the width d.
    """

    n_tables = 2

    def __init__(self, vocab_size: int, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_seq_len, d_model)
        tag(self.tok.weight, "embed")
        tag(self.pos.weight, "pos")

    def moment_map(self, token_collision: float) -> EmbeddingMap:
        """Token table (P(two positions hold one token) = ``token_collision``) plus position table (distinct
        rows), each with its own init variance."""
        tok, pos = weight_var(self.tok.weight, "token embedding"), weight_var(self.pos.weight, "position embedding")
        return EmbeddingMap((tok, pos), (token_collision, 0.0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_ids(ids, self.tok.num_embeddings, self.pos.num_embeddings)
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class PatchEmbedding(nn.Module):
    """Images (B, C, H, W) -> tokens (B, 1 + (H/p)(W/p), d): [cls; W_p · patch] + E_pos.

    Args:
        image_size: the side H = W of the square images.
        patch_size: the side p of a patch.
        in_channels: C.
        d_model: the width d.
        bias: a bias in the patch projection.

    Raises:
        ValueError: ``image_size`` not divisible by ``patch_size``.
    """

    n_tables = 2

    def __init__(self, image_size: int, patch_size: int, in_channels: int, d_model: int,
                 bias: bool = False) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be divisible by patch_size ({patch_size})")
        self.patch_size, self.image_size = patch_size, image_size
        n_patches = (image_size // patch_size) ** 2
        self.proj = tag_linear(nn.Linear(in_channels * patch_size ** 2, d_model, bias=bias), "patch")
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos = nn.Parameter(torch.zeros(1, n_patches + 1, d_model))
        tag(self.cls, "cls")
        tag(self.pos, "pos")

    def moment_map(self) -> PatchEmbeddingMap:
        """Patches of N(0, 1) pixels through the projection, the class token and the position table, each from
        its init variance."""
        zero_bias(self.proj, "patch projection")
        return PatchEmbeddingMap(weight_var(self.proj.weight, "patch projection"), self.proj.in_features,
                                 weight_var(self.pos, "patch position table"), weight_var(self.cls, "class token"),
                                 self.pos.shape[1] - 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        c, side = self.proj.in_features // self.patch_size ** 2, self.image_size
        if not (isinstance(images, torch.Tensor) and images.is_floating_point() and images.ndim == 4
                and tuple(images.shape[1:]) == (c, side, side)):
            got = f"{tuple(images.shape)} {images.dtype}" if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a float tensor (batch, in_channels={c}, image_size={side}, "
                             f"image_size={side}) (patch_size {self.patch_size}), got {got}")
        p = self.patch_size
        patches = nn.functional.unfold(images, kernel_size=p, stride=p).transpose(1, 2)  # (B, N, C·p·p)
        x = self.proj(patches)                                                          # (B, N, d)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
