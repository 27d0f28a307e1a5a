"""Post-LN sublayer y = N(α x + β f(x)) as one map: the norm sees a sum whose norm barely fluctuates.

`LayerNorm`/`RMSNorm` assume i.i.d. Gaussian input features and a gradient independent of the input
direction. Inside a Post-LN stack neither holds, and the O(1/d) errors compound over the 2N norms
(docs/moments.md measures the drift): x is the previous norm's output
(|Px|² = d exactly, already mean-free), and the incoming gradient is the input gradient of the next
Post-LN sublayer, which is mean-free up to its branch part and orthogonal to its input by scale
invariance (exactly, for a degree-1 homogeneous branch such as a bias-free ReLU MLP). With
K_ij = Pz_i·Pz_j/d, z = αx + βf, f = h W through a fresh Gaussian W (Wishart around its mean):

  E K_ii = α²σ_x²c_x + β²σ_f²c_f,  E K_ij = α²r_xσ_x²c_x + β²r_fσ_f²c_f   (c = 1, or 1 − 1/d if not yet centred)
  d Var K_ii        = n_x α⁴σ_x⁴      + 2β⁴σ_f⁴       + 4α²β²σ_x²σ_f²
  d Cov(K_ij, K_ii) = n_x r_x α⁴σ_x⁴  + 2β⁴r_fσ_f⁴    + 2α²β²σ_x²σ_f²(r_x + r_f)
  d Cov(K_ii, K_jj) = n_x r_x² α⁴σ_x⁴ + 2β⁴r_f²σ_f⁴   + 4α²β² r_x r_f σ_x²σ_f²
with n_x = 0 for a normalized x, 2 for Gaussian x, plus the branch's earlier stages (`hidden_fluctuation`):
a ReLU FFN's |h|² = Σ_k relu(u_k)² fluctuates by Var/E² = 5/d_ff, and two tokens' by 4(I₂₂(r) − ¼)/d_ff
(|f_i|², |f_j|²) and 4(I₃₁(r) − I₁₁(r)/2)/d_ff (f_i·f_j, |f_i|²), with the orthant moments of a unit
bivariate normal of correlation r = cos θ, s = sin θ (Stein's lemma, E[vF] = E∂_vF + rE∂_uF):
  I₁₁ = E relu(u)relu(v) = (s + (π − θ)r)/2π,  I₂₂ = ((π − θ)(1 + 2r²) + 3rs)/2π,
  I₃₁ = E relu(u)³relu(v) = 3r((π − θ) + rs)/2π + s³/π;
attention's value path has two Gaussian maps (W_v, then W_o): 2/d, 2r_f/d, 2r_f²/d once more. The delta method
on cos = K_ij/√(K_ii K_jj) and on 1/K_ii (v = Var K_ii/EK², c₂ = Cov(K_ii, K_jj)/EK², ρ = EK_ij/EK) gives
  r_y = ρ(1 + ¾v + ¼c₂) − Cov(K_ij, K_ii)/EK²,
  σ_gz² = σ_gy² (1 + v)(1 − S/d)/EK,   Cov_gz = r_gy σ_gy² (1 + ¾v + ¼c₂)(1 − S(1 − ρ²/2)/d)/EK,
S = d·(fraction of the incoming gradient along the mean and the token's own direction): 2 (centred; 1 for
RMSNorm) for the last sublayer, whose gradient comes from the head; inside the stack the incoming
gradient is the next sublayer's input gradient α g_z' + β g_z' J_f'ᵀ, whose first part is mean-free and
whose branch part is not (an isotropic 1/d of it lies along the mean), so a centred norm loses
S = d·(1/d)·(branch part's share of the next input gradient) (`trace_bwd`; per position in `causal`).
Monte Carlo: an FFN sublayer under x ↦ LN(x + x W_v W_o) in tests/test_moments_postnorm.py, the depth-48
Post-LN decoder's gradient in docs/moments.md §6. For Gaussian x and S = 2 this is the `LayerNorm` map to O(1/d²)
(r(1 − (1−r²)/2d), (1 + 1/d)/σ²).
Not modelled: the own-direction part of S (an attention branch over several keys is not homogeneous, so
its input gradient keeps a component along x), and for Gaussian x with a homogeneous branch the coupling
|f|² ∝ |x|² of the stream and branch norms (family `postnorm` of tests/moments_mc.py; in a model only the
first sublayer sees Gaussian x, and its branch is attention).

Radial constraint (`radial_factor`). g_z ⊥ z exactly (N(cz) = N(z)), so the gradient entering the
residual is not independent of its Jacobian J = αI + βJ_f: for a degree-1 homogeneous branch
(f(x) = x J_f, e.g. a bias-free ReLU FFN) z = x J, and g_z spread over the k − 1 directions ⊥ {1, ẑ}
(k = d − 1 centred, d for RMSNorm) gives E|g_z Jᵀ|² = |g_z|² (tr JᵀJ − |1̂J|² − |ẑJᵀ|²)/(k − 1), not the
independent-gradient |g_z|² tr JᵀJ/d: the direction removed is the one J stretches most. Two tokens whose
gradients lie ⊥ ẑ_i and ⊥ ẑ_j (cos ρ) lose both directions: with ẑ_i JᵀJ ẑ_jᵀ ≈ ρ |ẑJᵀ|², the covariance
carries tr(Π_i JᵀJ Π_j)/(c² tr Π_iΠ_j) = 1 − δ(2 − ρ²)/(k − 2 + ρ²) (= the variance's at ρ = 1). With
b = E|f|²/|x|², η = E|f J_fᵀ|²/(b²|x|²) and the odd weight moments vanishing,
  E|zJᵀ|² = |x|² (α⁴ + 4α²β²b + β⁴b²η),  E|z|² = |x|² (α² + β²b) = |x|² tr JᵀJ/d,
so the sublayer's gradient variance carries 1 − δ/(k − 1),  δ = (2α²β²b + β⁴b²(η − 1))/(α² + β²b)².
η: 3 for a product of two square Gaussian maps (Fuss–Catalan; the value–output path of the first
causal token, which attends only to itself: `VO_KURTOSIS`), 2 + (2d + 5)/d_ff for a ReLU FFN d → d_ff → d
(E[relu(x·w) w] = σ₁²x/2 by Stein's lemma, and the Wishart moment E|hW₂W₂ᵀ|² = σ₂⁴ d|h|²(d + d_ff + 1)).
In a standard Post-LN stack (α = β = 1, δ ≈ 1.2 attention, 0.46 FFN) this is the O(1/d)-per-sublayer
excess a first-token gradient otherwise accumulates (its size: docs/moments.md §3, Post-LN sublayer). Monte
Carlo: tests/test_moments_postnorm.py and tests/test_moments_causal.py (d = 32); the FFN at d = 32, 64, 128:
docs/moments.md §5.

Coherent value path (`coherent_radial`). Attention over many keys is not homogeneous token by token, but
on rank-collapsed tokens (ρ → 1, near-uniform rows) the value path acts on the tokens' common mode as the
linear map A = W_vW_o: z_i ≈ c(αI + βA) + (own part), and every g_z,i is ⊥ ẑ_i ≈ ẑ. Splitting the branch's
backward into the value path's coherent part Mᵀ G_z M (M the attention rows) and the residual–value cross
term (zero for independent gradients), the constraint gives
  E|g Aᵀ|² = a|g|² (1 − δ_V/(k − 1)),  δ_V = |ẑAᵀ|²/a − 1 = β²a(η − 1)/(α² + β²a),
  E[g_j A g_iᵀ] = −G_ji ẑAẑᵀ/(k − 1),  ẑAẑᵀ = αβa/(α² + β²a)                 (a = d²σ_v²σ_o², η = 3),
so Mᵀ G_z M carries 1 − δ_V/(k − 1) and the sublayer gains −αβκ(G_z M + (G_z M)ᵀ), κ = ẑAẑᵀ/(k − 1); on one
token (M = 1) the two add up to δ above. The per-position backward (`causal`) uses these matrices; the
exchangeable one subtracts (β²a δ_V/(k − 1) + 2αβκ)·M_z from the variance and the covariance (M_z = the
per-feature variance of the tokens' mean gradient, M = 11ᵀ/L), weighted by 1/(1 + d(1 − ρ)): the common
mode is coherent only once the tokens' own parts, 1 − ρ of the norm input, drop below O(1/d).
Monte Carlo: at d = 32, r = 0.99, tests/test_moments_postnorm.py; bidirectional, d = 64, L = 16, token
correlation r = 0.99 / 0.95 / 0.9: docs/moments.md §5. The per-position backward applies
it unweighted, on every causal Post-LN stack: its first-token part is exact, and on uncollapsed tokens (r = 0.3,
width 32) the sublayer's gradient is within 3 % + 4 s.e. of Monte Carlo at every position
(tests/test_moments_causal.py).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .attention import Attention
from .blocks import parts
from .dropout import Dropout
from .linear import Linear
from .pointwise import ReLU
from .residual import Residual
from .state import Component, Moments, check_positive, ratio, replace

VO_KURTOSIS = 3.0    # η of x W_v W_o (two square Gaussian maps): the first causal token's attention branch


def _active_parts(branch: Component) -> list[Component]:
    """The branch's maps without its identity dropouts (p = 0)."""
    return [c for c in parts(branch) if not (isinstance(c, Dropout) and c.p == 0)]


