"""Scaled residual add y = α x + β f(x) (λ/β in DeepScaleLM, λ/γ in the Shaped Transformer)."""
from __future__ import annotations

from dataclasses import dataclass

from .state import Component, Moments, ratio, replace


@dataclass(frozen=True)
class Residual(Component):
    """y = ``alpha``·x + ``beta``·branch(x), with x and branch(x) uncorrelated.

    Forward:  μ' = αμ + βμ_f,  σ'² = α²σ² + β²σ_f²,  Cov' = α² rσ² + β² r_f σ_f²
    Backward: g_x = α g_y + β J_fᵀ g_y, so σ_g'² = α²σ_g² + β²σ_{g,f}² and
              Cov_g' = α² r_g σ_g² + β² r_{g,f} σ_{g,f}², (σ_{g,f}², r_{g,f}) = branch.bwd(x, g_y).
    The independence is exact when the branch ends in a zero-mean random linear map (every
    transformer sublayer: FFN output, attention output projection), which makes both
    E[x f(x)] and E[g_yᵀ J_f g_y] vanish; it is not for e.g. a bare LayerNorm branch.
    Norm dispersion (`state`), x and f independent with second moments s_x, s_f (S = α²s_x + β²s_f): the scale parts
    and the features' fourth cumulants add, e' = (α⁴s_x²e_x + β⁴s_f²e_f)/S², κ' − 3 = (α⁴s_x²(κ_x − 3) +
    β⁴s_f²(κ_f − 3))/S² (the cross term 2αβ x·f adds exactly what the Gaussian value 2/d needs).
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
        wx, wf = a2 * (m.var + m.mean ** 2), b2 * (f.var + f.mean ** 2)
        total = (wx + wf) ** 2
        wx, wf = (wx * wx / total, wf * wf / total) if total > 0 else (0.0, 0.0)
        return replace(m, mean=self.alpha * m.mean + self.beta * f.mean, var=var,
                       corr=ratio(a2 * m.cov + b2 * f.cov, var), norm_disp=wx * m.norm_disp + wf * f.norm_disp,
                       kurtosis=3.0 + wx * (m.kurtosis - 3) + wf * (f.kurtosis - 3))

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self.combine_bwd(m_in, g_out, self.branch.bwd(m_in, g_out))

    def combine_bwd(self, m_in: Moments, g_out: Moments, f: Moments) -> Moments:
        """The backward sum for output gradient ``g_out`` and the branch's input gradient moments ``f``."""
        a2, b2 = self.alpha ** 2, self.beta ** 2
        var = a2 * g_out.grad_var + b2 * f.grad_var
        return replace(m_in, grad_var=var, grad_corr=ratio(a2 * g_out.grad_cov + b2 * f.grad_cov, var))
