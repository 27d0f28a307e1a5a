"""Qwen3 family (``qwen3``): LLaMA's block with qk-norm, an RMSNorm on each head's queries and keys.

Block (Qwen3 technical report, arXiv 2505.09388): q̂ = N_q(W_q x) and k̂ = N_k(W_k x) per head (RMSNorm over the
head's d_k coordinates, before RoPE, which keeps their norms), then LLaMA's Pre-RMSNorm attention and SwiGLU MLP:

    x ← x + W_O attn(N₁(x));  x ← x + W_d(φ(W_g N₂(x)) ⊙ W_u N₂(x));  final ``norm``.

Moment maps: LLaMA's (`sigprop.hf.llama`), the attention with qk-norm in d_k degrees of freedom
(`sigprop.theory.moments.qk_norm`; with RoPE `RopeAttention` samples the normalized queries and keys): the logits
read the projected tokens' cosines, so W_q's and W_k's stds leave the prediction and the norms' gains enter it.
Sliding-window layers (``use_sliding_window``) change no moment when the sequence fits in the window; a longer one
is refused by name. Scheme ``shaped`` drops the qk-norms with the attention's norm (shaped attention sets the logit
scale by its temperature).
"""
from __future__ import annotations

from .llama import Llama


class Qwen3(Llama):
    model_types = ("qwen3",)
    qk_norms = True
