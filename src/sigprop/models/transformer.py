"""The four architectures: decoder LM, encoder MLM, encoder–decoder, ViT.

Every model: embeddings → dropout → `Stack`(s) → head. Language heads are tied to the token
embedding and scaled by the scheme's ``logit_scale`` = 1/√(d σ_e²) (unit-variance logits).
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn import PatchEmbedding, TokenEmbedding
from ..nn.roles import tag_linear
from ..schemes import get_scheme
from .config import ModelConfig
from .stack import Stack


def _check_mask(mask: torch.Tensor | None, ids: torch.Tensor, name: str) -> None:
    """A key mask must have its ids' shape (batch, seq); True marks real tokens."""
    if mask is not None and isinstance(ids, torch.Tensor) and (not isinstance(mask, torch.Tensor)
                                                              or tuple(mask.shape) != tuple(ids.shape)):
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a (batch, seq) tensor of the ids' shape {tuple(ids.shape)}, got {got}")


class _TiedLM(nn.Module):
    """Shared pieces of the token models: embedding, dropout and the tied, scaled output head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.vocab_size, cfg.max_seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.logit_scale = get_scheme(cfg.scheme).logit_scale(cfg)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.embed(ids))                                  # (B, T, d)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return (h * self.logit_scale) @ self.embed.tok.weight.t()          # (B, T, V)


class _SingleStackLM(_TiedLM):
    """One stack over the tokens: input_ids (B, T), attention_mask (B, T) bool -> logits (B, T, V)."""

    stack_name: str
    causal: bool

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.stack = Stack(cfg, self.stack_name, cfg.n_layers, causal=self.causal)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        _check_mask(attention_mask, input_ids, "attention_mask")
        return self.logits(self.stack(self.embed_tokens(input_ids), attention_mask))


class DecoderLM(_SingleStackLM):
    """Causal language model."""

    stack_name, causal = "dec", True


class EncoderMLM(_SingleStackLM):
    """Bidirectional encoder with a masked-LM head (tied embeddings)."""

    stack_name, causal = "enc", False


class EncoderDecoder(_TiedLM):
    """Seq2seq: src_ids (B, S), tgt_ids (B, T), src_mask (B, S) -> logits (B, T, V); one shared embedding."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.encoder = Stack(cfg, "enc", cfg.n_layers, causal=False)
        self.decoder = Stack(cfg, "dec", cfg.n_dec_layers, causal=True, cross=True)

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor,
                src_mask: torch.Tensor | None = None) -> torch.Tensor:
        _check_mask(src_mask, src_ids, "src_mask")
        if isinstance(src_ids, torch.Tensor) and isinstance(tgt_ids, torch.Tensor) and len(src_ids) != len(tgt_ids):
            raise ValueError(f"src_ids and tgt_ids must have one batch size, got {len(src_ids)} and {len(tgt_ids)}")
        memory = self.encoder(self.embed_tokens(src_ids), src_mask)          # (B, S, d)
        return self.logits(self.decoder(self.embed_tokens(tgt_ids), memory=memory, memory_mask=src_mask))


class ViT(nn.Module):
    """Vision transformer: images (B, C, H, W) -> class logits (B, n_classes) from the class token."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = PatchEmbedding(cfg.image_size, cfg.patch_size, cfg.in_channels, cfg.d_model, cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.stack = Stack(cfg, "enc", cfg.n_layers, causal=False)
        self.head = tag_linear(nn.Linear(cfg.d_model, cfg.n_classes, bias=True), "head")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack(self.drop(self.embed(images)))[:, 0])
