"""Analytic checks of the moment maps: special cases, limits, helper functions, validation, composition."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch

from helpers import block_series_hyp2f1
from sigprop.theory.kernels import gaussian_kernel, gaussian_moment, relu_kernel, shaped_relu_nu
from sigprop.theory.moments import (
    Attention,
    Dropout,
    Embedding,
    GeLU,
    LayerNorm,
    Linear,
    Moments,
    ReLU,
    Residual,
    RMSNorm,
    ShapedReLU,
    Softmax,
    attention_block,
    ffn_block,
    serial,
    zipf_collision_approx,
    zipf_collision_probability,
)
from sigprop.theory.moments.attention import gamma_nodes
from sigprop.theory.moments.norm import hyp2f1, mean_cosine
from sigprop.theory.moments.pointwise import orthant
from sigprop.theory.moments.softmax import pair_functionals, row_functionals

M = Moments(0.0, 1.0, 0.3)


def test_moments_validation_names_the_field() -> None:
    for kwargs, name in [({"var": -1.0}, "var"), ({"corr": 1.5}, "corr"), ({"grad_var": -0.1}, "grad_var"),
                         ({"grad_corr": -2.0}, "grad_corr")]:
        with pytest.raises(ValueError, match=name):
            Moments(**{"mean": 0.0, "var": 1.0, "corr": 0.0, **kwargs})


@pytest.mark.parametrize("make, name", [
    (lambda: Linear(0, 4, 1.0), "d_in"), (lambda: Linear(4, 4, -1.0), "weight_var"), (lambda: Dropout(1.0), "p"),
    (lambda: Dropout(-0.1), "p"), (lambda: LayerNorm(3), "d"), (lambda: Softmax(1), "L"),
    (lambda: Attention(10, 3, 8, 1, 1, 1, 1), "divisible"), (lambda: Attention(8, 2, 8, 1, 1, 1, 1, tau0=0), "tau0"),
    (lambda: ShapedReLU(0), "width"), (lambda: Embedding(1.0, (1.5,)), "collisions"), (lambda: serial(), "serial"),
])
def test_invalid_sizes_raise_value_error(make, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        make()


@pytest.mark.parametrize("call, what", [
    (lambda: GeLU().fwd(Moments(0.5, 1.0, 0.0)), "zero-mean"),
    (lambda: RMSNorm(16).fwd(Moments(0.5, 1.0, 0.0)), "zero-mean"),
    (lambda: Attention(16, 2, 8, 1, 1, 1, 1).fwd(Moments(0.0, 1.0, -0.1)), "corr >= 0"),
    (lambda: Attention(16, 2, math.inf, 1, 1, 1, 1).bwd(M, M), "L → ∞"),
    (lambda: Attention(16, 2, math.inf, 1, 1, 1, 1, causal=True).fwd(M), "causal"),
])
def test_missing_theory_is_loud(call, what: str) -> None:
    with pytest.raises(NotImplementedError, match=what):
        call()


def test_relu_zero_mean_is_the_authors_closed_form() -> None:
    for r in (-0.7, 0.0, 0.4, 0.99):
        out = ReLU().fwd(Moments(0.0, 2.0, r))
        assert out.mean == pytest.approx(math.sqrt(2.0) / math.sqrt(2 * math.pi))
        assert out.var == pytest.approx(2.0 * (math.pi - 1) / (2 * math.pi))
        assert out.corr == pytest.approx((math.pi * r + math.sqrt(1 - r * r) - r * math.acos(r) - 1) / (math.pi - 1))
        assert (out.cov + out.mean ** 2) / (out.var + out.mean ** 2) == pytest.approx(relu_kernel(r))
        g = ReLU().bwd(Moments(0.0, 2.0, r), Moments(0.0, 1.0, 0.0, 3.0, 0.5))
        assert g.grad_var == pytest.approx(1.5)
        assert g.grad_cov == pytest.approx(0.5 * 3.0 * (0.25 + math.asin(r) / (2 * math.pi)))


def test_orthant_and_hypergeometric_against_scipy() -> None:
    for a, r in [(0.0, 0.3), (1.2, -0.8), (-0.7, 0.95), (2.0, 0.5)]:
        ref = scipy.stats.multivariate_normal([0, 0], [[1, r], [r, 1]]).cdf([a, a])
        assert orthant(a, r) == pytest.approx(ref, abs=1e-7)
    for args in [(0.5, 0.5, 2.5, 0.81), (1.0, 1.0, 5.0, 0.25), (0.5, 0.5, 33.0, 0.99), (0.5, 0.5, 3.0, 1.0)]:
        assert hyp2f1(*args) == pytest.approx(scipy.special.hyp2f1(*args), rel=1e-9)


def test_hypergeometric_term_by_term_start_is_the_block_series() -> None:
    """`hyp2f1` sums its first 64 terms one by one and may stop at any of them: the all-block series to 1e-13, from
    a few terms (c = k/2 ≫ 1, the norms' case) to the 10⁶-term cap near z = 1 (small c)."""
    for a, b, c in [(0.5, 0.5, 128.5), (1.0, 1.0, 128.5), (0.5, 0.5, 2.5), (1.0, 1.0, 3.0), (0.5, 0.5, 4.0)]:
        for z in (0.0, 1e-6, 0.09, 0.5, 0.81, 0.99, 0.9999, 0.999999):
            assert hyp2f1(a, b, c, z) == pytest.approx(block_series_hyp2f1(a, b, c, z), rel=1e-13, abs=0), (c, z)


def test_gelu_closed_forms_match_quadrature() -> None:
    gelu = torch.nn.functional.gelu
    dgelu = lambda x: 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    for var, r in [(0.3, -0.4), (1.0, 0.5), (3.0, 0.9)]:
        m = Moments(0.0, var, r)
        out, g = GeLU().fwd(m), GeLU().bwd(m, Moments(0.0, 1.0, 0.0, 1.0, 1.0))
        assert out.mean == pytest.approx(gaussian_moment(gelu, var))
        assert out.var + out.mean ** 2 == pytest.approx(gaussian_moment(lambda x: gelu(x) ** 2, var))
        assert out.cov + out.mean ** 2 == pytest.approx(gaussian_kernel(gelu, r, var), rel=1e-6)
        assert g.grad_var == pytest.approx(gaussian_moment(lambda x: dgelu(x) ** 2, var))
        assert g.grad_cov == pytest.approx(gaussian_kernel(dgelu, r, var), rel=1e-6)


def test_shaped_relu_kernel_drift() -> None:
    """n (E[φ_s(u)φ_s(v)] − ρ) = c ν(ρ) exactly for unit Gaussians (kernels.shaped_relu_slopes)."""
    n = 64
    s_plus, s_minus = 1.0, 1.0 - 1 / math.sqrt(n)
    c = 2 / (s_plus ** 2 + s_minus ** 2)
    for rho in (-0.5, 0.2, 0.9):
        out = ShapedReLU(n).fwd(Moments(0.0, 1.0, rho))
        assert out.var + out.mean ** 2 == pytest.approx(1.0)
        assert n * (out.cov + out.mean ** 2 - rho) == pytest.approx(c * shaped_relu_nu(rho), rel=1e-9)


def test_layernorm_correlation_and_the_authors_form() -> None:
    assert mean_cosine(7, 0.9) == pytest.approx(0.8847, abs=1e-4)      # authors' r(1 − 1/d) at d = 8: 0.7875
    assert LayerNorm(8).fwd(Moments(3.0, 2.0, 0.9)).corr == pytest.approx(mean_cosine(7, 0.9))
    for k, r in [(15, 0.5), (255, 0.9)]:
        assert mean_cosine(k, r) == pytest.approx(r * (1 - (1 - r * r) / (2 * k)), rel=2 / k ** 2)
    assert mean_cosine(63, 1.0) == pytest.approx(1.0)
    g = LayerNorm(64).bwd(Moments(0.0, 2.0, 0.3), Moments(0.0, 1.0, 0.0, 1.0, 0.0))
    assert g.grad_var == pytest.approx(62 / 61 / 2.0)


def test_dropout_and_linear_exact_forms() -> None:
    out = Dropout(0.2).fwd(Moments(1.0, 2.0, 0.5))
    assert (out.mean, out.var, out.cov) == pytest.approx((1.0, (2.0 + 0.2) / 0.8, 1.0))
    out = Linear(10, 5, 0.3).fwd(Moments(1.0, 2.0, 0.5))
    assert (out.mean, out.var, out.cov) == pytest.approx((0.0, 3 * 3.0, 3 * 2.0))
    g = Linear(10, 5, 0.3).bwd(M, Moments(0.0, 1.0, 0.0, 2.0, 0.4))
    assert (g.grad_var, g.grad_corr) == pytest.approx((3.0, 0.4))


def test_softmax_functionals_against_direct_sampling() -> None:
    gen = torch.Generator().manual_seed(0)
    beta2, rho, n = 1.5, 0.6, 8
    z = torch.randn(400_000, n, generator=gen, dtype=torch.float64)
    w = torch.randn(400_000, n, generator=gen, dtype=torch.float64)
    zp = rho * z + math.sqrt(1 - rho * rho) * w
    s, sp = torch.softmax(math.sqrt(beta2) * z, 1), torch.softmax(math.sqrt(beta2) * zp, 1)
    q_z = s * (z - (s * z).sum(1, keepdim=True))
    mc = {"F2": (s ** 2).sum(1), "B": (s ** 2 * (1 - 2 * s + (s ** 2).sum(1, keepdim=True))).sum(1),
          "Z1": (s * z).sum(1) ** 2, "Z2": (s ** 2 * z ** 2).sum(1), "Bz": (q_z ** 2).sum(1),
          "K1": (s * sp).sum(1), "K2": (s * z).sum(1) * (sp * z).sum(1) + (s * w).sum(1) * (sp * w).sum(1),
          "CK": (s * sp).sum(1) - (s ** 2 * sp).sum(1) - (s * sp ** 2).sum(1) + (s * sp).sum(1) ** 2}
    theory = {**{k: float(v[0]) for k, v in row_functionals(beta2, np.array([n])).items()},
              **pair_functionals(beta2, rho, np.array([[n, n]]))}
    for key, samples in mc.items():
        se = float(samples.std()) / math.sqrt(len(samples))
        assert abs(theory[key] - float(samples.mean())) < 4 * se + 1e-6, key


def test_gamma_nodes_moments() -> None:
    x, w = gamma_nodes(0.1, 6)
    assert (w @ x, w @ x ** 2 - 1, w @ x ** 3) == pytest.approx((1.0, 0.1, 1.1 * 1.2))


def test_attention_large_l_limit_and_dslm_constants() -> None:
    """L → ∞: d²σ_v²σ_o²(r + (1−r)²/d)/(1−p) and r' → 1−p, the authors' DSLM limit up to O(1/d)."""
    d, p, r, sv = 512, 0.1, 0.2, 0.05
    block = attention_block(Attention(d, 8, math.inf, 1 / d, 1 / d, sv, sv), p)
    out = block.fwd(Moments(0.0, 1.0, r))
    assert out.var == pytest.approx(d * d * sv * sv * (r + (1 - r) ** 2 / d) / (1 - p))
    assert out.var == pytest.approx(d * d * sv * sv * r / (1 - p), rel=(1 - r) ** 2 / (r * d) * 1.01)
    assert out.corr == pytest.approx(1 - p, rel=0.01)
    finite = Attention(64, 4, 2048, 1 / 64, 1 / 64, 1 / 64, 1 / 64).fwd(Moments(0.0, 1.0, 0.3))
    limit = Attention(64, 4, math.inf, 1 / 64, 1 / 64, 1 / 64, 1 / 64).fwd(Moments(0.0, 1.0, 0.3))
    assert finite.var == pytest.approx(limit.var, rel=0.01)
    assert finite.corr == pytest.approx(limit.corr, rel=0.01)


def test_ffn_block_dslm_constants() -> None:
    """σ'² = d_ff d σ₁²σ₂² E[φ²]/(1−p) and r' = (1−p) κ(r) (ReLU: κ = relu_kernel)."""
    d, d_ff, p, s1, s2 = 256, 1024, 0.1, 0.003, 0.002
    out = ffn_block(d, d_ff, s1, s2, ReLU(), p).fwd(Moments(0.0, 1.0, 0.4))
    assert out.var == pytest.approx(d_ff * d * s1 * s2 * 0.5 / (1 - p))
    assert out.corr == pytest.approx((1 - p) * relu_kernel(0.4))


def test_serial_and_residual_compose() -> None:
    a, b = Linear(8, 16, 0.2), ReLU()
    m, g = Moments(0.3, 1.2, 0.4), Moments(0.0, 1.0, 0.0, 2.0, 0.3)
    chain = serial(a, b)
    assert chain.fwd(m) == b.fwd(a.fwd(m))
    assert chain.bwd(m, g) == a.bwd(m, b.bwd(a.fwd(m), g))
    states = chain.trace(m, g)
    assert len(states) == 3 and states[-1].grad_var == 2.0 and states[0].grad_var == chain.bwd(m, g).grad_var
    res = Residual(0.8, 0.6, chain).fwd(m)
    f = chain.fwd(m)
    assert res.var == pytest.approx(0.64 * m.var + 0.36 * f.var)
    assert res.mean == pytest.approx(0.8 * m.mean + 0.6 * f.mean)


def test_zipf_collision() -> None:
    """P(two Zipf(1) tokens of a v-word vocabulary coincide) = H_v^(2) / H_v², the generalized harmonic
    numbers in closed form (H_v = ψ(v+1) + γ_E, H_v^(2) = π²/6 − ψ'(v+1)), and by sampling token pairs."""
    v = 1000
    h1 = scipy.special.digamma(v + 1) + np.euler_gamma
    h2 = math.pi ** 2 / 6 - scipy.special.polygamma(1, v + 1)
    assert zipf_collision_probability(v) == pytest.approx(h2 / h1 ** 2, rel=1e-12)
    p = 1 / np.arange(1, v + 1)
    rng, n = np.random.default_rng(0), 400_000
    same = rng.choice(v, n, p=p / p.sum()) == rng.choice(v, n, p=p / p.sum())
    assert abs(same.mean() - zipf_collision_probability(v)) < 5 * same.std() / math.sqrt(n)
    assert zipf_collision_approx(v) == pytest.approx(zipf_collision_probability(v), rel=1e-3)
    bert = zipf_collision_approx(30522, euler=False) / zipf_collision_probability(30522)
    assert bert - 1 == pytest.approx(0.115, abs=0.005)
    emb = Embedding(0.3, (zipf_collision_probability(v), 0.0))
    out = emb.fwd(M)
    assert (out.var, out.corr) == pytest.approx((0.6, zipf_collision_probability(v) / 2))
