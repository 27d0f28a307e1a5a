"""The four architectures: decoder LM, encoder MLM, encoder–decoder, ViT.

Every model: embeddings → dropout → `Stack`(s) → head. Language heads are tied to the token
embedding and scaled by the scheme's ``logit_scale`` = 1/√(d σ_e²) (unit-variance logits).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..nn import PatchEmbedding, TokenEmbedding
from ..nn.maps import component_of, weight_var, zero_bias
from ..nn.roles import tag_linear
from ..schemes import get_scheme
from ..theory.moments.embedding import ClassToken, zipf_collision_probability
from ..theory.moments.linear import Linear
from ..theory.moments.state import Component, Moments
from .adapter import Chain
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

    def default_inputs(self, seq_len: int | None = None, token_collision: float | None = None) -> tuple[int, float]:
        """(tokens per sequence, P(two positions hold the same token)): ``seq_len`` or the position table's size,
        ``token_collision`` or the Zipf law over the vocabulary (natural text)."""
        tables = self.embed
        zipf = token_collision is None
        return (seq_len or tables.pos.num_embeddings,
                zipf_collision_probability(tables.tok.num_embeddings) if zipf else token_collision)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.embed(ids))                                  # (B, T, d)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return (h * self.logit_scale) @ self.embed.tok.weight.t()          # (B, T, V)

    def input_chain(self, token_collision: float, recorded: bool = True) -> Chain:
        """Embedding tables, then dropout; the embedding output is record (0, "embed") if ``recorded``."""
        return ([(0, "embed") if recorded else None, None],
                [self.embed.moment_map(token_collision), component_of(self.drop, "embedding dropout")])

    def head_chain(self) -> Chain:
        """Tied logits: a Linear with weight variance logit_scale² σ_e²."""
        tok = self.embed.tok
        return [None], [Linear(tok.embedding_dim, tok.num_embeddings,
                               self.logit_scale ** 2 * weight_var(tok.weight, "token embedding"))]


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

    def moment_chain(self, seq_len: int, token_collision: float, memory: Moments | None = None) -> Chain:
        """The model as moment maps from ids to logits, with each output's record label (one stack: no memory)."""
        return _join(self.input_chain(token_collision), self.stack.moment_chain(seq_len), self.head_chain())

    def stack_chain(self, stack: str, memory: Moments | None = None, seq_len: int | None = None,
                    token_collision: float | None = None) -> list[Component]:
        """The moment maps of the model's one stack (`moment_chain` at `default_inputs`)."""
        return self.moment_chain(*self.default_inputs(seq_len, token_collision))[1]


class DecoderLM(_SingleStackLM):
    """Causal language model: input_ids (B, T), attention_mask (B, T) bool -> logits (B, T, V); tied embeddings.

    Args:
        cfg: its `ModelConfig` (``arch="decoder"``); build it with `build_model`, which also initializes it.

    Raises:
        ValueError: (forward) an ``attention_mask`` of another shape than the ids.
    """

    stack_name, causal = "dec", True


class EncoderMLM(_SingleStackLM):
    """Bidirectional encoder with a masked-LM head (tied embeddings): input_ids (B, T), attention_mask (B, T)
    bool -> logits (B, T, V).

    Args:
        cfg: its `ModelConfig` (``arch="encoder"``); build it with `build_model`.

    Raises:
        ValueError: (forward) an ``attention_mask`` of another shape than the ids.
    """

    stack_name, causal = "enc", False


