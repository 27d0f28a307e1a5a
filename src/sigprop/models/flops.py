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
from .transformer import DecoderLM, EncoderMLM


def train_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """FLOPs of one forward and backward pass per token of ``model`` (a sigprop decoder or encoder; it may live
    on the meta device) on sequences of ``seq_len`` tokens: 6 · Σ_matmuls n_in·n_out + 12 · T · Σ_attention d."""
    if not isinstance(model, (DecoderLM, EncoderMLM)):
        raise NotImplementedError(f"train_flops_per_token counts decoders and encoders, not {type(model).__name__}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    table = model.embed.tok
    products = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    products += table.num_embeddings * table.embedding_dim
    widths = sum(m.d_model for m in model.modules() if isinstance(m, (Attention, ShapedAttention)))
    return float(6 * products + 12 * seq_len * widths)
