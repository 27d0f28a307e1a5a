"""Neural covariance SDEs of shaped ResNets, shaped attention and the shaped Transformer.

In the proportional limit (depth d, width n → ∞, t = d/n fixed) the token covariance V = XXᵀ/n of
a shaped network solves dV_t = b(V_t) dt + Σ(V_t)^{1/2} dB_t (Noci et al. 2023, Thm 3.2, 4.2,
Cor. 4.3), where b(V) = lim n·E[ΔV | V] and Σ(V) = lim n·Cov[ΔV | V] for one block.
Derivations: docs/sde.md. Notation: P = I − 11ᵀ/m (token centering), Ṽ = PVP,
d^δ = Ṽ^{δδ} − tr(Ṽ)/m, Σ_lin(V)^{αβ,δω} = V^{αδ}V^{βω} + V^{αω}V^{βδ}.

* "resnet"            X' = λX + γ√c φ_s(XW_pre/√n)W_post/√n:
                      b^{αβ} = γ² √(V^{αα}V^{ββ}) ν(ρ^{αβ}),   Σ = 2γ² Σ_lin(V).
* "shaped_attention"  X' = λX + γ(I + Softmax(Y/τ) − 11ᵀ/m) X W_V/√n, τ = τ₀√(n n_k):
                      b^{αβ} = γ²/τ₀² [ (V^{αα}(Vd)^β + V^{ββ}(Vd)^α)/(2m) + V^{αβ} ‖Ṽ‖_F²/m² ],
                      Σ = γ²(2 − γ²) Σ_lin(V) + γ⁴/τ₀² 𝒜(V),
                      𝒜^{αβ,δω} = (V^{αδ}B^{βω} + V^{αω}B^{βδ} + V^{βδ}B^{αω} + V^{βω}B^{αδ})/m²,  B = VṼV.
                      Both are exact in n_k (they only use second moments of the logits).
* "transformer"       shaped-attention block then resnet block: drifts and diffusions add.

``"attention"`` is the deprecated name of ``"shaped_attention"`` (a DeprecationWarning, then the same SDE).

Diffusion tensors are returned in full, shape (..., m, m, m, m) with Σ^{αβ,δω} = lim n Cov[ΔV^{αβ}, ΔV^{δω}]:
symmetric under α↔β, δ↔ω and (αβ)↔(δω). The paper's matrix [Σ^{αβ,δω}]_{α≤β, δ≤ω} is its
restriction to upper-triangular index pairs (`triu_pairs`).

Every Σ(V) factorises as pair_sym(V, W) with W = aV + b VṼV (a = Σ_lin weight/2, b = γ⁴/(τ₀²m²)),
so noise with covariance Σ(V) costs O(m³) per path and one m×m normal matrix
(`structured_noise`); `method="naive"` instead takes the symmetric square root of the
(m(m+1)/2)² matrix, for cross-checking.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fields import SQUARABLE, SQUARABLE_POSITIVE, Range, check_value, current_value, invalid

Tensor = torch.Tensor
KINDS = ("resnet", "shaped_attention", "transformer")
DEPRECATED_KINDS = {"attention": "shaped_attention"}     # old name -> its name now
METHODS = ("structured", "naive")
DTYPES = (torch.float32, torch.float64)   # the dtypes torch.linalg (Cholesky, eigh) computes in


def check_params(gamma: float, tau0: float, c_plus: float = 0.0, c_minus: float = -1.0) -> None:
    """Raise ValueError naming the argument unless gamma ∈ (0, 1], tau0 ∈ [2^-63, 2^63] and c± ∈ [-2^63, 2^63]
    (`fields.SQUARABLE_POSITIVE`, `fields.SQUARABLE`: the coefficients γ²/τ₀², γ⁴/(τ₀m)² and (c₊ − c₋)² stay finite
    and τ₀² non-zero), each a finite real number."""
    for name, value, allowed in (("gamma", gamma, Range(0.0, 1.0, lo_open=True)), ("tau0", tau0, SQUARABLE_POSITIVE),
                                 ("c_plus", c_plus, SQUARABLE), ("c_minus", c_minus, SQUARABLE)):
        if check_value(value, float, name) not in allowed:
            raise ValueError(invalid(name, value, allowed))


def check_covariance(V: Tensor, name: str = "V0") -> None:
    """Raise ValueError unless V is a finite symmetric positive semi-definite (..., m, m) matrix."""
    if V.ndim < 2 or V.shape[-1] != V.shape[-2] or V.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., m, m), got {tuple(V.shape)}")
    if not bool(torch.isfinite(V).all()):
        raise ValueError(f"{name} must be finite")
    scale = V.abs().amax().clamp_min(torch.finfo(V.dtype).tiny)
    tol = 1e3 * torch.finfo(V.dtype).eps * V.shape[-1]
    if not bool(((V - V.mT).abs() <= tol * scale).all()):
        raise ValueError(f"{name} must be symmetric")
    if bool((torch.linalg.eigvalsh(V)[..., 0] < -tol * scale).any()):
        raise ValueError(f"{name} must be positive semi-definite")


def _kind(kind: str) -> str:
    """``kind`` itself, or the current name of a deprecated one (DeprecationWarning); ValueError if unknown."""
    return current_value("kind", kind, KINDS, DEPRECATED_KINDS, stacklevel=4)


def _centre(V: Tensor) -> Tensor:
    """PVP: V with token means removed from rows and columns."""
    V = V - V.mean(-2, keepdim=True)
    return V - V.mean(-1, keepdim=True)


def pair_sym(A: Tensor, B: Tensor) -> Tensor:
    """A^{αδ}B^{βω} + A^{αω}B^{βδ} + A^{βδ}B^{αω} + A^{βω}B^{αδ}, shape (..., m, m, m, m)."""
    t = torch.einsum("...ad,...bw->...abdw", A, B)
    t = t + t.transpose(-1, -2)
    return t + t.transpose(-3, -4)


def sigma_lin(V: Tensor) -> Tensor:
    """Σ_lin(V)^{αβ,δω} = V^{αδ}V^{βω} + V^{αω}V^{βδ}, shape (..., m, m, m, m)."""
    return pair_sym(V, V) / 2


def attention_A(V: Tensor) -> Tensor:
    """𝒜(V) = pair_sym(V, VṼV)/m²: the diffusion of the first-order softmax term, (..., m, m, m, m)."""
    m = V.shape[-1]
    return pair_sym(V, V @ _centre(V) @ V) / m**2


def resnet_drift(V: Tensor, gamma: float, c_plus: float = 0.0, c_minus: float = -1.0) -> Tensor:
    """γ² √(V^{αα}V^{ββ}) ν(ρ^{αβ}), shape (..., m, m).

    = γ²(c₊−c₋)²/(2π) (√(V^{αα}V^{ββ}) sin θ − V^{αβ} θ), θ = arccos ρ^{αβ} (ν = kernels.shaped_relu_nu):
    sin θ rather than √(1 − ρ²) keeps b exactly 0 on identical tokens despite round-off in ρ.
    """
    d = V.diagonal(dim1=-2, dim2=-1).clamp_min(0.0).sqrt()
    s = d.unsqueeze(-1) * d.unsqueeze(-2)
    theta = torch.arccos((V / torch.where(s > 0, s, math.inf)).clamp_(-1.0, 1.0))
    b = torch.addcmul(s * torch.sin(theta), V, theta, value=-1.0)
    return b.mul_(gamma**2 * (c_plus - c_minus) ** 2 / (2 * math.pi))


def attention_drift(V: Tensor, gamma: float, tau0: float = 1.0) -> Tensor:
    """γ²/τ₀² [(V^{αα}(Vd)^β + V^{ββ}(Vd)^α)/(2m) + V^{αβ}‖Ṽ‖²/m²], shape (..., m, m).

    With r = V1/m (V^{αx̄}) and μ = mean(r) (V^{x̄x̄}): ‖Ṽ‖² = ‖V‖² − 2m‖r‖² + m²μ² and
    d = diag V − V̄ − 2(r − μ), so Ṽ is never formed; b = T + Tᵀ, T = c/(2m) diag⊗Vd + c‖Ṽ‖²V/(2m²).
    """
    m = V.shape[-1]
    coef = gamma**2 / tau0**2
    r = V.mean(-1)
    mu = r.mean(-1, keepdim=True)
    diag = V.diagonal(dim1=-2, dim2=-1)
    d = diag - diag.mean(-1, keepdim=True) - 2 * (r - mu)
    norm2 = ((V * V).sum((-2, -1)) - 2 * m * (r * r).sum(-1) + (m * mu.squeeze(-1)) ** 2).clamp_min(0.0)
    Vd = (V @ d.unsqueeze(-1)).mT
    T = torch.addcmul(V * (coef * norm2 / (2 * m**2))[..., None, None], diag.unsqueeze(-1), Vd,
                      value=coef / (2 * m))
    return T + T.mT


def drift(kind: str, V: Tensor, *, gamma: float, tau0: float = 1.0, c_plus: float = 0.0,
          c_minus: float = -1.0) -> Tensor:
    """Drift b(V) of `kind` ("resnet", "shaped_attention", "transformer"); V (..., m, m) -> (..., m, m), V finite
    symmetric PSD (ValueError otherwise)."""
    kind = _kind(kind)
    check_params(gamma, tau0, c_plus, c_minus)
    check_covariance(V, "V")
    return _drift(kind, V, gamma, tau0, c_plus, c_minus)


def _drift(kind: str, V: Tensor, gamma: float, tau0: float, c_plus: float, c_minus: float) -> Tensor:
    if kind == "resnet":
        return resnet_drift(V, gamma, c_plus, c_minus)
    if kind == "shaped_attention":
        return attention_drift(V, gamma, tau0)
    return resnet_drift(V, gamma, c_plus, c_minus) + attention_drift(V, gamma, tau0)


def _diffusion_weights(kind: str, gamma: float, tau0: float, m: int) -> tuple[float, float]:
    """(a, b) with Σ = pair_sym(V, aV + b VṼV): a = Σ_lin weight / 2, b = γ⁴/(τ₀² m²) (0 for resnet).

    Σ_lin weight: 2γ² (resnet), γ²(2 − γ²) (shaped_attention), their sum (transformer).
    """
    lin = {"resnet": 2 * gamma**2, "shaped_attention": gamma**2 * (2 - gamma**2),
           "transformer": gamma**2 * (4 - gamma**2)}[kind]
    return lin / 2, (0.0 if kind == "resnet" else gamma**4 / (tau0 * m) ** 2)


def diffusion(kind: str, V: Tensor, *, gamma: float, tau0: float = 1.0) -> Tensor:
    """Diffusion Σ(V) of `kind`, full tensor (..., m, m, m, m) (see module docstring); V finite symmetric PSD."""
    kind = _kind(kind)
    check_params(gamma, tau0)
    check_covariance(V, "V")
    a, b = _diffusion_weights(kind, gamma, tau0, V.shape[-1])
    return pair_sym(V, a * V + b * (V @ _centre(V) @ V))


def psd_root(V: Tensor, tol: float | None = None) -> tuple[Tensor, Tensor]:
    """(R, ok): R Rᵀ = V for a batch (..., m, m); ok (...) flags finite V that are PSD up to `tol`.

    Cholesky where it succeeds; elsewhere (singular or slightly indefinite V) the eigen-root
    Q diag(√w⁺), eigenvalues below tol·max|w| set to exactly 0 so null spaces are kept exactly;
    no jitter. Where V is finite but not PSD (ok False), R is finite but meaningless; where V has a
    NaN or ±inf entry, R is all NaN (non-finite input propagates).
    """
    tol = 1e4 * torch.finfo(V.dtype).eps if tol is None else tol
    finite = torch.isfinite(V).all(-1).all(-1)
    R, info = torch.linalg.cholesky_ex(torch.where(finite[..., None, None], V, torch.eye(V.shape[-1], dtype=V.dtype)))
    R = R.masked_fill(~finite[..., None, None], math.nan)
    ok = finite & (info == 0)
    bad = ~ok & finite
    if bool(bad.any()):
        w, Q = torch.linalg.eigh(V[bad])
        floor = tol * w.abs().amax(-1, keepdim=True)
        R[bad] = Q * torch.where(w > floor, w, 0.0).sqrt().unsqueeze(-2)  # round-off eigenvalues -> exactly 0
        ok[bad] = w[..., 0] >= -floor[..., 0]
    return R, ok


def structured_noise(kind: str, V: Tensor, normals: Tensor, *, gamma: float, tau0: float = 1.0,
                     root: Tensor | None = None) -> Tensor:
    """Noise ξ (..., m, m) with Cov[ξ^{αβ}, ξ^{δω}] = Σ(V)^{αβ,δω}, from iid standard normals (..., m, m).

    ξ = R (G Lᵀ + L Gᵀ) Rᵀ, R Rᵀ = V, L = chol(a I + b N²), N = Rᵀ P R, (a, b) as in
    `_diffusion_weights`: Cov = pair_sym(V, W), W = R(aI + bN²)Rᵀ = aV + b VṼV, i.e. Σ(V).
    O(m³) per path; non-finite where V is too large for the dtype (the solver then stops the path).
    """
    kind = _kind(kind)
    R = psd_root(V)[0] if root is None else root
    a, b = _diffusion_weights(kind, gamma, tau0, V.shape[-1])
    if b == 0.0:
        S = math.sqrt(a) * (normals + normals.mT)
    else:
        N = R.mT @ (R - R.mean(-2, keepdim=True))
        M = (N @ N).mul_(b)
        M.diagonal(dim1=-2, dim2=-1).add_(a)
        L = torch.linalg.cholesky_ex(M)[0]
        T = normals @ L.mT
        S = T + T.mT
    return R @ S @ R.mT


def triu_pairs(m: int) -> tuple[Tensor, Tensor]:
    """Row and column indices of the m(m+1)/2 pairs α ≤ β."""
    return tuple(torch.triu_indices(m, m))


def naive_noise(kind: str, V: Tensor, normals: Tensor, *, gamma: float, tau0: float = 1.0) -> Tensor:
    """Noise ξ (..., m, m) = sym(Σ_triu(V)^{1/2} g), g = normals (..., m(m+1)/2); O(m⁶), for checks."""
    m = V.shape[-1]
    i, j = triu_pairs(m)
    S = diffusion(kind, V, gamma=gamma, tau0=tau0)[..., i, j, :, :][..., i, j]
    w, Q = torch.linalg.eigh(S)
    root = Q * w.clamp_min(0.0).sqrt().unsqueeze(-2)
    v = (root @ normals.unsqueeze(-1)).squeeze(-1)
    xi = V.new_zeros(V.shape)
    xi[..., i, j] = v
    xi[..., j, i] = v
    return xi


@dataclass(frozen=True)
class SDEPaths:
    """Euler–Maruyama paths of the stopped process V_{t∧T}, with the stopping information.

    ``V`` is the covariance path tensor (paths, steps+1, m, m). The stopping times are returned beside
    it because a stopped path cannot be told apart from a live one by its values alone.
    This is a plain record, not a tensor: index ``V``.

    V: (paths, T, m, m), T = steps // record_every + 1, at `times` (T,); V[:, 0] = V0. Every entry
       is finite and PSD (up to round-off), never NaN: from its stop on, a path holds its last
       accepted value.
    stopped: (paths,) bool.
    stop_time: (paths,) the first grid time at which the proposal reached ‖V‖_F ≥ blowup (accepted
       if it is PSD) or was non-finite / not PSD (rejected); +inf for paths that never stopped.
    exploded: (paths,) bool, the stops whose finite proposal reached ‖V‖_F ≥ blowup;
       stopped & ~exploded are the discretisation failures (lost PSD or overflowed), which a
       smaller step removes.
    """

    V: Tensor
    times: Tensor
    stopped: Tensor
    stop_time: Tensor
    exploded: Tensor


def simulate(kind: str, V0: Tensor, t: float = 1.0, steps: int = 200, paths: int = 1000, seed: int = 0, *,
             gamma: float, tau0: float = 1.0, c_plus: float = 0.0, c_minus: float = -1.0,
             method: str = "structured", blowup: float = 1e6, record_every: int = 1,
             dtype: torch.dtype = torch.float64, chunk: int = 1024) -> SDEPaths:
    """Euler–Maruyama for dV = b(V) dt + Σ(V)^{1/2} dB on [0, t] with `steps` steps, V0 (m, m).

    Returns `SDEPaths`: ``.V`` is the path tensor (paths, steps // record_every + 1, m, m), the
    covariance recorded every `record_every`-th step, finite everywhere (stopped paths hold their
    last accepted value); ``.times``, ``.stopped``, ``.stop_time`` and ``.exploded`` say which
    paths stopped, when, and why (‖V‖_F ≥ blowup, or a non-finite / non-PSD Euler proposal). Paths
    run in chunks of `chunk` (cache-sized batches); results are deterministic given seed and chunk.
    """
    kind = _kind(kind)
    check_params(gamma, tau0, c_plus, c_minus)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, value in (("steps", steps), ("paths", paths), ("record_every", record_every), ("chunk", chunk)):
        if check_value(value, int, name) < 1:
            raise ValueError(invalid(name, value, ">= 1"))
    check_value(seed, int, "seed")
    if steps % record_every:
        raise ValueError(f"record_every={record_every} must divide steps={steps}")
    if not (math.isfinite(check_value(t, float, "t")) and t > 0):
        raise ValueError(invalid("t", t, "a finite number > 0"))
    if not (isinstance(blowup, (int, float)) and not isinstance(blowup, bool) and blowup > 0):
        raise ValueError(invalid("blowup", blowup, "> 0 (inf: never stop a path for its size)"))
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    try:
        V0 = torch.as_tensor(V0)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"V0 must be a real (m, m) matrix (a tensor or nested lists of numbers), "
                         f"got {type(V0).__name__}") from e
    if V0.is_complex():
        raise ValueError(f"V0 must be a real (m, m) matrix, got a {V0.dtype} tensor")
    V0 = V0.to(dtype)
    if V0.ndim != 2:
        raise ValueError(f"V0 must have shape (m, m), got {tuple(V0.shape)}")
    check_covariance(V0)
    m = V0.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    out = V0.new_empty(paths, steps // record_every + 1, m, m)
    stopped = torch.zeros(paths, dtype=torch.bool)
    stop_time = torch.full((paths,), math.inf, dtype=dtype)
    exploded = torch.zeros(paths, dtype=torch.bool)
    params = dict(gamma=gamma, tau0=tau0, c_plus=c_plus, c_minus=c_minus)
    for lo in range(0, paths, chunk):
        rows = slice(lo, min(lo + chunk, paths))
        _euler_maruyama(kind, method, V0, t / steps, blowup, record_every, gen, params,
                        out[rows], stopped[rows], stop_time[rows], exploded[rows])
    times = torch.arange(steps // record_every + 1, dtype=dtype) * (t / steps * record_every)
    return SDEPaths(V=out, times=times, stopped=stopped, stop_time=stop_time, exploded=exploded)


def _euler_maruyama(kind: str, method: str, V0: Tensor, h: float, blowup: float, record_every: int,
                    gen: torch.Generator, params: dict, out: Tensor, stopped: Tensor, stop_time: Tensor,
                    exploded: Tensor) -> None:
    """Fill out (P, T, m, m), stopped, stop_time and exploded (P,) in place for one chunk of P paths."""
    P, m = out.shape[0], V0.shape[-1]
    gamma, tau0 = params["gamma"], params["tau0"]
    V = V0.expand(P, m, m).clone()
    R = psd_root(V)[0]
    out[:, 0] = V
    g = torch.empty((P, m, m) if method == "structured" else (P, m * (m + 1) // 2), dtype=V.dtype)
    for k in range(1, (out.shape[1] - 1) * record_every + 1):
        torch.randn(g.shape, generator=gen, dtype=g.dtype, out=g)
        if method == "structured":
            proposal = structured_noise(kind, V, g, gamma=gamma, tau0=tau0, root=R)
        else:
            proposal = naive_noise(kind, V, g, gamma=gamma, tau0=tau0)
        proposal.mul_(math.sqrt(h)).add_(_drift(kind, V, gamma, tau0, params["c_plus"], params["c_minus"]),
                                         alpha=h).add_(V)
        if bool(stopped.any()):  # frozen paths propose their own value, which is finite and PSD
            proposal = torch.where(stopped[:, None, None], V, proposal)
        R_new, ok = psd_root(proposal)
        big = torch.isfinite(proposal).all(-1).all(-1) & (torch.linalg.matrix_norm(proposal) >= blowup)
        newly = ~stopped & (~ok | big)
        stop_time[newly] = k * h
        exploded |= newly & big
        stopped |= newly
        if bool(ok.all()):
            V, R = proposal, R_new
        else:
            V = torch.where(ok[:, None, None], proposal, V)
            R = torch.where(ok[:, None, None], R_new, R)
        if k % record_every == 0:
            out[:, k // record_every] = V
