"""Training FLOPs per token of a sigprop token model, read off its modules (Kaplan et al. 2020, "Scaling Laws
for Neural Language Models", §2.1).

A product x W with W of shape (n_in, n_out) costs 2·n_in·n_out FLOPs per token forward and twice that
backward (the gradients of x and of W): 6·n_in·n_out. Every ``nn.Linear`` of the model is one such product
for every token, and so is the tied output head (the token table, V × d). Attention adds, per attention
sublayer and token, the products Q Kᵀ and A V over the T keys: 2·T·d each forward (d = the sublayer's width,
heads × head width), 12·T·d forward and backward. The softmax kernels compute every (query, key) pair and
mask the causal ones, so T counts every key. Norms, activations, softmax and residual adds are O(d) per token
and left out, as in Kaplan et al.
"""
from __future__ import annotations

from torch import nn

from ..nn.attention import Attention
from ..nn.shaped_attention import ShapedAttention
from .transformer import ViT, _TiedLM


def train_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """FLOPs of one forward and backward pass per token of ``model`` (any sigprop model; it may live on the meta
    device) on sequences of ``seq_len`` tokens: 6 · Σ_matmuls n_in·n_out + 12 · T · Σ_attention d. An
    encoder–decoder counts each stack's tokens, both ``seq_len`` long (its cross-attention reads T keys too);
    a ViT's T tokens are its patches and the class token: its patch projection runs on T − 1 of them (and needs
    no input gradient: 4 FLOPs per product, not 6) and its head on one, which the per-token figure spreads over
    the T."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    share = {}                                             # Linear -> the share of the T tokens it runs on
    if isinstance(model, ViT):
        share = {model.embed.proj: (seq_len - 1) / seq_len * 4 / 6, model.head: 1 / seq_len}
    elif not isinstance(model, _TiedLM):
        raise NotImplementedError(f"train_flops_per_token counts sigprop models, not {type(model).__name__}")
    products = sum(m.in_features * m.out_features * share.get(m, 1.0) for m in model.modules()
                   if isinstance(m, nn.Linear))
    if isinstance(model, _TiedLM):
        products += model.embed.tok.num_embeddings * model.embed.tok.embedding_dim
    widths = sum(m.d_model for m in model.modules() if isinstance(m, (Attention, ShapedAttention)))
    return float(6 * products + 12 * seq_len * widths)
