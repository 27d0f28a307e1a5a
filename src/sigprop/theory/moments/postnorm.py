"""Post-LN sublayer y = N(α x + β f(x)) as one map: the norm sees a sum whose norm barely fluctuates.

`LayerNorm`/`RMSNorm` assume i.i.d. Gaussian input features and a gradient independent of the input
direction. Inside a Post-LN stack neither holds, and the O(1/d) errors compound over the 2N norms
(at d = 128, N = 48 the gradient drifts 2× from the measured): x is the previous norm's output
(|Px|² = d exactly, already mean-free), and the incoming gradient is the input gradient of the next
Post-LN sublayer, which is mean-free up to its branch part and orthogonal to its input by scale
invariance (exactly, for a degree-1 homogeneous branch such as a bias-free ReLU MLP). With
K_ij = Pz_i·Pz_j/d, z = αx + βf, f = h W through a fresh Gaussian W (Wishart around its mean):

  E K_ii = α²σ_x²c_x + β²σ_f²c_f,  E K_ij = α²r_xσ_x²c_x + β²r_fσ_f²c_f   (c = 1, or 1 − 1/d if not yet centred)
  d Var K_ii        = n_x α⁴σ_x⁴      + 2β⁴σ_f⁴       + 4α²β²σ_x²σ_f²
  d Cov(K_ij, K_ii) = n_x r_x α⁴σ_x⁴  + 2β⁴r_fσ_f⁴    + 2α²β²σ_x²σ_f²(r_x + r_f)
  d Cov(K_ii, K_jj) = n_x r_x² α⁴σ_x⁴ + 2β⁴r_f²σ_f⁴   + 4α²β² r_x r_f σ_x²σ_f²
with n_x = 0 for a normalized x, 2 for Gaussian x. The delta method on cos = K_ij/√(K_ii K_jj) and on
1/K_ii (v = Var K_ii/EK², c₂ = Cov(K_ii, K_jj)/EK², ρ = EK_ij/EK) gives
  r_y = ρ(1 + ¾v + ¼c₂) − Cov(K_ij, K_ii)/EK²,
  σ_gz² = σ_gy² (1 + v)(1 − S/d)/EK,   Cov_gz = r_gy σ_gy² (1 + ¾v + ¼c₂)(1 − S(1 − ρ²/2)/d)/EK,
S = d·(fraction of the incoming gradient along the mean and the token's own direction): 0 inside the
stack, 2 (centred; 1 for RMSNorm) for the last sublayer, whose gradient comes from the head. For
Gaussian x and S = 2 this is the `LayerNorm` map to O(1/d²) (r(1 − (1−r²)/2d), (1 + 1/d)/σ²).
Not modelled: fluctuations inside the branch (|h|² varies, O(β⁴/d_ff)) and the attention branch's
departure from homogeneity (its input gradient keeps a small component along x).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .residual import Residual
from .state import Component, Moments, check_positive, ratio, replace


@dataclass(frozen=True)
class PostNormResidual:
    """y = N(``alpha``·x + ``beta``·branch(x)), N a LayerNorm (``centered``) or RMSNorm over ``d`` features.

    ``normalized_input``: x is the output of a previous norm (norm fixed, mean-free); else i.i.d.
    Gaussian features. ``upstream_align``: S of the gradient arriving at y (0 when the next map is
    another PostNormResidual, 2 — or 1 for RMSNorm — when it is a random linear head).
    """

    alpha: float
    beta: float
    branch: Component
    d: int
    centered: bool = True
    normalized_input: bool = True
    upstream_align: float = 0.0

    def _stats(self, x: Moments, f_var: Any, f_corr: float) -> tuple[Any, Any, Any, Any, Any]:
        """EK_ii, ρ, v, c₂ and Cov(K_ij, K_ii)/EK² of the norm's input (elementwise over an array of
        branch variances ``f_var``)."""
        mu2 = 0.0 if self.centered else x.mean ** 2       # centring removes the mean all features share
        return self.norm_stats(x.var + mu2, ratio(x.cov + mu2, x.var + mu2), f_var, f_corr)

    def grad_gains(self, x: Moments, f_var: Any, f_corr: float) -> tuple[Any, Any]:
        """Factors of the gradient variance and covariance through the norm, stream ``x`` and branch
        (``f_var`` a float, or one variance per token), before the residual's own backward."""
        ek, rho, v, c2, _ = self._stats(x, f_var, f_corr)
        s = self.upstream_align / self.d
        return (1 + v) * (1 - s) / ek, (1 + 0.75 * v + 0.25 * c2) * (1 - s * (1 - rho * rho / 2)) / ek

    def norm_stats(self, sx: Any, rx: float, sf: Any, rf: float) -> tuple[Any, Any, Any, Any, Any]:
        """`_stats` from the stream's (variance, corr) and the branch's; elementwise over arrays of variances."""
        d, a2, b2 = self.d, self.alpha ** 2, self.beta ** 2
        cx = 1.0 if (self.normalized_input or not self.centered) else 1 - 1 / d
        cf = 1 - 1 / d if self.centered else 1.0
        nx = 0.0 if self.normalized_input else 2.0
        ek = a2 * sx * cx + b2 * sf * cf
        check_positive("variance of the post-norm input", float(np.min(ek)))
        ekij = a2 * rx * sx * cx + b2 * rf * sf * cf
        x4, f4, xf = a2 * a2 * sx * sx, b2 * b2 * sf * sf, a2 * b2 * sx * sf
        var = (nx * x4 + 2 * f4 + 4 * xf) / d
        c1 = (nx * rx * x4 + 2 * rf * f4 + 2 * xf * (rx + rf)) / d
        c2 = (nx * rx * rx * x4 + 2 * rf * rf * f4 + 4 * rx * rf * xf) / d
        return ek, ekij / ek, var / ek ** 2, c2 / ek ** 2, c1 / ek ** 2

    def _sum(self, x: Moments) -> tuple[Residual, Moments, Moments]:
        res, f = Residual(self.alpha, self.beta, self.branch), self.branch.fwd(x)
        return res, res.combine(x, f), f

    def fwd(self, m: Moments) -> Moments:
        _, z, f = self._sum(m)
        _, rho, v, c2, c1 = self._stats(m, f.var, f.corr)
        return replace(z, mean=0.0, var=1.0, corr=max(-1.0, min(1.0, rho * (1 + 0.75 * v + 0.25 * c2) - c1)))

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        res, z, f = self._sum(m_in)
        on, off = self.grad_gains(m_in, f.var, f.corr)
        var, cov = g_out.grad_var * on, g_out.grad_cov * off
        g_z = replace(z, grad_var=var, grad_corr=ratio(cov, var))
        return res.bwd(m_in, g_z)