def homogeneous_kurtosis(branch: Component) -> float | None:
    """η = E|f J_fᵀ|²/(b²|x|²) of a degree-1 homogeneous ``branch`` f(x) = x J_f (module docstring): a ReLU FFN
    (Linear, ReLU, Linear, no dropout) gives 2 + (2d + 5)/d_ff; None for any other branch."""
    active = _active_parts(branch)
    if (len(active) == 3 and isinstance(active[0], Linear) and isinstance(active[1], ReLU)
            and isinstance(active[2], Linear)):
        return 2 + (2 * active[0].d_in + 5) / active[0].d_out
    return None


def trace_bwd(chain: list[Component], states: list[Moments], g_out: Moments) -> list[Moments]:
    """``states`` (the forward trace of ``chain``: input, then each output) with the gradient moments of the
    backward from ``g_out``, like `Serial.trace`, except that a centred `PostNormResidual` under another
    takes that one's non-mean-free share S = β'²·branch'/σ_gx'² (`PostNormResidual.bwd_parts`) as its
    ``upstream_align`` (module docstring)."""
    grads, share = [g_out], None
    for c, m in zip(reversed(chain), reversed(states[:-1])):
        if isinstance(c, PostNormResidual):
            if share is not None and c.centered:
                c = dataclasses.replace(c, upstream_align=share)
            g, share = c.bwd_parts(m, grads[-1])
        else:
            g, share = c.bwd(m, grads[-1]), None
        grads.append(g)
    return [replace(s, grad_var=g.grad_var, grad_corr=g.grad_corr) for s, g in zip(states, reversed(grads))]


