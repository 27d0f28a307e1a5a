"""Gaussian-logit softmax functionals at a large logit scale β, where the softmax is near hard-max.

Rows (`LogRowSums`). The monomial sums of `softmax.RowSums`,

    Σ_{distinct j_1..j_k} E[Π S_j^a z_j^q] = n^(k) ∫ t^{A−1}/(A−1)! Π φ_{a,q}(t) M(t)^{n−k} dt,   S = softmax(βz),

are computed in the log domain. With τ = log t and y = βz + τ (the log of t·e^{βz}) the key's kernel is fixed,
u^a e^{−u} with u = e^y, and the Gaussian moves instead:

    φ̂_{a,q}(τ) = t^a φ_{a,q}(t) = (1/β) ∫ e^{ay − e^y} φ(ζ) ζ^q dy,   ζ = (y − τ)/β,
    1 − M(τ) = ∫ e^{v − e^v} Φ((τ − v)/β) dv      (M = P(βz + τ < log E), log E of E ~ Exp(1) has density e^{v−e^v}),
    Σ … = n^(k)/(A−1)! ∫ Π φ̂_{a_i,q_i}(τ) M(τ)^{n−k} dτ      (t^{A−1} dt Π φ = dτ Π φ̂: the t's cancel).

Every integrand is a product of the kernel e^{ay−e^y}, analytic in |Im y| < π/2, and smooth Gaussian factors, so the
trapezoid rule in y (step 1/4) converges like e^{−π²/h} ≈ 1e-17, at every β. In τ the integrand is the kernel
convolved with a Gaussian of width β: its spectrum falls like e^{−β²ω²/2} besides the kernel's e^{−π|ω|/2}, so the
τ step may grow with β (β/16 once past 1/4) and a row costs the same few hundred nodes at β = 4 and β = 10⁶. The
τ range covers every z within ±8.5 (Gaussian weight 1e-16) of the kernel's support y ∈ [−40, 4]. No expansion in
1/β is made: the formula is exact, the hard-max limit (S → the indicator of the largest logit, ΣS² → 1,
ΣS_jz_j → max_j z_j) is where it goes as β → ∞. Where the quadrature of `softmax` (Gauss–Hermite in z against a
kernel of width 1/β in z) loses accuracy, β ≳ 4, this one does not; below β ≈ 1/2 the Gaussian becomes narrower
than the y step and `softmax`'s own quadrature is the right one.

Pairs (`LogPairSums`): two queries with logits βz, βz' (z' = ρz + σw, σ = √(1−ρ²)) on shared keys need a key
factor of two Laplace variables, φ(τ, τ') = E[z^qz w^qw k_a(βz + τ) k_b(βz' + τ')], k_a(y) = e^{ay − e^y}: a sum
over a z grid of step 0.4/β against the one-variable inner integral J(c) = E_w[w^qw k_b(c + βσw)], c = τ' + βρz
(class docstring). Its z grid grows with β, so `softmax.large_beta_pairs` uses it up to a cap and extrapolates
beyond to the hard-max limit:

Pairs at β = ∞ (`pair_limits`): n1 shared keys, the second query with n2 − n1 keys of its own. Each softmax is
the indicator of its argmax (j* over the shared keys for z, j'* over all n2 keys for z'), so S_jS'_j =
1[j = j* = j'*], the Jacobians Q = diag S − SSᵀ vanish and

    K1 = P(j* = j'*) = n1 ∫∫ φ₂(a, b) Φ₂(a, b)^{n1−1} Φ(b)^{n2−n1} da db,
    K2 = E[1(j'* shared) ⟨ξ_j*, ξ_j'*⟩],  ξ = (z, w),   CK = E tr(Q Q') = 0,

with φ₂, Φ₂ the density and CDF of (z, z'). K2 splits into the same key (j* = j'*: (z² + w²) under the K1
integrand) and two shared keys, A the largest z (z_A = a, z'_A < b) and B the largest z' (z'_B = b, z_B < a):

    n1(n1−1) ∫∫ Φ₂(a, b)^{n1−2} Φ(b)^{n2−n1} ⟨E[ξ_A; z_A = a, z'_A < b], E[ξ_B; z'_B = b, z_B < a]⟩ da db,

whose inner factors are truncated-Gaussian first moments in closed form: with c = (b − ρa)/σ, e = (a − ρb)/σ,
E[ξ_A; …] = φ(a)(aΦ(c), −φ(c)) and E[ξ_B; …] = φ(b)(ρbΦ(e) − σφ(e), bσΦ(e) + ρφ(e)). The integrals run over
(a, w), b = ρa + σw, on a tensor Gauss–Legendre rule on [−8.5, 8.5]², with Φ₂ from Owen's T function.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

Y_STEP = 0.25                 # trapezoid step in y = βz + log t (error ~ e^{−π²/h})
Y_RANGE = (-40.0, 4.0)        # support of the kernels e^{ay − e^y}, a >= 1, to 1e-17
Z_EDGE = 8.5                  # Gaussian nodes beyond |z| = 8.5 weigh < 1e-16
Index1 = tuple[int, int]      # (a, q): S^a z^q


def _falling(n: np.ndarray, k: int) -> np.ndarray:
    out = np.ones_like(n, dtype=float)
    for i in range(k):
        out = out * (n - i)
    return out


def _power(log_base: np.ndarray, p: float | np.ndarray) -> np.ndarray:
    """base^p from log base, with base^0 = 1 where base = 0."""
    with np.errstate(invalid="ignore"):
        return np.where(np.asarray(p) > 0, np.exp(log_base * p), 1.0)


def _tau_grid(beta: float) -> tuple[np.ndarray, float]:
    """Uniform τ nodes and their step: every z in ±Z_EDGE meets the kernel's support."""
    h = max(Y_STEP, beta / 16)
    lo, hi = Y_RANGE[0] - Z_EDGE * beta - 2 * h, Y_RANGE[1] + Z_EDGE * beta + 2 * h
    return np.arange(lo, hi + h, h), h


