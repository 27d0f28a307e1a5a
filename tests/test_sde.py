"""Covariance SDEs: every drift and diffusion term against a one-layer Monte Carlo of the network.

One layer at width n: n·E[ΔV] → drift, n·Cov[ΔV] → diffusion. E[ΔV] = O(1/n) sits under O(n^{-1/2})
fluctuations, so the drift estimates subtract exactly-zero-mean control variates: the same draws
pushed through the linear network (A = I, φ = id; E[ΔV_lin] = 0 exactly since λ² + γ² = 1), and,
for attention, the antithetic logits −Y (the law of W_Q is symmetric). The diffusion is split term
by term with Cov[ΔV] = E[Cov(ΔV | Y)] + Cov(E[ΔV | Y]): the linear network carries γ²(2 − γ²)Σ_lin
exactly, and E[ΔV | Y] = γ²(A V Aᵀ − V) (average over W_V), whose part odd in Y carries γ⁴/τ₀² 𝒜.
Tolerances are z-scores from the empirical standard errors; every check is shown to fail for a
deliberately wrong formula.
"""
from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import ks_2samp

from sigprop.nn import ShapedReLU
from sigprop.theory import sde
from sigprop.theory.kernels import shaped_relu_nu, shaped_relu_slopes

Z_MAX = 5.0  # two-sided z bound per entry: false alarm ≈ 6e-7 per entry, ≤ 21 entries per check
V_TEST = torch.tensor([[1.0, 0.4, 0.1], [0.4, 1.5, -0.3], [0.1, -0.3, 0.8]], dtype=torch.float64)
N, N_K, CHUNK = 256, 64, 5_000
SAMPLES = {"resnet": 40_000, "shaped_attention": 40_000, "transformer": 20_000}
GAMMA, TAU0 = 0.8, 1.0
I, J = sde.triu_pairs(3)


@pytest.fixture(autouse=True, scope="module")
def _float64():
    """float64 inside this module's tests only; restored for other modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def z_mean(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """z-scores of the sample mean of x (S, k) against target (k,)."""
    return (x.mean(0) - target) / (x.std(0) / math.sqrt(len(x)))


def z_cov(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """z-scores of the sample covariance of x (S, k) against target (k, k)."""
    xc = x - x.mean(0)
    p = xc[:, :, None] * xc[:, None, :]
    return (p.mean(0) - target) / (p.std(0) / math.sqrt(len(x)))


def pairs(T: torch.Tensor) -> torch.Tensor:
    """Upper-triangular entries: (..., m, m) -> (..., k); (m, m, m, m) -> (k, k)."""
    return T[..., I, J] if T.ndim != 4 else T[I, J][:, I, J]


def attention_matrix(Y: torch.Tensor, tau: float) -> torch.Tensor:
    """Shaped attention of logits Y: I + Softmax(Y/τ) − 11ᵀ/m, (S, m, m) (key width n_k, which no module has)."""
    m = Y.shape[-1]
    return torch.eye(m) + torch.softmax(Y / tau, dim=-1) - 1.0 / m


def _attention(X, R, g):
    """X' = λX + γ A Zv for A(Y), A(−Y) and A = I (same draws), and the odd part of E[ΔV | Y]."""
    S, m, n = X.shape
    Zv = R @ torch.randn(S, m, n, generator=g)
    Y = (R @ torch.randn(S, m, N_K, generator=g)) @ (R @ torch.randn(S, m, N_K, generator=g)).mT
    tau = TAU0 * math.sqrt(n * N_K)
    A = (attention_matrix(Y, tau), attention_matrix(-Y, tau), torch.eye(m))
    odd = GAMMA**2 * (A[0] @ V_TEST @ A[0].mT - A[1] @ V_TEST @ A[1].mT) / 2
    return [math.sqrt(1 - GAMMA**2) * X + GAMMA * (a @ Zv) for a in A], odd


