"""Training FLOPs per token of a token model an adapter reads (sigprop's own, a `transformers` family), read off its
modules (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1).

A product x W with W of shape (n_in, n_out) costs 2·n_in·n_out FLOPs per token forward and twice that
backward (the gradients of x and of W): 6·n_in·n_out. Every ``nn.Linear`` of the model (and every transformers
``Conv1D``, GPT-2's) is one such product for every token, and so is sigprop's tied output head (the token table,
V × d; a transformers head is an ``nn.Linear``, tied or not). Attention adds, per attention sublayer and token,
the products Q Kᵀ and A V over the T keys: 2·T·d each forward (d = the sublayer's query width, heads × head width:
the fan-out of its ``q`` piece, `Adapter.pieces`), 12·T·d forward and backward. The softmax kernels compute every
(query, key) pair and mask the causal ones, so T counts every key. Norms, activations, rotary embeddings, softmax
and residual adds are O(d) per token and left out, as in Kaplan et al.
"""
from __future__ import annotations

from torch import nn

from .adapter import adapter_of
from .transformer import ViT, _TiedLM


def train_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """FLOPs of one forward and backward pass per token of ``model`` (a sigprop model or a `transformers` model of
    a supported family; it may live on the meta device) on sequences of ``seq_len`` tokens: 6 · Σ_matmuls
    n_in·n_out + 12 · T · Σ_attention d. An encoder–decoder counts each stack's tokens, both ``seq_len`` long (its
    cross-attention reads T keys too); a ViT's T tokens are its patches and the class token: its patch projection
    runs on T − 1 of them (and needs no input gradient: 4 FLOPs per product, not 6) and its head on one, which
    the per-token figure spreads over the T.

    Raises:
        ValueError: ``seq_len`` not a positive int.
        NotImplementedError: a model no adapter reads (`sigprop.models.adapter.adapter_of`).
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    try:
        adapter = adapter_of(model)
    except ValueError as e:
        raise NotImplementedError(f"train_flops_per_token counts the models an adapter reads: {e}") from None
    share = {}                                             # product -> the share of the T tokens it runs on
    if isinstance(model, ViT):
        share = {model.embed.proj: (seq_len - 1) / seq_len * 4 / 6, model.head: 1 / seq_len}
    products = sum(m.weight.numel() * share.get(m, 1.0) for m in model.modules()
                   if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")
    if isinstance(model, _TiedLM):
        products += model.embed.tok.num_embeddings * model.embed.tok.embedding_dim
    widths = sum(piece.shape[0] for piece in adapter.pieces(model) if piece.role == "q")
    return float(6 * products + 12 * seq_len * widths)