class LogRowSums:
    """`softmax.RowSums` for logits βz, z ~ N(0, 1), by the log-domain quadrature of the module docstring; accurate
    for β >= 1/2 and without upper limit (n: array of key counts)."""

    def __init__(self, beta2: float, n: np.ndarray) -> None:
        # scipy loads on first use here, not with the theory (the light commands import the theory)
        from scipy.special import ndtr

        self.n = np.asarray(n, dtype=float)
        self.beta = beta = math.sqrt(beta2)
        self.tau, self.h = _tau_grid(beta)
        self.y = np.arange(Y_RANGE[0], Y_RANGE[1] + Y_STEP / 2, Y_STEP)
        self.zeta = (self.y[None, :] - self.tau[:, None]) / beta                         # (T, Y)
        self.gauss = np.exp(-0.5 * self.zeta ** 2) / math.sqrt(2 * math.pi) / beta * Y_STEP
        upper = Y_STEP * ndtr(-self.zeta) @ np.exp(self.y - np.exp(self.y))           # 1 − M(τ)
        with np.errstate(divide="ignore"):
            self.log_m = np.log1p(-np.minimum(upper, 1.0))
        self._phi: dict[Index1, np.ndarray] = {}
        self._powers: dict[int, np.ndarray] = {}

    def phi(self, a: int, q: int) -> np.ndarray:
        """φ̂_{a,q}(τ) on the τ nodes (a >= 1)."""
        if (a, q) not in self._phi:
            kernel = np.exp(a * self.y - np.exp(self.y))
            self._phi[(a, q)] = (self.gauss * self.zeta ** q) @ kernel
        return self._phi[(a, q)]

    def __call__(self, *idx: Index1) -> np.ndarray:
        """Σ over distinct indices of E[Π_j S_j^{a_j} z_j^{q_j}], one value per n."""
        k, big_a = len(idx), sum(a for a, _ in idx)
        f = np.full(len(self.tau), self.h / math.factorial(big_a - 1))
        for a, q in idx:
            f = f * self.phi(a, q)
        if k not in self._powers:                                          # M^{n−k}: the other keys, (T, N)
            self._powers[k] = _power(self.log_m[:, None], np.maximum(self.n - k, 0.0))
        total = f @ self._powers[k]
        return np.where(self.n >= k, _falling(self.n, k) * total, 0.0)


