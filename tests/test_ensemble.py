"""Finite-network ensembles: the real modules, row-space vs full weights, SDE vs networks, rank collapse.

Two-sample KS tests use the critical value at the 1% level, c(α)√((S₁+S₂)/(S₁S₂)) with
c(α) = √(−ln(α/2)/2); mean comparisons use z-scores from the empirical standard errors.
"""
from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import ks_2samp

from sigprop.simulate import ensemble, networks
from sigprop.theory import sde

Z_MAX = 5.0
V0 = torch.tensor([[1.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 1.0]], dtype=torch.float64)
WIDTH = 128  # depth = width: t = 1


def corr(V: torch.Tensor) -> torch.Tensor:
    """Correlation ρ^{01} of tokens 0 and 1, (..., m, m) -> (...)."""
    return V[..., 0, 1] / (V[..., 0, 0] * V[..., 1, 1]).sqrt()


def ks_critical(n1: int, n2: int, alpha: float = 0.01) -> float:
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n1 + n2) / (n1 * n2))


def test_initial_covariance_is_exact_and_runs_are_deterministic():
    a = ensemble.simulate("shaped", V0, width=16, depth=3, samples=5, seed=4, gamma=0.5)
    assert a.shape == (5, 4, 3, 3) and a.dtype == torch.float64
    assert torch.allclose(a[:, 0], V0.expand(5, 3, 3), atol=1e-12)
    assert torch.equal(a, ensemble.simulate("shaped", V0, width=16, depth=3, samples=5, seed=4, gamma=0.5))
    assert not torch.equal(a, ensemble.simulate("shaped", V0, width=16, depth=3, samples=5, seed=5, gamma=0.5))
    b = ensemble.simulate("shaped", V0, width=16, depth=3, samples=5, seed=4, gamma=0.5, dtype=torch.float32)
    assert b.dtype == torch.float32 and torch.isfinite(b).all()


@pytest.mark.parametrize("block, params", [pytest.param("shaped", {"gamma": 0.5}, marks=pytest.mark.slow),
                                           ("preln", {})])
@pytest.mark.slow
def test_row_space_sampler_has_the_law_of_full_weights(block, params):
    kw = dict(width=64, depth=16, samples=400, **params)
    weights = ensemble.simulate(block, V0, seed=1, method="weights", **kw)[:, -1]
    V = ensemble.simulate(block, V0, seed=2, method="gaussian", **kw)[:, -1]
    assert ks_2samp(corr(V), corr(weights)).pvalue > 0.01
    assert ks_2samp(V[:, 0, 0], weights[:, 0, 0]).pvalue > 0.01


@pytest.mark.slow
@pytest.mark.parametrize("block, kind", [("resnet", "resnet"), ("shaped_attention", "shaped_attention"),
                                         ("shaped", "transformer")])
def test_sde_matches_finite_networks(block, kind):
    samples, paths = 1000, 4000
    nets = ensemble.simulate(block, V0, width=WIDTH, depth=WIDTH, samples=samples, seed=1, gamma=0.3)
    paths_ = sde.simulate(kind, V0, t=1.0, steps=256, paths=paths, seed=2, gamma=0.3, record_every=256)
    critical = ks_critical(samples, paths)
    assert ks_2samp(corr(nets[:, -1]), corr(paths_.V[:, -1])).statistic < critical
    assert ks_2samp(nets[:, -1, 0, 0], paths_.V[:, -1, 0, 0]).statistic < critical
    assert corr(nets[:, -1]).std() > 0.2  # a non-trivial distribution, not a collapsed one


