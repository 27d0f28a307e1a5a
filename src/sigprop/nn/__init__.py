"""Modules: attention (standard and shaped), shaped ReLU, norms, residual sublayers, embeddings."""
from .attention import Attention
from .block import Block, Sublayer
from .embedding import PatchEmbedding, TokenEmbedding
from .mlp import MLP, make_activation
from .norm import make_norm
from .residual import Residual
from .shaped_attention import ShapedAttention
from .shaped_relu import ShapedReLU

__all__ = ["Attention", "ShapedAttention", "ShapedReLU", "MLP", "make_activation", "make_norm",
           "Residual", "Sublayer", "Block", "TokenEmbedding", "PatchEmbedding"]
