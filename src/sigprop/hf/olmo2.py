"""OLMo 2 family (``olmo2``): the norm on each branch's output, and qk-norm over the whole projection.

Block (OLMo 2, arXiv 2501.00656), placement "out":

    x ← x + N_a(W_O attn(x));  x ← x + N_m(W_d(φ(W_g x) ⊙ W_u x));  final ``norm``,

N an RMSNorm over the width d. Its q_norm and k_norm sit on the projections before they are split into heads: one
RMSNorm over all H·d_k query coordinates (H_kv·d_k key coordinates), so each head is divided by a length it shares
with the other heads, q̂_h = g √(H d_k) q_h/|q|, and the per-head norm's map does not apply. The attention map is
`RopeAttention` with ``qk_span`` = (H d_k, H_kv d_k): it samples the whole projection of the sampled head's tokens
and normalizes it as the module does (exact, as its per-head form).

Moment maps: a branch-output norm is its map on the branch's output moments (variance 1, the correlation its mean
cosine; backward divided by the branch's variance), exact as for a norm on the stream (`sigprop.nn.Sublayer`,
placement "out"). The schemes whose rules hold under "out": ``depth_mup`` and ``completep`` (the branch multiplier
after the norm) and ``dslm``, whose V/O and FFN stds hold the branch before its output norm (W_O's and W_down's
output, read on the raw stream) at unit variance, so that norm is an identity in the mean and its backward leaves
DSLM's gradient (`sigprop.schemes.dslm`). ``shaped`` is refused: removing the branch-output norms leaves the gated
MLP unnormalized, whose branch grows like |x|² (`sigprop.hf.llama`), and keeping them is no shaped block.
"""
from __future__ import annotations

from typing import ClassVar

from .llama import Llama


class Olmo2(Llama):
    model_types = ("olmo2",)
    placement = "out"
    site_norms: ClassVar[dict[str, tuple[str | None, str | None]]] = {
        "attn": (None, "post_attention_layernorm"), "mlp": (None, "post_feedforward_layernorm")}
    qk_norms = True
