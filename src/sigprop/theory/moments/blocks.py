"""Composition (``serial``) and the transformer blocks built from it; no formulas of their own.

Large-width DSLM limits, recovered by composition (μ = 0 input):
  ffn_block: σ'² = d_ff d σ₁² σ₂² E[φ²]/(1−p) (σ² = 1), r' = (1−p) κ(r), κ the normalized kernel
             E[φ(u)φ(v)]/E[φ²] (the second Linear turns the activation's mean into correlation);
  attention_block with L = math.inf: σ'² = d² σ_v² σ_o² (rσ² + s²β̄²/d)/(1−p) → d²σ_v²σ_o² r/(1−p),
             r' → 1 − p.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .attention import Attention
from .dropout import Dropout
from .linear import Linear
from .state import Component, Moments


@dataclass(frozen=True)
class Serial(Component):
    """Components applied in order; ``bwd`` re-runs the forward to give each component its input.

    Attributes:
        components: the maps, in order (`serial` builds it).
    """

    components: tuple[Component, ...]

    def trace(self, m_in: Moments, g_out: Moments | None = None) -> list[Moments]:
        """Moments at every point: [input, after c1, ..., output]; with ``g_out`` (the gradient at the
        output) the grad fields are filled by the backward pass, else left as propagated."""
        states = list(_forward_states(self, m_in))
        if g_out is None:
            return states
        out = [g_out]
        for c, m in zip(reversed(self.components), reversed(states[:-1])):
            out.append(c.bwd(m, out[-1]))
        return [Moments(s.mean, s.var, s.corr, g.grad_var, g.grad_corr) for s, g in zip(states, reversed(out))]

    def fwd(self, m: Moments) -> Moments:
        return self.trace(m)[-1]

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self.trace(m_in, g_out)[0]


def parts(c: Component) -> tuple[Component, ...]:
    """The components of a `Serial`, or ``(c,)`` for any other map."""
    return c.components if isinstance(c, Serial) else (c,)


@lru_cache(maxsize=8192)
def _forward_states(chain: Serial, m_in: Moments) -> tuple[Moments, ...]:
    """[input, after c1, ..., output]; cached: a Post-LN sublayer's backward re-reads its branch's forward."""
    states = [m_in]
    for c in chain.components:
        states.append(c.fwd(states[-1]))
    return tuple(states)


def serial(*components: Component) -> Serial:
    """Compose moment maps like stax.serial: serial(a, b).fwd(m) = b.fwd(a.fwd(m)).

    Args:
        *components: the maps, in the order they apply.

    Raises:
        ValueError: no component.
    """
    if not components:
        raise ValueError("serial needs at least one component")
    return Serial(tuple(components))


def ffn_block(d: int, d_ff: int, w1_var: float, w2_var: float, activation: Component, p: float = 0.0) -> Serial:
    """Linear d → d_ff, activation, Linear d_ff → d, Dropout(p).

    Args:
        d: the stream width.
        d_ff: the hidden width.
        w1_var: the first weight's variance.
        w2_var: the second weight's variance.
        activation: the activation's map (`ReLU`, `GeLU`, `ShapedReLU`, ...).
        p: the dropout rate.
    """
    return serial(Linear(d, d_ff, w1_var), activation, Linear(d_ff, d, w2_var), Dropout(p))


def attention_block(attention: Attention, p: float = 0.0) -> Serial:
    """QKV projections, attention, output projection (all in ``attention``), then Dropout(p)."""
    return serial(attention, Dropout(p))
