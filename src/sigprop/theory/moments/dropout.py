"""Inverted dropout y = x·b/(1−p), b ~ Bernoulli(1−p) i.i.d. per entry (exact moments)."""
from __future__ import annotations

from dataclasses import dataclass

from .state import Component, Mixing, Moments, check_prob, ratio, replace


@dataclass(frozen=True)
class Dropout(Component):
    """Rate ``p`` in [0, 1).

    Forward:  μ' = μ,  σ'² = (σ² + pμ²)/(1−p),  Cov' = rσ² (masks of different tokens are
              independent), so r' = (1−p) rσ²/(σ² + pμ²).
    Backward: σ_g'² = σ_g²/(1−p),  Cov_g' = r_g σ_g², so r_g' = (1−p) r_g.
    (The authors' formulas, which are right.) Feature kurtosis (`state`): κ' = κ/(1−p) (E b^k = 1 − p).
    """

    p: float

    def __post_init__(self) -> None:
        check_prob("p", self.p)

    def fwd(self, m: Moments) -> Moments:
        var = (m.var + self.p * m.mean ** 2) / (1 - self.p)
        return replace(m, var=var, corr=ratio(m.cov, var), kurtosis=m.kurtosis / (1 - self.p))

    def token_mixing(self) -> Mixing:
        """The identity at p = 0, else affine (masks of different positions are independent)."""
        return Mixing.IDENTITY if self.p == 0 else Mixing.AFFINE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=g_out.grad_var / (1 - self.p), grad_corr=(1 - self.p) * g_out.grad_corr)