def _mlp(X, G, linear):
    """X' = λX + γ √c φ_s(X W_pre/√n) W_post/√n, with X W/√n drawn as chol(XXᵀ/n) G[i] (exact in law)."""
    n = X.shape[-1]
    Z = torch.linalg.cholesky(X @ X.mT / n) @ G[0]
    H = Z if linear else ShapedReLU(n)(Z)
    return math.sqrt(1 - GAMMA**2) * X + GAMMA * torch.linalg.cholesky(H @ H.mT / n) @ G[1]


def one_layer(kind: str, seed: int) -> dict[str, torch.Tensor]:
    """Per-sample (S, 6) arrays: drift estimator n·(ΔV_even − ΔV_lin), √n ΔV, √n ΔV_lin, √n E[ΔV | Y]_odd."""
    g = torch.Generator().manual_seed(seed)
    R = torch.linalg.cholesky(V_TEST)
    X0 = math.sqrt(N) * torch.cat([R, torch.zeros(3, N - 3)], 1).expand(CHUNK, 3, N)
    out = {k: [] for k in ("drift", "dV", "lin", "odd")}
    for _ in range(SAMPLES[kind] // CHUNK):
        if kind == "resnet":
            G = torch.randn(2, CHUNK, 3, N, generator=g)
            plus = minus = _mlp(X0, G, linear=False)
            lin, odd = _mlp(X0, G, linear=True), torch.zeros(CHUNK, 3, 3)
        else:
            (plus, minus, lin), odd = _attention(X0, R.expand(CHUNK, 3, 3), g)
            if kind == "transformer":
                G = torch.randn(2, CHUNK, 3, N, generator=g)
                plus, minus, lin = _mlp(plus, G, False), _mlp(minus, G, False), _mlp(lin, G, True)
        dv = [pairs(x @ x.mT / N - V_TEST) for x in (plus, minus, lin)]
        out["drift"].append(N * ((dv[0] + dv[1]) / 2 - dv[2]))
        out["dV"].append(math.sqrt(N) * dv[0])
        out["lin"].append(math.sqrt(N) * dv[2])
        out["odd"].append(math.sqrt(N) * pairs(odd))
    return {k: torch.cat(v) for k, v in out.items()}


@pytest.fixture(scope="module", params=["resnet", "shaped_attention", "transformer"])
def mc(request):
    return request.param, one_layer(request.param, seed=1)


def _drift_target(kind: str, resnet_factor: float = 1.0) -> torch.Tensor:
    """Exact finite-n mean: the resnet drift carries the factor c = 2/(s₊² + s₋²) = 1 + O(n^{-1/2})."""
    b = torch.zeros(3, 3)
    if kind != "shaped_attention":
        b = b + resnet_factor * sde.resnet_drift(V_TEST, GAMMA)
    if kind != "resnet":
        b = b + sde.attention_drift(V_TEST, GAMMA, TAU0)
    return b


@pytest.mark.slow
def test_drift_matches_one_layer_monte_carlo(mc):
    kind, x = mc
    c = shaped_relu_slopes(N)[2]
    b = sde.drift(kind, V_TEST, gamma=GAMMA, tau0=TAU0)
    assert torch.allclose(b, _drift_target(kind)), "drift(kind) must be the sum of its blocks' drifts"
    assert z_mean(x["drift"], pairs(_drift_target(kind, c))).abs().max() < Z_MAX


@pytest.mark.slow
def test_wrong_drifts_fail_the_same_check(mc):
    kind, x = mc
    c = shaped_relu_slopes(N)[2]
    target = _drift_target(kind, c)
    m, Vc = 3, V_TEST - V_TEST.mean(0) - V_TEST.mean(1, keepdim=True) + V_TEST.mean()
    s1 = GAMMA**2 / TAU0**2 * V_TEST * (Vc**2).sum() / m**2  # the S₁ (first-order softmax) drift term
    wrong = []
    if kind != "shaped_attention":
        wrong.append(target - 2 * c * sde.resnet_drift(V_TEST, GAMMA))  # ν with flipped sign
    if kind != "resnet":
        wrong.append(target - s1)
    if kind == "shaped_attention":  # without the S₂ term (in the transformer the MLP noise hides it at this size)
        wrong.append(target - sde.attention_drift(V_TEST, GAMMA, TAU0) + s1)
    for b in wrong:
        assert z_mean(x["drift"], pairs(b)).abs().max() > Z_MAX


@pytest.mark.slow
def test_diffusion_matches_one_layer_monte_carlo(mc):
    kind, x = mc
    full = pairs(sde.diffusion(kind, V_TEST, gamma=GAMMA, tau0=TAU0))
    assert z_cov(x["dV"], full).abs().max() < Z_MAX
    if kind == "resnet":
        assert torch.allclose(full, pairs(2 * GAMMA**2 * sde.sigma_lin(V_TEST)))
        return
    # term by term: linear part γ²(2 − γ²)Σ_lin (+ 2γ²Σ_lin for the MLP), softmax part γ⁴/τ₀² 𝒜
    A = pairs(GAMMA**4 / TAU0**2 * sde.attention_A(V_TEST))
    lin = GAMMA**2 * (2 - GAMMA**2) + (2 * GAMMA**2 if kind == "transformer" else 0.0)
    assert torch.allclose(full - A, pairs(lin * sde.sigma_lin(V_TEST)))
    assert z_cov(x["lin"], full - A).abs().max() < Z_MAX
    assert z_cov(x["odd"], A).abs().max() < Z_MAX
    assert z_cov(x["dV"], full - A).abs().max() > Z_MAX
    uncentred = pairs(GAMMA**4 / TAU0**2 * sde.pair_sym(V_TEST, V_TEST @ V_TEST @ V_TEST) / 9)
    assert z_cov(x["odd"], uncentred).abs().max() > Z_MAX


def test_resnet_drift_is_nu_times_scale():
    V = torch.tensor([[2.0, 0.5, -1.0], [0.5, 0.5, 0.0], [-1.0, 0.0, 1.0]])
    s = V.diagonal().sqrt()
    s = s[:, None] * s[None, :]
    expected = 0.3**2 * s * shaped_relu_nu(V / s, 0.2, -0.7)
    assert torch.allclose(sde.resnet_drift(V, 0.3, 0.2, -0.7), expected, atol=1e-14)
    assert float(shaped_relu_nu(1.0)) == 0.0 and float(shaped_relu_nu(-1.0)) > 0.0


def _jacobian_covariance(noise, inputs: int, m: int) -> torch.Tensor:
    """Covariance JᵀJ (m², m²) of a noise that is linear in `inputs` iid standard normals."""
    J = noise(torch.eye(inputs)).reshape(inputs, m * m)
    return J.T @ J


def _random_covariance(m: int) -> torch.Tensor:
    A = torch.randn(m, m, generator=torch.Generator().manual_seed(0))
    return A @ A.T / m + 0.1 * torch.eye(m)


@pytest.mark.parametrize("kind", sde.KINDS)
def test_structured_noise_covariance_is_exact(kind):
    """Both noises are linear in their normals, so their covariance is exactly JᵀJ (J the Jacobian)."""
    m, k = 4, 10
    V = _random_covariance(m)
    S = sde.diffusion(kind, V, gamma=0.7, tau0=0.8).reshape(m * m, m * m)
    structured = _jacobian_covariance(
        lambda e: sde.structured_noise(kind, V, e.reshape(-1, m, m), gamma=0.7, tau0=0.8), m * m, m)
    naive = _jacobian_covariance(lambda e: sde.naive_noise(kind, V.expand(k, m, m), e, gamma=0.7, tau0=0.8), k, m)
    assert torch.allclose(structured, S, atol=1e-12)
    assert torch.allclose(naive, S, atol=1e-12)
    S4 = S.reshape(m, m, m, m)
    assert torch.allclose(S, S.T) and torch.allclose(S4, S4.transpose(0, 1))


def test_attention_term_is_the_first_order_softmax_covariance():
    """Logits Y/√n_k → R G' Rᵀ: the first-order term (R G' Rᵀ P V + V P R G'ᵀ Rᵀ)/m has covariance 𝒜."""
    m = 4
    V = _random_covariance(m)
    R, P = torch.linalg.cholesky(V), torch.eye(m) - 1.0 / m

    def first_order(e: torch.Tensor) -> torch.Tensor:
        U = R @ e.reshape(-1, m, m) @ R.T @ P @ V / m
        return U + U.mT

    assert torch.allclose(_jacobian_covariance(first_order, m * m, m), sde.attention_A(V).reshape(m * m, m * m),
                          atol=1e-12)


@pytest.mark.parametrize("kind", ["shaped_attention", "transformer"])
def test_structured_and_naive_noise_sample_the_diffusion(kind):
    g = torch.Generator().manual_seed(3)
    S = 100_000
    Vb = V_TEST.expand(S, 3, 3)
    xi = sde.structured_noise(kind, Vb, torch.randn(S, 3, 3, generator=g), gamma=0.9, tau0=0.5)
    xn = sde.naive_noise(kind, Vb, torch.randn(S, 6, generator=g), gamma=0.9, tau0=0.5)
    target = pairs(sde.diffusion(kind, V_TEST, gamma=0.9, tau0=0.5))
    assert z_cov(pairs(xi), target).abs().max() < Z_MAX
    assert z_cov(pairs(xn), target).abs().max() < Z_MAX


def test_simulate_structured_and_naive_have_the_same_law():
    V0 = torch.tensor([[1.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 1.0]])
    kw = dict(t=1.0, steps=20, paths=1000, gamma=0.5, record_every=10)
    a = sde.simulate("transformer", V0, seed=1, **kw)
    b = sde.simulate("transformer", V0, seed=2, method="naive", **kw)
    assert a.V.shape == (1000, 3, 3, 3) and torch.equal(a.V[:, 0], V0.expand(1000, 3, 3))
    assert torch.allclose(a.times, torch.tensor([0.0, 0.5, 1.0]))
    for f in (lambda V: V[:, -1, 0, 1] / (V[:, -1, 0, 0] * V[:, -1, 1, 1]).sqrt(), lambda V: V[:, -1, 2, 2]):
        assert ks_2samp(f(a.V), f(b.V)).pvalue > 0.01
    again = sde.simulate("transformer", V0, seed=1, **kw)
    assert torch.equal(a.V, again.V)


def test_blowup_paths_are_stopped_without_nan():
    """Fig. 5 setting: large initial norm and large γ explode in finite time for some paths."""
    V0 = 100.0 * (0.02 * torch.eye(3) + 0.98)  # token norm 10√n, nearly aligned: eigenvalues 2, 2, 296
    r = sde.simulate("shaped_attention", V0, t=1.0, steps=100, paths=200, gamma=0.9, seed=0)
    assert torch.isfinite(r.V).all()
    assert 0 < int(r.stopped.sum()) < 200
    assert torch.isfinite(r.stop_time[r.stopped]).all() and torch.isinf(r.stop_time[~r.stopped]).all()
    assert not (r.exploded & ~r.stopped).any()                 # explosions are a kind of stop
    assert (torch.linalg.matrix_norm(r.V[~r.stopped, -1]) < 1e6).all()
    assert r.exploded.any() and (r.stopped & ~r.exploded).any()     # both stop reasons occur here
    k = (r.stop_time[r.stopped] / 0.01).round().long()  # stopped paths stay frozen afterwards
    frozen = r.V[r.stopped]
    for path, step in zip(frozen, k):
        assert torch.equal(path[step:], path[-1].expand_as(path[step:]))


def test_paths_V_is_the_path_tensor_and_stopped_paths_hold_their_last_finite_value():
    """SDEPaths.V is the (paths, steps // record_every + 1, m, m) tensor: finite and PSD everywhere;
    a stopped path holds its last accepted value, which for a rejected proposal is below the blow-up norm."""
    V0 = 100.0 * (0.02 * torch.eye(3) + 0.98)
    r = sde.simulate("shaped_attention", V0, t=1.0, steps=100, paths=200, gamma=0.9, seed=0, record_every=5)
    assert r.V.shape == (200, 21, 3, 3) and r.times.shape == (21,) and torch.equal(r.V[:, 0], V0.expand(200, 3, 3))
    assert torch.isfinite(r.V).all()
    w = torch.linalg.eigvalsh(r.V)
    assert (w[..., 0] >= -1e-10 * w[..., -1]).all()
    rejected = r.stopped & ~r.exploded
    assert rejected.any() and (torch.linalg.matrix_norm(r.V[rejected, -1]) < 1e6).all()
    after = r.times >= r.stop_time[:, None]                     # (paths, T): grid times past the stop
    assert torch.equal(r.V[after], r.V[:, -1, None].expand_as(r.V)[after])


def test_overflowing_proposals_stop_the_path_at_its_last_finite_value():
    """A cubic drift that overflows the dtype in one step is a rejected (non-finite) proposal, not an explosion."""
    V0 = 1e110 * torch.tensor([[1.0, 0.2], [0.2, 1.0]])
    r = sde.simulate("shaped_attention", V0, steps=10, paths=5, gamma=0.9, seed=0, blowup=math.inf)
    assert r.stopped.all() and not r.exploded.any()
    assert torch.equal(r.stop_time, torch.full((5,), 0.1)) and torch.equal(r.V, V0.expand_as(r.V))


@pytest.mark.parametrize("kind", sde.KINDS)
def test_identical_tokens_stay_identical(kind):
    """Singular V0 (tokens 0 and 1 equal): drift and noise preserve the null space exactly, no stops."""
    V0 = torch.tensor([[1.0, 1.0, 0.3], [1.0, 1.0, 0.3], [0.3, 0.3, 1.0]])
    r = sde.simulate(kind, V0, steps=50, paths=100, gamma=0.3, seed=0)
    assert not r.stopped.any()
    rho = r.V[..., 0, 1] / (r.V[..., 0, 0] * r.V[..., 1, 1]).sqrt()
    assert torch.allclose(rho, torch.ones_like(rho), atol=1e-12)


def test_deprecated_kind_attention_warns_and_is_shaped_attention():
    """"attention" (the old name) gives the shaped-attention SDE's drift, diffusion, noise and paths exactly."""
    kw = dict(gamma=0.5, tau0=0.8)
    normals = torch.randn(4, 3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for f, args in ((sde.drift, (V_TEST,)), (sde.diffusion, (V_TEST,)), (sde.structured_noise, (V_TEST, normals))):
        with pytest.warns(DeprecationWarning, match="kind='attention' is deprecated; it is called 'shaped_attention'"):
            old = f("attention", *args, **kw)
        assert torch.equal(old, f("shaped_attention", *args, **kw)), f.__name__
    with pytest.warns(DeprecationWarning, match="shaped_attention"):
        old = sde.simulate("attention", V_TEST, steps=5, paths=8, seed=3, **kw)
    assert torch.equal(old.V, sde.simulate("shaped_attention", V_TEST, steps=5, paths=8, seed=3, **kw).V)
    assert "attention" not in sde.KINDS


@pytest.mark.parametrize("call, match", [
    (lambda: sde.drift("mlp", V_TEST, gamma=0.5), "kind"),
    (lambda: sde.diffusion("shaped_attention", V_TEST, gamma=1.5), "gamma"),
    (lambda: sde.drift("shaped_attention", V_TEST, gamma=0.5, tau0=0.0), "tau0"),
    (lambda: sde.simulate("resnet", V_TEST, gamma=0.5, method="exact"), "method"),
    (lambda: sde.simulate("resnet", torch.tensor([[1.0, 2.0], [0.0, 1.0]]), gamma=0.5), "symmetric"),
    (lambda: sde.simulate("resnet", torch.tensor([[1.0, 2.0], [2.0, 1.0]]), gamma=0.5), "positive"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
