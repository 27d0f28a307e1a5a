"""Vanilla transformer without LayerNorm: x ← x + f(x), plain softmax attention, standard init.

The baseline of the Shaped Transformer's Fig. 1: the token correlation goes to 1 with depth
(rank collapse) because Softmax ≈ 11ᵀ/m at init averages all tokens together.
"""
from .base import Scheme


class Vanilla(Scheme):
    name = "vanilla"
    norm_placements = ("none",)
