"""Shaped ReLU: normalization, slopes, and its kernel drift ν (checked against an exact kernel and MC)."""
import math

import pytest
import torch

from sigprop.nn import ShapedReLU
from sigprop.theory.kernels import relu_kernel, shaped_relu_nu


def exact_kernel(s_plus: float, s_minus: float, rho: float) -> float:
    """E[φ(u)φ(v)], φ(x) = s₊x⁺ + s₋x⁻ (x⁻ = min(x,0)), unit Gaussians with correlation ρ.

    E[u⁺v⁺] = E[u⁻v⁻] = (√(1−ρ²) + (π − arccos ρ)ρ)/(2π), E[u⁺v⁻] = −(√(1−ρ²) − ρ arccos ρ)/(2π).
    """
    same = (math.sqrt(1 - rho ** 2) + (math.pi - math.acos(rho)) * rho) / (2 * math.pi)
    cross = -(math.sqrt(1 - rho ** 2) - rho * math.acos(rho)) / (2 * math.pi)
    return (s_plus ** 2 + s_minus ** 2) * same + 2 * s_plus * s_minus * cross


def test_exact_kernel_matches_monte_carlo():
    g = torch.Generator().manual_seed(0)
    n_samples, rho = 2_000_000, 0.4
    u = torch.randn(n_samples, generator=g, dtype=torch.float64)
    v = rho * u + math.sqrt(1 - rho ** 2) * torch.randn(n_samples, generator=g, dtype=torch.float64)
    act = ShapedReLU(16, c_plus=0.5, c_minus=-2.0).double()
    prod = act(u) * act(v)
    c = 2 / (act.s_plus ** 2 + act.s_minus.item() ** 2)
    want = c * exact_kernel(act.s_plus, act.s_minus.item(), rho)
    assert abs(prod.mean().item() - want) < 5 * prod.std().item() / math.sqrt(n_samples)


def test_unit_second_moment():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1_000_000, generator=g, dtype=torch.float64)
    y2 = ShapedReLU(64).double()(x) ** 2
    assert abs(y2.mean().item() - 1) < 5 * y2.std().item() / 1000


@pytest.mark.parametrize("rho", [-0.9, -0.3, 0.0, 0.5, 0.95])
def test_nu_is_the_width_limit_of_the_kernel(rho):
    """n·(c·K_n(ρ) − ρ) → ν(ρ) with error O(1/√n): check convergence, sign and ν(1) = 0."""
    c_p, c_m = 0.0, -1.0
    errs = []
    for n in (10 ** 4, 10 ** 6):
        sp, sm = 1 + c_p / math.sqrt(n), 1 + c_m / math.sqrt(n)
        drift = n * (2 / (sp ** 2 + sm ** 2) * exact_kernel(sp, sm, rho) - rho)
        errs.append(abs(drift - shaped_relu_nu(rho, c_p, c_m)))
    assert errs[1] < 2e-3 and errs[1] < errs[0] / 5
    assert shaped_relu_nu(rho) >= 0
    assert shaped_relu_nu(1.0) == 0.0


def test_relu_kernel_formula():
    assert relu_kernel(1.0) == pytest.approx(1.0)
    assert relu_kernel(0.3) == pytest.approx(2 * exact_kernel(1.0, 0.0, 0.3))


def test_slopes_and_schedule():
    act = ShapedReLU(100, c_plus=1.0, c_minus=-1.0)
    assert act.s_plus == pytest.approx(1.1) and act.s_minus.item() == pytest.approx(0.9)
    act.set_slope(0.0)                                     # Recover endpoint: √2·ReLU
    x = torch.tensor([-2.0, 3.0])
    torch.testing.assert_close(act(x), torch.tensor([0.0, 3.0]) * 1.1 * math.sqrt(2 / 1.21))


def test_learned_slope_gets_gradient():
    act = ShapedReLU(16, mode="learn")
    act(torch.randn(50)).sum().backward()
    assert act.s_minus.grad is not None
