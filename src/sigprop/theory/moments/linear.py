"""Linear map y = x W, W_ka ~ N(0, σ_w²) i.i.d., no bias (exact moments)."""
from __future__ import annotations

from dataclasses import dataclass

from .state import Component, Mixing, Moments, check_nonneg, check_size, norm_dispersion, ratio, replace


@dataclass(frozen=True)
class Linear(Component):
    """Fan-in ``d_in``, fan-out ``d_out``, weight variance ``weight_var``.

    Forward:  μ' = 0,  σ'² = d_in σ_w² (σ² + μ²),  Cov' = d_in σ_w² (rσ² + μ²),
              so r' = (rσ² + μ²)/(σ² + μ²): a nonzero input mean becomes a per-feature
              offset shared by all tokens, i.e. correlation.
    Backward: σ_g'² = d_out σ_w² σ_g²,  r_g' = r_g.
    Exact for Gaussian weights independent of the input (the authors' formulas, which
    are right). Norm dispersion (`state`): given x, y's features are i.i.d. Gaussian of variance σ_w²|x|², so
    |y|² = σ_w²|x|² χ²_{d_out}: κ' = 3 and the scale varies as |x|², e' = R_x(1 + 2/d_out), R_x = e + (κ − 1)/d_in.
    """

    d_in: int
    d_out: int
    weight_var: float

    def __post_init__(self) -> None:
        check_size("d_in", self.d_in)
        check_size("d_out", self.d_out)
        check_nonneg("weight_var", self.weight_var)

    def fwd(self, m: Moments) -> Moments:
        gain = self.d_in * self.weight_var
        second = m.var + m.mean ** 2
        return replace(m, mean=0.0, var=gain * second, corr=ratio(m.cov + m.mean ** 2, second),
                       norm_disp=norm_dispersion(m, self.d_in) * (1 + 2 / self.d_out), kurtosis=3.0)

    def token_mixing(self) -> Mixing:
        return Mixing.AFFINE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=self.d_out * self.weight_var * g_out.grad_var, grad_corr=g_out.grad_corr)
