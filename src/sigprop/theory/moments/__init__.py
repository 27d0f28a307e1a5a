"""Per-component moment maps (forward mean/variance/token correlation, backward gradient
variance/correlation), composed like neural-tangents' stax. Convention: `state` module docstring;
derivations and measured errors: docs/moments.md.

    from sigprop.theory.moments import Moments, Linear, ReLU, LayerNorm, Attention, Residual, serial
    block = serial(LayerNorm(d), Attention(d, h, L, 1/d, 1/d, 1/d, 1/d), Dropout(0.1))
    out = Residual(1.0, 1.0, block).fwd(Moments(mean=0.0, var=1.0, corr=0.2))
"""
from .attention import Attention
from .blocks import Serial, attention_block, ffn_block, serial
from .cross_attention import CrossAttention, MemoryView, QueryView
from .dropout import Dropout
from .embedding import Embedding, PatchEmbedding, zipf_collision_approx, zipf_collision_probability
from .gated import GatedMLP
from .linear import Linear
from .norm import LayerNorm, RMSNorm
from .pointwise import GeLU, PiecewiseLinear, ReLU, ShapedReLU, Smooth
from .postnorm import PostNormResidual
from .residual import Residual
from .rope import RopeAttention
from .softmax import Softmax
from .state import Component, Mixing, Moments

__all__ = [
    "Attention", "Component", "CrossAttention", "Dropout", "Embedding", "GatedMLP", "GeLU", "LayerNorm", "Linear",
    "MemoryView", "Mixing", "Moments", "PatchEmbedding", "PiecewiseLinear", "PostNormResidual", "QueryView",
    "RMSNorm", "ReLU", "Residual", "RopeAttention", "Serial", "ShapedReLU", "Smooth", "Softmax",
    "attention_block", "ffn_block", "serial", "zipf_collision_approx", "zipf_collision_probability",
]