def coherent_attention(branch: Component) -> Attention | None:
    """The branch's `Attention` if the branch is standard attention alone (no shaping, no dropout), else None:
    the branch whose value path acts coherently on collapsed tokens (module docstring)."""
    active = _active_parts(branch)
    if len(active) == 1 and isinstance(active[0], Attention) and not active[0].shaped and active[0].p == 0:
        return active[0]
    return None


def _orthant_moments(r: float) -> tuple[float, float, float]:
    """I₁₁, I₂₂, I₃₁ of a unit bivariate normal with correlation ``r`` (module docstring)."""
    r = max(-1.0, min(1.0, r))
    theta, s = math.acos(r), math.sqrt(max(0.0, 1 - r * r))
    return ((s + (math.pi - theta) * r) / (2 * math.pi),
            ((math.pi - theta) * (1 + 2 * r * r) + 3 * r * s) / (2 * math.pi),
            3 * r * ((math.pi - theta) + r * s) / (2 * math.pi) + s ** 3 / math.pi)


def hidden_fluctuation(branch: Component, d: int, r_in: float, r_f: float) -> tuple[float, float, float]:
    """Relative Var|f_i|², Cov(f_i·f_j, |f_i|²), Cov(|f_i|², |f_j|²) (over (E|f|²)²) that the branch's stages
    before its last Gaussian map add (module docstring): ReLU FFN (input corr ``r_in``), attention (output
    corr ``r_f``), else none."""
    first = parts(branch)[0]
    if isinstance(first, Attention):
        return 2 / d, 2 * r_f / d, 2 * r_f * r_f / d
    if homogeneous_kurtosis(branch) is None:
        return 0.0, 0.0, 0.0
    i11, i22, i31 = _orthant_moments(r_in)
    d_ff = first.d_out
    return 5 / d_ff, 4 * (i31 - i11 / 2) / d_ff, 4 * (i22 - 0.25) / d_ff


