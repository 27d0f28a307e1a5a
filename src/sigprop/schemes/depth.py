"""The depth α-family on Pre-LN: residual branch multiplier (L₀/L)^α, with its Adam rules.

x ← x + (L₀/L)^α f(LN(x)) at every sublayer, L = blocks in the stack, L₀ = ``base_depth``
(the model equals Pre-LN at L = L₀). Hidden weights (Q, K, V, O, FFN) and the norm gains and
biases inside the blocks train with Adam learning rate η·(L/L₀)^{α−1} and ε·(L/L₀)^{−α};
embeddings, the final norm and readouts keep η and ε (rules of Dey et al., "CompleteP",
arXiv 2505.01618, Table 1, summarising Yang et al., "Tensor Programs VI", ICLR 2024,
arXiv 2310.02244, and Bordelon et al., ICLR 2024, arXiv 2309.16620). The init is Pre-LN's.

  α = ½  depth-μP (Yang et al. TP-VI; Bordelon et al.)     scheme "depth_mup"
  α = 1  CompleteP (Dey et al.)                             scheme "completep"

Placements: "pre" (the default), and "out" and "sandwich" (a norm on each branch's output, `sigprop.nn.block`):
the multiplier stays on the branch, after its last norm, so the branch sum still has variance
Σ (L₀/L)^{2α}·σ²_f with σ²_f = 1 exactly.

Invariant: after an Adam step every branch moves its output by ~η_L (each weight entry moves by
its learning rate), so the stream at the last block moves by ~L·(L₀/L)^α·η(L/L₀)^{α−1} = L₀·η:
the change of the features is depth-independent (checked by tests/test_coord_check.py), while
the branch sum at init has variance ≤ L₀^{2α}L^{1−2α}, bounded for α ≥ ½. ε follows the
gradient of a branch weight, which carries the branch multiplier. Combined with
``parametrization="mup"`` the width multipliers of `sigprop.schemes.mup` apply on top.
"""
from __future__ import annotations

from typing import Any, ClassVar

from .base import OptimRule, ParamInfo, Scheme, Site, stack_layers
from .mup import HIDDEN


def depth_ratio(cfg: Any, stack: str) -> float:
    """L/L₀ for ``stack``."""
    return stack_layers(cfg, stack) / cfg.base_depth


class AlphaScheme(Scheme):
    """Pre-LN with branch multiplier (L₀/L)^α; subclasses fix α."""

    norm_placements = ("pre", "out", "sandwich")
    alpha: ClassVar[float]

    def residual(self, cfg: Any, site: Site) -> tuple[float, float]:
        return 1.0, depth_ratio(cfg, site.stack) ** -self.alpha

    def optim(self, cfg: Any, p: ParamInfo) -> OptimRule:
        rule = super().optim(cfg, p)
        if p.stack is None or p.role not in HIDDEN + ("norm", "bias"):
            return rule
        r = depth_ratio(cfg, p.stack)
        return rule * OptimRule(lr=r ** (self.alpha - 1), eps=r ** -self.alpha)


class DepthMuP(AlphaScheme):
    name = "depth_mup"
    alpha = 0.5


class CompleteP(AlphaScheme):
    name = "completep"
    alpha = 1.0