class EncoderDecoder(_TiedLM):
    """Seq2seq: src_ids (B, S), tgt_ids (B, T), src_mask (B, S) -> logits (B, T, V); one shared embedding.

    Args:
        cfg: its `ModelConfig` (``arch="encdec"``; ``n_dec_layers`` decoder blocks); build it with `build_model`.

    Raises:
        ValueError: (forward) source and target of different batch sizes, or a ``src_mask`` of another shape
            than the source ids; (`moment_chain`) no memory moments.
    """

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

    def stack_chain(self, stack: str, memory: Moments | None = None, seq_len: int | None = None,
                    token_collision: float | None = None) -> list[Component]:
        """The moment maps of stack ``stack`` at `default_inputs`: "enc" `encoder_chain`, "dec" `moment_chain` reading
        ``memory`` (the encoder's output moments)."""
        inputs = self.default_inputs(seq_len, token_collision)
        return (self.encoder_chain(*inputs) if stack == "enc" else self.moment_chain(*inputs, memory))[1]

    def encoder_chain(self, seq_len: int, token_collision: float) -> Chain:
        """Source embedding to the encoder's output (the memory), as moment maps."""
        return _join(self.input_chain(token_collision), self.encoder.moment_chain(seq_len))

    def moment_chain(self, seq_len: int, token_collision: float, memory: Moments | None = None) -> Chain:
        """The decoder from the target embedding (not recorded) to the logits; its cross-attention sites read
        a memory of ``seq_len`` tokens with moments ``memory`` (the output of `encoder_chain`)."""
        if memory is None:
            raise ValueError("the moment chain of an encoder-decoder is its decoder: give the memory moments "
                             "(the output of encoder_chain)")
        return _join(self.input_chain(token_collision, recorded=False),
                     self.decoder.moment_chain(seq_len, memory, seq_len), self.head_chain())


class ViT(nn.Module):
    """Vision transformer: images (B, C, H, W) -> class logits (B, n_classes) from the class token.

    Args:
        cfg: its `ModelConfig` (``arch="vit"``: ``image_size``, ``patch_size``, ``in_channels``, ``n_classes``);
            build it with `build_model`.

    Raises:
        NotImplementedError: (`moment_chain`) blocks with a final norm whose class token starts at another
            variance than the patch tokens (below).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = PatchEmbedding(cfg.image_size, cfg.patch_size, cfg.in_channels, cfg.d_model, cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.stack = Stack(cfg, "enc", cfg.n_layers, causal=False)
        self.head = tag_linear(nn.Linear(cfg.d_model, cfg.n_classes, bias=True), "head")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack(self.drop(self.embed(images)))[:, 0])

    def default_inputs(self, seq_len: int | None = None, token_collision: float | None = None) -> tuple[int, float]:
        """(0, 0.0): a ViT's token count is its patches' (`moment_chain`), and no two patches are one token."""
        return 0, 0.0

    def stack_chain(self, stack: str, memory: Moments | None = None, seq_len: int | None = None,
                    token_collision: float | None = None) -> list[Component]:
        """The moment maps of the model's one stack (`moment_chain`)."""
        return self.moment_chain()[1]

    def moment_chain(self, seq_len: int = 0, token_collision: float = 0.0, memory: Moments | None = None) -> Chain:
        """Patch embedding (N(0, 1) pixels) and dropout, the stack over T = 1 + patches tokens, then the head
        on the class token only (`ClassToken`); the token arguments (`default_inputs`) leave it unchanged.

        Refused (NotImplementedError) for blocks with a final norm (placements "pre", "out", "sandwich") whose
        class token starts at another variance than the patch tokens (every scheme but DSLM): the head's gradient
        lands on the class token alone, and the residual stream keeps that token's own variance σ², by which each
        norm on the stream (the Pre-LN ones, the final one) divides its gradient; the token-averaged maps see the
        mean variance instead, and miss the gradient (by how much: docs/moments.md §6). A Post-LN block
        renormalizes every token, so the mismatch ends at the first sublayer."""
        emb = self.embed.moment_map()
        cls, patch = emb.token_vars
        if self.stack.placement not in ("post", "none") and not math.isclose(cls, patch, rel_tol=1e-9):
            raise NotImplementedError(
                f"arch 'vit' with norm_placement {self.stack.placement!r} (a final norm) and a class token of variance "
                f"{cls:.3g} against {patch:.3g} for a "
                f"patch token (scheme {self.cfg.scheme!r}) has no exact moment map: the class token alone carries "
                "the head's gradient, and its norms scale it by its own 1/σ², which the token-averaged maps do not "
                "follow; equal token variances (scheme 'dslm') or Post-LN blocks are predicted")
        T = emb.n_patches + 1
        zero_bias(self.head, "ViT head")
        head = Linear(self.head.in_features, self.head.out_features, weight_var(self.head.weight, "ViT head"))
        return _join(([(0, "embed"), None], [emb, component_of(self.drop, "embedding dropout")]),
                     self.stack.moment_chain(T), ([None, None], [ClassToken(T), head]))


def _join(*chains: Chain) -> Chain:
    return [lab for labels, _ in chains for lab in labels], [c for _, chain in chains for c in chain]