@dataclass(frozen=True)
class PostNormResidual(Component):
    """y = N(``alpha``·x + ``beta``·branch(x)), N a LayerNorm (``centered``) or RMSNorm over ``d`` features.

    ``normalized_input``: x is the output of a previous norm (norm fixed, mean-free); else i.i.d.
    Gaussian features. ``upstream_align``: S of the gradient arriving at y (2 — or 1 for RMSNorm — when
    the next map is a random linear head; the mean share of its branch part when it is another
    PostNormResidual, set by `trace_bwd`; 0 if unknown).
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
        rx = ratio(x.cov + mu2, x.var + mu2)
        hidden = hidden_fluctuation(self.branch, self.d, ratio(x.cov + x.mean ** 2, x.var + x.mean ** 2), f_corr)
        return self.norm_stats(x.var + mu2, rx, f_var, f_corr, hidden)

    def grad_gains(self, x: Moments, f_var: Any, f_corr: float) -> tuple[Any, Any]:
        """Factors of the gradient variance and covariance through the norm, stream ``x`` and branch
        (``f_var`` a float, or one variance per token), before the residual's own backward."""
        ek, rho, v, c2, _ = self._stats(x, f_var, f_corr)
        s = self.upstream_align / self.d
        return (1 + v) * (1 - s) / ek, (1 + 0.75 * v + 0.25 * c2) * (1 - s * (1 - rho * rho / 2)) / ek

    def radial_factor(self, x: Moments, f_var: Any, f_corr: float, kurtosis: float) -> tuple[Any, Any]:
        """(1 − δ/(k − 1), 1 − δ(2 − ρ²)/(k − 2 + ρ²)): the radial constraint's factors of the gradient
        variance and covariance (module docstring), for a homogeneous branch of kurtosis η = ``kurtosis`` and
        output (variance, corr) (``f_var``, ``f_corr``) on stream ``x``; ρ = the norm input's token corr."""
        a2, b2g = self.alpha ** 2, self.beta ** 2 * f_var / (x.var + x.mean ** 2)
        delta = (2 * a2 * b2g + b2g * b2g * (kurtosis - 1)) / (a2 + b2g) ** 2
        k, rho2 = self.d - (1 if self.centered else 0), self._stats(x, f_var, f_corr)[1] ** 2
        return 1 - delta / (k - 1), 1 - delta * (2 - rho2) / (k - 2 + rho2)

    def coherent_radial(self, att: Attention) -> tuple[float, float]:
        """(δ_V/(k − 1), κ) for an attention branch whose value path x ↦ x W_v W_o (gain a = ``att.vo_gain``,
        kurtosis η = `VO_KURTOSIS`) acts coherently on collapsed tokens (module docstring):
        δ_V = β²a(η − 1)/(α² + β²a) scales the value path's coherent part, κ = αβa/((α² + β²a)(k − 1)) the
        residual–value cross term."""
        gain = att.vo_gain
        a2, b2g = self.alpha ** 2, self.beta ** 2 * gain
        k1 = self.d - (2 if self.centered else 1)
        return b2g * (VO_KURTOSIS - 1) / ((a2 + b2g) * k1), self.alpha * self.beta * gain / ((a2 + b2g) * k1)

    def norm_stats(self, sx: Any, rx: float, sf: Any, rf: float, hidden: tuple[float, float, float] = (0.0, 0.0, 0.0)
                   ) -> tuple[Any, Any, Any, Any, Any]:
        """`_stats` from the stream's (variance, corr), the branch's, and the branch's `hidden_fluctuation`;
        elementwise over arrays of variances."""
        d, a2, b2 = self.d, self.alpha ** 2, self.beta ** 2
        cx = 1.0 if (self.normalized_input or not self.centered) else 1 - 1 / d
        cf = 1 - 1 / d if self.centered else 1.0
        nx = 0.0 if self.normalized_input else 2.0
        ek = a2 * sx * cx + b2 * sf * cf
        check_positive("variance of the post-norm input", float(np.min(ek)))
        ekij = a2 * rx * sx * cx + b2 * rf * sf * cf
        x4, f4, xf = a2 * a2 * sx * sx, b2 * b2 * sf * sf, a2 * b2 * sx * sf
        h_var, h_c1, h_c2 = hidden
        var = (nx * x4 + 2 * f4 + 4 * xf) / d + h_var * f4
        c1 = (nx * rx * x4 + 2 * rf * f4 + 2 * xf * (rx + rf)) / d + h_c1 * f4
        c2 = (nx * rx * rx * x4 + 2 * rf * rf * f4 + 4 * rx * rf * xf) / d + h_c2 * f4
        return ek, ekij / ek, var / ek ** 2, c2 / ek ** 2, c1 / ek ** 2

    def _sum(self, x: Moments) -> tuple[Residual, Moments, Moments]:
        res, f = Residual(self.alpha, self.beta, self.branch), self.branch.fwd(x)
        return res, res.combine(x, f), f

    def fwd(self, m: Moments) -> Moments:
        _, z, f = self._sum(m)
        _, rho, v, c2, c1 = self._stats(m, f.var, f.corr)
        return replace(z, mean=0.0, var=1.0, corr=max(-1.0, min(1.0, rho * (1 + 0.75 * v + 0.25 * c2) - c1)),
                       norm_disp=-2.0 / self.d, kurtosis=3.0)

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self.bwd_parts(m_in, g_out)[0]

    def norm_grad(self, m_in: Moments, g_out: Moments, f: Moments | None = None) -> tuple[float, float]:
        """(variance, covariance) of the gradient at the norm's input z, from ``g_out`` at y (`grad_gains`);
        ``f``: the branch output on ``m_in`` when already computed."""
        f = self.branch.fwd(m_in) if f is None else f
        on, off = self.grad_gains(m_in, f.var, f.corr)
        return g_out.grad_var * on, g_out.grad_cov * off

    def bwd_parts(self, m_in: Moments, g_out: Moments) -> tuple[Moments, float]:
        """`bwd`, and the branch part's share of the input gradient variance, β²·branch(g_z)/σ_gx² (the part
        that is not mean-free: `trace_bwd` makes it the S of the sublayer below)."""
        res, z, f = self._sum(m_in)
        var, cov = self.norm_grad(m_in, g_out, f)
        g_z = replace(z, grad_var=var, grad_corr=ratio(cov, var))
        g_f = self.branch.bwd(m_in, g_z)
        g_x, branch = res.combine_bwd(m_in, g_z, g_f), self.beta ** 2 * g_f.grad_var
        att = coherent_attention(self.branch)
        if att is not None and not att.causal:
            eps_v, kappa = self.coherent_radial(att)
            mean_mode = cov + (var - cov) / att.L                       # per-feature variance of the token-mean of g_z
            weight = 1 / (1 + self.d * (1 - self._stats(m_in, f.var, f.corr)[1]))    # collapsed: ρ → 1
            cut = weight * mean_mode * (self.beta ** 2 * att.vo_gain * eps_v + 2 * self.alpha * self.beta * kappa)
            var_x = g_x.grad_var - cut
            return replace(g_x, grad_var=var_x, grad_corr=ratio(g_x.grad_cov - cut, var_x)), ratio(branch, var_x)
        eta = homogeneous_kurtosis(self.branch)
        if eta is None:
            return g_x, ratio(branch, g_x.grad_var)
        on, off = self.radial_factor(m_in, f.var, f.corr, eta)
        var = g_x.grad_var * on
        return replace(g_x, grad_var=var, grad_corr=ratio(g_x.grad_cov * off, var)), ratio(branch, var)