@lru_cache(maxsize=4)
def _legendre(n: int, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(n)
    return lo + (hi - lo) * (x + 1) / 2, w * (hi - lo) / 2


def _bivariate_cdf(h: np.ndarray, k: np.ndarray, rho: float) -> np.ndarray:
    """Φ₂(h, k; ρ) = P(z < h, z' < k) by Owen's T function (Owen 1956):
    ½(Φ(h) + Φ(k)) − T(h, (k − ρh)/(hσ)) − T(k, (h − ρk)/(kσ)) − ½·1[hk < 0]."""
    from scipy.special import ndtr, owens_t

    sig = math.sqrt(1 - rho * rho)
    h = np.where(h == 0, 1e-300, h)
    k = np.where(k == 0, 1e-300, k)
    out = 0.5 * (ndtr(h) + ndtr(k)) - owens_t(h, (k - rho * h) / (h * sig)) - owens_t(k, (h - rho * k) / (k * sig))
    return np.clip(out - 0.5 * (h * k < 0), 0.0, 1.0)


def pair_limits(rho: float, pairs: np.ndarray, nodes: int = 96) -> dict[str, float]:
    """K1, K2, CK at β = ∞ (module docstring), averaged over the ordered key counts (n1, n2) of ``pairs``.

    Both integrals run over (a, w) with b = ρa + σw (σ = √(1 − ρ²)), so that the pair's density φ₂ da db =
    φ(a)φ(w) da dw and the two-key term's σφ(a)φ(b) da dw stay smooth as ρ → 1; ρ = 1 is the single query."""
    from scipy.special import ndtr

    pairs = np.asarray(pairs, dtype=float).reshape(-1, 2)
    n1, gap = pairs[:, 0], pairs[:, 1] - pairs[:, 0]
    x, wx = _legendre(nodes, -Z_EDGE, Z_EDGE)
    a, w = x[:, None], x[None, :]
    dens = (np.exp(-0.5 * (a * a + w * w)) / (2 * math.pi)) * (wx[:, None] * wx[None, :])      # φ(a)φ(w) da dw
    if rho >= 1 - 1e-12:                              # one query: the same argmax whenever it is shared
        lm = np.log(np.maximum(ndtr(x), 1e-300))
        f = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * wx
        k1 = n1 * (np.exp((n1[:, None] + gap[:, None] - 1) * lm[None, :]) @ f)
        k2 = n1 * (np.exp((n1[:, None] + gap[:, None] - 1) * lm[None, :]) @ (f * x * x)) + k1     # E w² = 1
        return {"K1": float(k1.mean()), "K2": float(k2.mean()), "CK": 0.0}
    sig = math.sqrt(1 - rho * rho)
    b = rho * a + sig * w
    log_both = np.log(np.maximum(_bivariate_cdf(np.broadcast_to(a, b.shape), b, rho), 1e-300))
    own_cdf = ndtr(b)
    c, e = w, a * sig - rho * w                       # (b − ρa)/σ and (a − ρb)/σ
    phi_c, phi_e = np.exp(-0.5 * c * c) / math.sqrt(2 * math.pi), np.exp(-0.5 * e * e) / math.sqrt(2 * math.pi)
    phi_b = np.exp(-0.5 * b * b) / math.sqrt(2 * math.pi)
    inner = (a * ndtr(c) * (rho * b * ndtr(e) - sig * phi_e) - phi_c * (b * sig * ndtr(e) + rho * phi_e))
    two = sig * np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi) * phi_b * inner * (wx[:, None] * wx[None, :])
    k1 = k2 = 0.0
    for m1 in np.unique(n1):                          # the pairs with this n1: Σ over their gaps of Φ(b)^gap
        per_gap = np.bincount(gap[n1 == m1].astype(int))
        own = np.polynomial.polynomial.polyval(own_cdf, per_gap)
        one = np.exp((m1 - 1) * log_both) * own
        k1 += m1 * float((dens * one).sum())
        k2 += m1 * float((dens * one * (a * a + w * w)).sum())
        if m1 >= 2:
            k2 += m1 * (m1 - 1) * float((two * np.exp((m1 - 2) * log_both) * own).sum())
    return {"K1": float(k1) / len(pairs), "K2": float(k2) / len(pairs), "CK": 0.0}


