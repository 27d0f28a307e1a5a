"""Scaled residual add y = α x + β f(x) (λ/β in DeepScaleLM, λ/γ in the Shaped Transformer)."""
from __future__ import annotations

from dataclasses import dataclass

from .state import Component, Moments, ratio, replace


@dataclass(frozen=True)
class Residual:
    """y = ``alpha``·x + ``beta``·branch(x), with x and branch(x) uncorrelated.

    Forward:  μ' = αμ + βμ_f,  σ'² = α²σ² + β²σ_f²,  Cov' = α² rσ² + β² r_f σ_f²
    Backward: g_x = α g_y + β J_fᵀ g_y, so σ_g'² = α²σ_g² + β²σ_{g,f}² and
              Cov_g' = α² r_g σ_g² + β² r_{g,f} σ_{g,f}², (σ_{g,f}², r_{g,f}) = branch.bwd(x, g_y).
    The independence is exact when the branch ends in a zero-mean random linear map (every
    transformer sublayer: FFN output, attention output projection), which makes both
    E[x f(x)] and E[g_yᵀ J_f g_y] vanish; it is not for e.g. a bare LayerNorm branch.
    """

    alpha: float
    beta: float
    branch: Component

    def fwd(self, m: Moments) -> Moments:
        return self.combine(m, self.branch.fwd(m))

    def combine(self, m: Moments, f: Moments) -> Moments:
        """The forward sum for input moments ``m`` and branch output moments ``f``."""
        a2, b2 = self.alpha ** 2, self.beta ** 2
        var = a2 * m.var + b2 * f.var
        return replace(m, mean=self.alpha * m.mean + self.beta * f.mean, var=var,
                       corr=ratio(a2 * m.cov + b2 * f.cov, var))

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self.combine_bwd(m_in, g_out, self.branch.bwd(m_in, g_out))

    def combine_bwd(self, m_in: Moments, g_out: Moments, f: Moments) -> Moments:
        """The backward sum for output gradient ``g_out`` and the branch's input gradient moments ``f``."""
        a2, b2 = self.alpha ** 2, self.beta ** 2
        var = a2 * g_out.grad_var + b2 * f.grad_var
        return replace(m_in, grad_var=var, grad_corr=ratio(a2 * g_out.grad_cov + b2 * f.grad_cov, var))
