"""Post-LN transformer: x ← LN(x + f(x)); standard (Xavier-like) init.

Forward variance is 1 after every LN, but gradients grow geometrically toward the output
(each LN divides the backward signal by the pre-LN standard deviation √2 of x + f(x)).
"""
from .base import Scheme


class PostLN(Scheme):
    name = "postln"
    norm_placements = ("post",)