@pytest.mark.slow
def test_vanilla_softmax_collapses_and_preln_only_slows_it_down():
    samples = 200
    soft = corr(ensemble.simulate("softmax", V0, width=WIDTH, depth=WIDTH, samples=samples, seed=1))
    pre = corr(ensemble.simulate("preln", V0, width=WIDTH, depth=WIDTH, samples=samples, seed=2))
    assert soft[:, -1].mean() > 0.99
    gap = soft[:, -1] - pre[:, -1]
    assert gap.mean() > Z_MAX * gap.std() / math.sqrt(samples)  # independent samples: lower than softmax
    rise = pre[:, -1] - pre[:, WIDTH // 2]
    assert rise.mean() > Z_MAX * rise.std() / math.sqrt(samples)  # paired: still rising at the end


def test_removing_centering_collapses_shaped_attention():
    kw = dict(width=WIDTH, depth=WIDTH, samples=100, seed=1, gamma=0.3)
    assert corr(ensemble.simulate("no_centering", V0, **kw)[:, -1]).mean() > 0.99
    assert corr(ensemble.simulate("shaped_attention", V0, **kw)[:, -1]).mean() < 0.99


def test_rank_deficient_input_is_handled_exactly():
    """Two identical tokens: XXᵀ/n is singular at every layer; they stay identical, no NaN."""
    V = torch.tensor([[1.0, 1.0, 0.3], [1.0, 1.0, 0.3], [0.3, 0.3, 1.0]])
    for block, params in [("shaped", {"gamma": 0.5}), ("softmax", {}), ("postln", {})]:
        for method in ensemble.METHODS:
            out = ensemble.simulate(block, V, width=32, depth=8, samples=20, seed=0, method=method, **params)
            assert torch.isfinite(out).all()
            assert torch.allclose(corr(out), torch.ones(20, 9, dtype=torch.float64), atol=1e-10)


@pytest.mark.parametrize("method", ensemble.METHODS)
def test_overflow_is_reported_as_nan_from_its_layer_on(method):
    """Fig. 5 regime pushed past float32: some networks overflow; no exception, and an overflowed
    sample stays NaN (its later layers would come from a meaningless root), the others stay finite."""
    V = ensemble.simulate("shaped", 1e37 * V0, width=16, depth=32, samples=50, seed=0, method=method,
                          gamma=0.9, dtype=torch.float32)
    bad = ~torch.isfinite(V).flatten(2).all(-1)                      # (samples, depth+1)
    assert 0 < int(bad[:, -1].sum()) < 50 and not bad[:, 0].any()
    assert torch.equal(bad, bad.cummax(1).values)                   # once overflowed, always
    assert torch.isnan(V[bad]).all()


def test_gradient_norms_of_linear_residual_network_are_preserved():
    """φ = id (c₊ = c₋ = 0): E‖∂ℓ/∂X_l‖² = (λ² + γ²)E‖∂ℓ/∂X_{l+1}‖² = 1 at every layer, exactly."""
    samples = 200
    g = ensemble.gradient_norms("resnet", V0, width=32, depth=6, samples=samples, seed=0,
                                gamma=0.6, c_plus=0.0, c_minus=0.0)
    assert g.shape == (samples, 6)
    assert ((g.mean(0) - 1.0) / (g.std(0) / math.sqrt(samples))).abs().max() < Z_MAX


@pytest.mark.parametrize("kwargs, match", [
    (dict(block="mlp"), "block"),
    (dict(width=0), "width"),
    (dict(block="shaped", gamma=None), "gamma"),
    (dict(block="softmax", gamma=0.5), "gamma"),
    (dict(gamma=0.0), "gamma"),
    (dict(tau0=-1.0), "tau0"),
    (dict(method="exact"), "method"),
    (dict(V0=torch.tensor([[1.0, 2.0], [2.0, 1.0]])), "positive"),
    (dict(width=2), "width"),
])
def test_bad_input_raises(kwargs, match):
    args = dict(block="shaped_attention", V0=V0, width=8, depth=2, samples=2, gamma=0.5) | kwargs
    with pytest.raises(ValueError, match=match):
        ensemble.simulate(**args)


@pytest.mark.parametrize("block, params", [("shaped", {"gamma": 0.5, "c_minus": -2.0}), ("postln", {})])
def test_per_layer_covariances_are_those_of_the_real_modules(block, params):
    """Same seed, same weights: each network run alone through its own copy of the layer module, one plain
    forward per layer, gives the simulator's covariances to float64 rounding."""
    S, n, depth, seed = 4, 12, 3, 7
    V = ensemble.simulate(block, V0, width=n, depth=depth, samples=S, seed=seed, method="weights", **params)
    p = ensemble.block_params(block, n, **({"gamma": None, "tau0": 1.0, "c_plus": 0.0, "c_minus": -1.0, "n_k": None}
                                           | params))
    template = networks.layer(block, p)
    gen = torch.Generator().manual_seed(seed)
    X = list(ensemble.initial_tokens(V0, n, S, gen))
    expected = [[x @ x.T / n for x in X]]
    for _ in range(depth):
        weights = ensemble.draw(ensemble.weight_shapes(template), S, gen, torch.float64)
        for s in range(S):
            net = networks.layer(block, p)
            with torch.no_grad():
                for name, w in weights.items():
                    net.get_parameter(name).copy_(w[s])
                X[s] = net(X[s][None])[0]
        expected.append([x @ x.T / n for x in X])
    expected = torch.stack([torch.stack(v) for v in expected], 1)
    torch.testing.assert_close(V, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block", ["shaped_attention", "resnet", "preln"])
def test_row_space_weights_give_the_full_weights_output_exactly(block):
    """A layer with the row-space hooks and weights W O equals the layer with the full weights W."""
    n = 16
    p = ensemble.block_params(block, n, gamma=0.6 if block in networks.SHAPED_BLOCKS else None, tau0=1.0,
                              c_plus=0.3, c_minus=-1.0, n_k=None)
    full = networks.layer(block, p)
    x = ensemble.initial_tokens(V0, n, 1, torch.Generator().manual_seed(0))
    basis = lambda h: torch.linalg.qr(h.reshape(-1, h.shape[-1]).mT).Q      # noqa: E731
    sub = full[0]
    with torch.no_grad():
        if block == "resnet":
            h = sub.fn.act(sub.fn.fc1(x))
            weights = {"0.fn.fc1.weight": sub.fn.fc1.weight @ basis(x), "0.fn.fc2.weight": sub.fn.fc2.weight @ basis(h)}
        else:
            h = sub.norm(x) if sub.placement == "pre" else x
            weights = {f"0.fn.{k}_proj.weight": getattr(sub.fn, f"{k}_proj").weight @ basis(h) for k in "qkv"}
        restricted = ensemble.restrict_to_rows(networks.layer(block, p))
        y = ensemble.batched(restricted)({k: w[None] for k, w in weights.items()}, x)
        torch.testing.assert_close(y, full(x), rtol=1e-12, atol=1e-12)


def test_options_without_a_module_are_refused_and_old_names_warn():
    with pytest.raises(NotImplementedError, match="n_k"):
        ensemble.simulate("shaped", V0, width=8, depth=2, samples=2, gamma=0.5, n_k=4)
    new = ensemble.simulate("shaped_attention", V0, width=8, depth=2, samples=2, seed=3, gamma=0.5)
    with pytest.warns(DeprecationWarning, match="shaped_attention"):
        old = ensemble.simulate("attention", V0, width=8, depth=2, samples=2, seed=3, gamma=0.5)
    with pytest.warns(DeprecationWarning, match="gaussian"):
        gram = ensemble.simulate("shaped_attention", V0, width=8, depth=2, samples=2, seed=3, gamma=0.5, method="gram")
    assert torch.equal(old, new) and torch.equal(gram, new)
