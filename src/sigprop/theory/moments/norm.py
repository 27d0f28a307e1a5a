"""LayerNorm and RMSNorm without affine parameters (ε → 0), exact for i.i.d. Gaussian features.

Both map a token to y = √d·u/|u|, with u = x − mean(x) (LayerNorm) or u = x (RMSNorm).
Two tokens' u live in k dimensions (k = d−1 for LayerNorm: centering projects out 1; k = d for
RMSNorm) with i.i.d. coordinate pairs of variance σ² and correlation r. The input mean μ
is removed exactly by LayerNorm (all features share it); RMSNorm needs μ = 0.

Forward: μ' = 0 and σ'² = 1 exactly (Σ_a y_a² = d); the inter-token correlation is the mean
cosine of two correlated Gaussian vectors (Hotelling's E[R], with k degrees of freedom):
    r' = E[c] = r · (2/k) (Γ((k+1)/2)/Γ(k/2))² · ₂F₁(½, ½; k/2 + 1; r²)
       = r (1 − (1 − r²)/(2k) + O(k⁻²)).
The authors' r(1 − 1/d) is wrong in the O(1/d) term: exact at r = ±1 it should be r, and the
correction is (1−r²)/(2k), not 1/d (e.g. r = 0.9, d = 8: authors 0.7875, exact 0.8868).

Backward: ∂y/∂x = (√d/|u|) Q with Q = P − ûûᵀ (P = I − 11ᵀ/d or I), rank k − 1, so
    σ_g'² = σ_g² (k − 1) E[1/|u|²] = σ_g² (k−1)/((k−2) σ²)            (exact; authors: σ_g²/σ²)
    Cov_g' = r_g σ_g² E[(k − 2 + c²)/(|u_i||u_j|)],  tr(Q_i Q_j) = k − 2 + c²,
with E[1/(|u||v|)] = (Γ((k−1)/2)/Γ(k/2))² ₂F₁(½, ½; k/2; r²) / (2σ²) (Kibble's bivariate
gamma moments) and E[c²] = 1 − ((k−1)/k)(1−r²) ₂F₁(1, 1; k/2 + 1; r²). Replacing
E[c²/(|u||v|)] by E[c²] E[1/(|u||v|)] is the only approximation, O(k⁻²) relative.

Beyond i.i.d. Gaussian features. A token inside a network is Gaussian only given the weights before it (an
attention output given its row's softmax weights and W_V W_O, an MLP output given W₁), so |u|² spreads more than
the χ²_k law: Var|u|²/(E|u|²)² = R = e + (κ − 1)/k (`state`) against 2/k. With the excess ε = R − 2/k taken as a
scale s² ~ Gamma(mean 1, variance ε) independent of the χ²_k direction part, E[1/s²] = 1/(1 − ε) and
E[1/s]² ≈ (1 − ε)^(−3/4) (to second order), so the backward's variance carries 1/(1 − ε) and its covariance
(1 − ε)^(−3/4) on top of the Gaussian values above (1 for Gaussian features): on scale-mixture tokens the
gradient variance within 1 % + 4 s.e. of Monte Carlo (tests/test_moments_dispersion.py). How far E[1/|u|²]·E|u|²
exceeds the χ² value inside Pre-LN models: docs/moments.md §5. The output has |y|² = d exactly: e = −2/d, κ = 3
(`state`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .state import Component, Mixing, Moments, check_positive, check_size, ratio, replace


def hyp2f1(a: float, b: float, c: float, z: float) -> float:
    """Gauss hypergeometric ₂F₁(a, b; c; z) for 0 <= z <= 1 (series; Gauss's theorem at z = 1). The first
    terms are summed one by one (with c = k/2 ≫ 1, as in the norms, a handful reach the tail bound), then in
    numpy blocks of doubling length (near z = 1 the series needs up to 10⁶ terms)."""
    if z >= 1.0:
        return math.exp(math.lgamma(c) + math.lgamma(c - a - b) - math.lgamma(c - a) - math.lgamma(c - b))
    total, term, start, block = 0.0, 1.0, 64, 128
    for n in range(start):
        ratio = (a + n) * (b + n) / ((c + n) * (n + 1)) * z
        total, term = total + term, term * ratio
        if ratio < 1 and abs(term) <= 1e-17 * (1 - z) * abs(total):
            return total
    while start < 10 ** 6:                       # blocks of terms until the tail bound term/(1−z) is negligible
        n = np.arange(start, start + block)
        ratios = (a + n) * (b + n) / ((c + n) * (n + 1)) * z
        terms = term * np.cumprod(np.concatenate([[1.0], ratios[:-1]]))
        total += float(terms.sum())
        term, start = float(terms[-1] * ratios[-1]), start + block
        if ratios[-1] < 1 and abs(term) <= 1e-17 * (1 - z) * abs(total):
            break
        block *= 2
    return total


def _gamma_ratio_sq(x: float, y: float) -> float:
    """(Γ(x)/Γ(y))²."""
    return math.exp(2 * (math.lgamma(x) - math.lgamma(y)))


@lru_cache(maxsize=4096)
def mean_cosine(k: int, r: float) -> float:
    """E[cos(u, v)] for u, v ∈ R^k with i.i.d. coordinate pairs of correlation r."""
    c = r * 2.0 / k * _gamma_ratio_sq((k + 1) / 2, k / 2) * hyp2f1(0.5, 0.5, k / 2 + 1, r * r)
    return max(-1.0, min(1.0, c))                   # round-off near |r| = 1


def _normalize(m: Moments, k: int, d: int) -> Moments:
    return replace(m, mean=0.0, var=1.0, corr=mean_cosine(k, m.corr), norm_disp=-2.0 / d, kurtosis=3.0)


@lru_cache(maxsize=4096)
def _cross_factor(k: int, r: float) -> float:
    """E[(k − 2 + c²)/(|u_i||u_j|)]·σ² for unit-variance inputs (see the module docstring)."""
    inv_norms = _gamma_ratio_sq((k - 1) / 2, k / 2) * hyp2f1(0.5, 0.5, k / 2, r * r) / 2
    cos2 = 1 - (k - 1) / k * (1 - r * r) * hyp2f1(1.0, 1.0, k / 2 + 1, r * r)
    return (k - 2 + cos2) * inv_norms


def _normalize_bwd(m_in: Moments, g_out: Moments, k: int) -> Moments:
    excess = m_in.norm_disp + (m_in.kurtosis - 3) / k                # R − 2/k over the k directions; 0 if Gaussian
    if excess >= 0.5:
        raise NotImplementedError(f"a norm whose input's squared norm spreads {excess:.2f} beyond the χ² law: the "
                                  "scale-mixture gain 1/(1 − ε) is derived for a small excess ε (< 0.5)")
    var = (k - 1) / (k - 2) / (1 - excess)
    cov = g_out.grad_corr * _cross_factor(k, m_in.corr) * (1 - excess) ** -0.75
    return replace(m_in, grad_var=g_out.grad_var * var / m_in.var, grad_corr=ratio(cov, var))


@dataclass(frozen=True)
class LayerNorm(Component):
    """LayerNorm over ``d`` features (d >= 4), no affine, ε → 0 (relative effect ε/σ²)."""

    d: int

    def __post_init__(self) -> None:
        check_size("d", self.d, minimum=4)

    def fwd(self, m: Moments) -> Moments:
        check_positive("var (input of LayerNorm)", m.var)
        return _normalize(m, self.d - 1, self.d)

    def token_mixing(self) -> Mixing:
        return Mixing.SCALE_FREE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        check_positive("var (input of LayerNorm)", m_in.var)
        return _normalize_bwd(m_in, g_out, self.d - 1)


@dataclass(frozen=True)
class RMSNorm(Component):
    """RMSNorm over ``d`` features (d >= 3), no affine, ε → 0; zero-mean input only."""

    d: int

    def __post_init__(self) -> None:
        check_size("d", self.d, minimum=3)

    def _check(self, m: Moments) -> None:
        check_positive("var (input of RMSNorm)", m.var)
        if m.mean != 0:
            raise NotImplementedError(f"RMSNorm moments are derived for zero-mean input only (got mean={m.mean})")

    def fwd(self, m: Moments) -> Moments:
        self._check(m)
        return _normalize(m, self.d, self.d)

    def token_mixing(self) -> Mixing:
        return Mixing.SCALE_FREE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        self._check(m_in)
        return _normalize_bwd(m_in, g_out, self.d)