Index2 = tuple[int, int, int, int]     # (a, b, qz, qw): S^a S'^b z^qz w^qw
C_STEP = 0.01                          # lattice of the inner integral J(c), read by linear interpolation


def _kernel(a: int, y: np.ndarray) -> np.ndarray:
    """e^{ay − e^y} (a >= 1), or e^{−e^y} (a = 0)."""
    return np.exp(a * y - np.exp(np.minimum(y, 50.0)))


class LogPairSums:
    """`softmax.PairSums` for one ρ by the log-domain quadrature (module docstring), for β >= 1/2.

    A key's factor φ(τ, τ') = E[z^qz w^qw k_a(βz + τ) k_b(βz' + τ')] (k_a(y) = e^{ay − e^y}, z' = ρz + σw) is a sum
    over a z grid of step 0.4/β (the kernel in z has width 1/β: error e^{−π²/0.4}) of k_a(βz + τ) times the inner
    w-integral J(c) = E_w[w^qw k_b(c + βσw)], c = τ' + βρz, a function of one variable: the trapezoid in y' = c + βσw
    (as for rows) when βσ >= 1, else Gauss–Hermite in w (the kernel then varies on a scale 1/(βσ) >= 1), tabulated on
    a lattice of step C_STEP and read linearly. E_w[w k_0(c + βσw)] = −βσ J_{1,0}(c) (Stein). The keys' product
    M_both = E[k_0 k_0'] is taken through 1 − M_both = (1 − M) + (1 − M') − E[(1 − k_0)(1 − k_0')], exact where
    it is small."""

    def __init__(self, beta2: float, rho: float, pairs: np.ndarray) -> None:
        self.pairs = np.asarray(pairs, dtype=float).reshape(-1, 2)
        self.beta = beta = math.sqrt(beta2)
        self.rho, self.sig = rho, math.sqrt(max(0.0, 1 - rho * rho))
        self.tau, self.h = _tau_grid(beta)
        hz = min(Y_STEP, 0.4 / beta)
        self.z = np.arange(-Z_EDGE, Z_EDGE + hz / 2, hz)
        self.wz = hz * np.exp(-0.5 * self.z ** 2) / math.sqrt(2 * math.pi)
        self.y = np.arange(Y_RANGE[0], Y_RANGE[1] + Y_STEP / 2, Y_STEP)
        self.arg = beta * self.z[None, :] + self.tau[:, None]                            # (T, Z): βz + τ
        self.c = self.tau[None, :] + beta * rho * self.z[:, None]                        # (Z, T'): τ' + βρz
        self._j: dict[tuple[int | str, int], np.ndarray] = {}
        self._lattice: tuple[np.ndarray, dict[str, np.ndarray]] | None = None
        rows = LogRowSums(beta2, np.ones(1))
        upper = -np.expm1(rows.log_m)                                                    # 1 − M(τ)
        u = self._outer(-np.expm1(-np.exp(np.minimum(self.arg, 50.0))), 0) @ self._inner("upper", 0)
        with np.errstate(divide="ignore"):
            self.log_both = np.log1p(-np.clip(upper[:, None] + upper[None, :] - u, 0.0, 1.0))
        self.log_own = rows.log_m                                                        # a key only query 2 sees
        n1, n2 = self.pairs[:, 0].astype(int), self.pairs[:, 1].astype(int)
        self.n1, where = np.unique(n1, return_inverse=True)
        self.counts = np.zeros((len(self.n1), int((n2 - n1).max()) + 1))               # pairs per (n1, n2 − n1)
        np.add.at(self.counts, (where, n2 - n1), 1.0)
        self._phi: dict[Index2, np.ndarray] = {}
        self._shared: dict[int, np.ndarray] = {}

    def _outer(self, kernel: np.ndarray, qz: int) -> np.ndarray:
        return kernel * (self.wz * self.z ** qz)[None, :]

    def _inner(self, b: int | str, qw: int) -> np.ndarray:
        """J(c) on the (Z, T') matrix c; b = "upper": E[1 − k_0(c + βσw)]."""
        if (b, qw) in self._j:
            return self._j[(b, qw)]
        if b == 0 and qw == 1:
            out = -self.beta * self.sig * self._inner(1, 0)
        else:
            lattice, base = self._base()
            if self.beta * self.sig >= 1.0:
                if b in (0, "upper"):             # E k_0 = P(log E > c + sw), log E of density e^{v − e^v}
                    vals = (base["cdf"] if b == 0 else 1.0 - base["cdf"]) @ (Y_STEP * _kernel(1, self.y))
                else:
                    vals = (base["gauss"] * base["w"] ** qw) @ (Y_STEP * _kernel(b, self.y))
            else:
                arg = base["arg"]
                kern = -np.expm1(-np.exp(arg)) if b == "upper" else _kernel(int(b), arg)
                vals = kern @ (base["wx"] * base["x"] ** qw)
            out = np.interp(self.c, lattice, vals)
        self._j[(b, qw)] = out
        return out

    def _base(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The c lattice (step C_STEP·max(1, βσ): J varies on the scale max(1, βσ)) and the w-rule on it."""
        if self._lattice is None:
            from scipy.special import ndtr

            s = self.beta * self.sig
            step = C_STEP * max(1.0, s)
            lattice = np.arange(self.c.min() - step, self.c.max() + 2 * step, step)
            if s >= 1.0:
                w = (self.y[None, :] - lattice[:, None]) / s                                  # (C, Y)
                base = {"w": w, "gauss": np.exp(-0.5 * w * w) / (math.sqrt(2 * math.pi) * s), "cdf": ndtr(w)}
            else:
                x, wx = np.polynomial.hermite_e.hermegauss(60)
                base = {"x": x, "wx": wx / wx.sum(), "arg": lattice[:, None] + s * x[None, :]}
            self._lattice = lattice, base
        return self._lattice

    def phi(self, a: int, b: int, qz: int, qw: int) -> np.ndarray:
        key = (a, b, qz, qw)
        if key not in self._phi:
            self._phi[key] = self._outer(_kernel(a, self.arg), qz) @ self._inner(b, qw)   # (T, T')
        return self._phi[key]

    def _keys_outside(self, k: int) -> np.ndarray:
        """Σ_pairs n1^(k) M_both^{n1−k} M^{n2−n1}, (T, T'), averaged over the pairs."""
        out = np.zeros_like(self.log_both)
        for n1, per_gap in zip(self.n1, self.counts):
            if n1 < k:
                continue
            own = sum(c * _power(self.log_own, g) for g, c in enumerate(per_gap) if c)          # (T',)
            out += math.perm(int(n1), k) * _power(self.log_both, n1 - k) * own[None, :]
        return out / len(self.pairs)

    def __call__(self, *idx: Index2) -> float:
        """Pair-averaged Σ over distinct shared indices of E[Π S_j^a S'_j^b z_j^qz w_j^qw] (a, b totals >= 1)."""
        k = len(idx)
        big_a, big_b = sum(i[0] for i in idx), sum(i[1] for i in idx)
        f = self.phi(*idx[0])
        for i in idx[1:]:
            f = f * self.phi(*i)
        if k not in self._shared:
            self._shared[k] = self._keys_outside(k)
        scale = self.h * self.h / (math.factorial(big_a - 1) * math.factorial(big_b - 1))
        return float((f * self._shared[k]).sum()) * scale
