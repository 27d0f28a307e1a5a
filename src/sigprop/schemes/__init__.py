"""Init and residual-scaling schemes, one file each, selected by ``ModelConfig.scheme``.

Adding a scheme: write ``schemes/<name>.py`` with a `Scheme` subclass and list it below.
"""
from ..fields import FieldError
from .admin import Admin
from .base import OptimRule, ParamInfo, Scheme, Site, initialize
from .deepnorm import DeepNorm
from .depth import CompleteP, DepthMuP
from .dslm import DSLM
from .gpt2 import GPT2
from .postln import PostLN
from .preln import PreLN
from .shaped import Shaped
from .vanilla import Vanilla

SCHEMES: dict[str, Scheme] = {s.name: s for s in (PreLN(), PostLN(), Vanilla(), Shaped(), DSLM(), DeepNorm(),
                                                 DepthMuP(), CompleteP(), GPT2(), Admin())}
"""``ModelConfig.scheme`` -> the registered `Scheme` instance (one per file of this package); `get_scheme` looks
names up here."""


def get_scheme(name: str) -> Scheme:
    """The registered scheme called ``name``.

    Raises:
        FieldError: no scheme of that name (the message lists them).
    """
    if name not in SCHEMES:
        raise FieldError(f"ModelConfig.scheme must be one of {tuple(SCHEMES)}, got {name!r}")
    return SCHEMES[name]


__all__ = ["SCHEMES", "get_scheme", "Scheme", "Site", "ParamInfo", "OptimRule", "initialize"]
