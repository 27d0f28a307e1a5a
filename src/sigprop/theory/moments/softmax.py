"""Softmax over L entries, and the Gaussian-logit softmax functionals attention is built on.

Softmax is shift invariant, so for exchangeable Gaussian logits with variance σ² and pairwise
correlation r only the centred vector matters, which is that of i.i.d. logits β z_j, z_j ~ N(0,1),
with β² = (1−r)σ². Every moment we need is a sum of monomials E[Π_j S_j^{a_j} z_j^{q_j}] over
distinct indices, S = softmax(βz). With 1/D^A = ∫₀^∞ t^{A−1} e^{−tD} dt / (A−1)! (D = Σ e^{βz_j})
the expectation factorizes over indices (exact, no large-L or log-normal approximation):

    Σ_{distinct j_1..j_k} E[Π S_{j}^{a} z_{j}^{q}] = n^(k) ∫ t^{A−1}/(A−1)! Π φ_{a,q}(t) M(t)^{n−k} dt,
    φ_{a,q}(t) = E[z^q e^{aβz} e^{−t e^{βz}}],  M = φ_{0,0},  A = Σ a,  n^(k) = n(n−1)…(n−k+1).

The t-integral is a trapezoid rule in log t, the z-expectations Gauss–Hermite; both converge
exponentially (checked against direct Monte Carlo of the softmax to 1e-5). The row sums also take logits
z = √k·t with t one coordinate of a uniform unit vector in k dimensions (``dof`` = k: the keys of a normalized
head, `qk_norm`), density ∝ (1 − t²)^{(k−3)/2}, by Gauss–Gegenbauer nodes. Contractions use
``np.einsum`` rather than BLAS: the shapes are small and threaded BLAS stalls on a loaded machine. Two queries whose
logits βz_j and βz'_j, z' = ρz + √(1−ρ²)w, share keys need two Laplace variables (t, t').

`Softmax` moments (input var σ², corr r, any mean; v = (1−r)σ²):
    mean 1/L,  var = E[ΣS²]/L − 1/L²,  corr = −1/(L−1)  (ΣS = 1);
    backward g' = S ⊙ (g − ⟨S, g⟩): σ_g'² = (1−r_g)σ_g² E[ΣS² − 2ΣS³ + (ΣS²)²]/L,  r_g' = −1/(L−1).
The authors' V1 (e^v − 1)/L² and V2 forms are approximations (and their backward keeps only the
diagonal S_k g_k, missing −2ΣS³ + (ΣS²)², which dominate once e^{2v} ≳ L); see docs/moments.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .hardmax import LogPairSums, LogRowSums, pair_limits
from .state import Component, Moments, check_size, replace

QUADRATURE_BETA_MAX = 4.0     # largest logit scale of the Gauss–Hermite quadrature here (pair functionals 1e-5 at
                              # β = 3, 1e-2 at β = 4); beyond it the log-domain quadrature of `hardmax`
PAIR_BETA_CAP = 16.0          # pairs beyond β = 4: `hardmax.LogPairSums` up to here, then extrapolated to β = ∞
Index1 = tuple[int, int]               # (a, q): S^a z^q
Index2 = tuple[int, int, int, int]     # (a, b, qz, qw): S^a S'^b z^qz w^qw


def _falling(n: np.ndarray, k: int) -> np.ndarray:
    out = np.ones_like(n, dtype=float)
    for i in range(k):
        out = out * (n - i)
    return out


def _t_grid(beta2: float, n_max: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes t and trapezoid weights (dt = t dlog t), scaled so that t·E[e^{βz}] spans e^{−14}/n .. e^{6+6β}."""
    tau = np.arange(-math.log(n_max) - 14.0, 6.0 + 6.0 * math.sqrt(beta2) + h, h)
    t = np.exp(tau - beta2 / 2)
    return t, h * t


@lru_cache(maxsize=8)
def _hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / w.sum()


@lru_cache(maxsize=64)
def _sphere(n: int, dof: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes z = √k·t and weights for t with density ∝ (1 − t²)^a, a = (k − 3)/2 (a coordinate of a uniform unit
    vector in k dimensions, so Var z = 1): Golub–Welsch on the Gegenbauer recurrence."""
    a, i = (dof - 3) / 2, np.arange(1, n)
    off = np.sqrt(i * (i + 2 * a) / ((2 * i + 2 * a - 1) * (2 * i + 2 * a + 1)))
    t, vec = np.linalg.eigh(np.diag(off, 1) + np.diag(off, -1))
    w = vec[0] ** 2
    return math.sqrt(dof) * t, w / w.sum()


class RowSums:
    """Softmax functionals of one query over n i.i.d. logits βz (n: array of key counts): z ~ N(0, 1), or with
    ``dof`` = k > 0 a sphere coordinate √k·t (module docstring)."""

    def __init__(self, beta2: float, n: np.ndarray, h: float = 0.2, nodes: int = 80, dof: int = 0) -> None:
        self.n = np.asarray(n, dtype=float)
        self.t, self.wt = _t_grid(beta2, float(self.n.max()), h)
        self.z, wz = _sphere(nodes, dof) if dof else _hermite(nodes)
        self.ez = np.exp(math.sqrt(beta2) * self.z)
        self.kernel = np.exp(-self.t[:, None] * self.ez[None, :]) * wz     # (T, Z)
        self.m = self.kernel.sum(1)
        self._phi: dict[Index1, np.ndarray] = {}
        self._powers: dict[int, np.ndarray] = {}

    def phi(self, a: int, q: int) -> np.ndarray:
        if (a, q) not in self._phi:
            self._phi[(a, q)] = np.einsum("tz,z->t", self.kernel, self.ez ** a * self.z ** q, optimize=False)
        return self._phi[(a, q)]

    def __call__(self, *idx: Index1) -> np.ndarray:
        """Σ over distinct indices of E[Π_j S_j^{a_j} z_j^{q_j}], one value per n."""
        k, big_a = len(idx), sum(a for a, _ in idx)
        f = self.wt * self.t ** (big_a - 1) / math.factorial(big_a - 1)
        for a, q in idx:
            f = f * self.phi(a, q)
        if k not in self._powers:                                          # M^{n−k}: the other keys, (T, N)
            self._powers[k] = self.m[:, None] ** np.maximum(self.n[None, :] - k, 0.0)
        total = np.einsum("t,tn->n", f, self._powers[k], optimize=False)
        return np.where(self.n >= k, _falling(self.n, k) * total, 0.0)


class PairSums:
    """Softmax functionals of two queries with logits βz, βz' (z' = ρz + √(1−ρ²)w) on shared keys,
    averaged over the ordered key counts (n1, n2) of ``pairs``: query 1 sees n1 keys, query 2 the same
    n1 keys plus n2 − n1 keys of its own (causal masking); indices run over the shared keys. ``rho``
    is one correlation or an array of R of them, evaluated together (same t grid: it depends on β only).

    Per key, φ(t, t') = E[f(z, w) e^{−t e^{βz} − t' e^{βz'}}] on a (z, w) Gauss–Hermite grid is
    contracted in two steps, over w at fixed z (only e^{βz'} depends on w), then over z: O(T Z W)
    instead of O(T² Z W). The sum over pairs is a Horner recursion in n1. Step h = 0.6 in log t (against
    h = 0.2: docs/moments.md §3)."""

    def __init__(self, beta2: float, rho: float | np.ndarray, pairs: np.ndarray, h: float = 0.6,
                 nodes: int = 24) -> None:
        self.pairs = np.asarray(pairs, dtype=float).reshape(-1, 2)
        self.t, self.wt = _t_grid(beta2, float(self.pairs.max()), h)
        self.x, self.wx = _hermite(nodes)
        b, rho = math.sqrt(beta2), np.atleast_1d(np.asarray(rho, dtype=float))
        self.e1 = np.exp(b * self.x)                                                   # (Z,)
        self.e2 = np.exp(b * (rho[:, None, None] * self.x[:, None]
                              + np.sqrt(np.maximum(0.0, 1 - rho * rho))[:, None, None] * self.x[None, :]))  # (R, Z, W)
        self.k1 = np.exp(-self.t[:, None] * self.e1[None, :])                          # (T, Z)
        self.k2t = np.exp(-self.t[None, None, :, None] * self.e2[:, :, None, :])       # (R, Z, T', W)
        # (R, T'): a key only query 2 sees
        m2 = self.wx @ (self.k2t @ self.wx)
        n1, n2 = self.pairs[:, 0].astype(int), self.pairs[:, 1].astype(int)
        self.n1, where = np.unique(n1, return_inverse=True)
        counts = np.zeros((len(self.n1), int((n2 - n1).max()) + 1))                   # pairs per (n1, n2 − n1)
        np.add.at(counts, (where, n2 - n1), 1.0)
        powers = m2[:, None, :] ** np.arange(counts.shape[1])[None, :, None]           # (R, gap, T')
        r, g, t = powers.shape                                             # Σ_{pairs with this n1} m2^{n2 − n1}
        self.extra = (counts @ powers.transpose(1, 0, 2).reshape(g, r * t)).reshape(-1, r, t)
        self._phi: dict[Index2, np.ndarray] = {}
        self._shared: dict[int, np.ndarray] = {}

    def phi(self, a: int, b: int, qz: int, qw: int) -> np.ndarray:
        key = (a, b, qz, qw)
        if key not in self._phi:
            inner = self.k2t @ (self.e2 ** b * (self.wx * self.x ** qw))[..., None]      # (R, Z, T', 1)
            outer = self.k1 * (self.wx * self.e1 ** a * self.x ** qz)[None, :]
            self._phi[key] = outer @ inner[..., 0]                                       # (R, T, T')
        return self._phi[key]

    def _keys_outside(self, k: int) -> np.ndarray:
        """Σ_n1 n1^(k) M_both^{n1−k} Σ_n2 M_2^{n2−n1}, (R, T, T'): the keys outside a k-index monomial (Horner in
        n1)."""
        both, last = self.phi(0, 0, 0, 0), None
        out = np.zeros_like(both)
        for n1, extra in zip(self.n1[::-1], self.extra[::-1]):          # descending n1
            if n1 < k:
                break
            if last is not None:
                out *= both if last - n1 == 1 else both ** (last - n1)
            out += math.perm(int(n1), k) * extra[:, None, :]
            last = n1
        return out if last is None else out * both ** (last - k)

    def __call__(self, *idx: Index2) -> np.ndarray:
        """Pair-averaged Σ over distinct shared indices of E[Π S_j^a S'_j^b z_j^qz w_j^qw] (a, b totals >= 1),
        one value per ρ."""
        k = len(idx)
        big_a, big_b = sum(i[0] for i in idx), sum(i[1] for i in idx)
        wa = self.wt * self.t ** (big_a - 1) / math.factorial(big_a - 1)
        wb = self.wt * self.t ** (big_b - 1) / math.factorial(big_b - 1)
        f = self.phi(*idx[0])
        for i in idx[1:]:
            f = f * self.phi(*i)
        if k not in self._shared:
            self._shared[k] = self._keys_outside(k)
        return np.einsum("rts,ts->r", f * self._shared[k], np.outer(wa, wb), optimize=False) / len(self.pairs)


def row_functionals(beta2: float, n: np.ndarray, dof: int = 0) -> dict[str, np.ndarray]:
    """Per key count n: F2 = EΣS², F3 = EΣS³, F22 = E(ΣS²)², B = F2 − 2F3 + F22 (softmax-Jacobian
    trace E tr Q², Q = diag S − SSᵀ), Z1 = E(ΣSz)², Z2 = EΣS²z², Bz = E|Qz|², Bzz = EΣ_l (Q²)_ll z_l²; Gaussian
    logits, or sphere coordinates in ``dof`` dimensions (`RowSums`).
    (E[z̄ ΣSz] = 1/n exactly for Gaussian logits, by Stein's lemma and Σ_k ∂S_j/∂z_k = 0.)"""
    if beta2 <= QUADRATURE_BETA_MAX ** 2:
        s: RowSums | LogRowSums = RowSums(beta2, n, dof=dof)
    elif dof:
        raise NotImplementedError(f"qk_norm softmax rows at logit scale β = {math.sqrt(beta2):.3g} > "
                                  f"{QUADRATURE_BETA_MAX}: the sphere-coordinate logits have no large-β quadrature")
    else:
        s = LogRowSums(beta2, n)
    f2, z2 = s((2, 0)), s((2, 2))
    out = {"F2": f2, "F3": s((3, 0)), "F22": s((4, 0)) + s((2, 0), (2, 0)), "Z2": z2,
           "Z1": z2 + s((1, 1), (1, 1))}
    out["B"] = f2 - 2 * out["F3"] + out["F22"]
    out["Bz"] = (z2 - 2 * (s((3, 2)) + s((2, 1), (1, 1)))
                 + s((4, 2)) + 2 * s((3, 1), (1, 1)) + s((2, 0), (2, 2)) + s((2, 0), (1, 1), (1, 1)))
    out["Bzz"] = z2 - 2 * s((3, 2)) + s((4, 2)) + s((2, 2), (2, 0))     # (Q²)_ll = (S_l − S_l²)² + S_l² Σ_{m≠l} S_m²
    return out


def _pair_terms(s: PairSums | LogPairSums) -> dict[str, np.ndarray | float]:
    """K1 = EΣS_jS'_j, K2 = E⟨ΣS_jξ_j, ΣS'_jξ_j⟩ (ξ_j = (z_j, w_j)), CK = E tr(Q Q') from the monomial sums ``s``."""
    k1 = s((1, 1, 0, 0))
    k2 = s((1, 1, 2, 0)) + s((1, 1, 0, 2)) + s((1, 0, 1, 0), (0, 1, 1, 0)) + s((1, 0, 0, 1), (0, 1, 0, 1))
    ck = k1 - s((2, 1, 0, 0)) - s((1, 2, 0, 0)) + s((2, 2, 0, 0)) + s((1, 1, 0, 0), (1, 1, 0, 0))
    return {"K1": k1, "K2": k2, "CK": ck}


@lru_cache(maxsize=256)
def _log_pairs(beta2: float, rho: float, pairs: bytes) -> dict[str, float]:
    return _pair_terms(LogPairSums(beta2, rho, np.frombuffer(pairs).reshape(-1, 2)))


@lru_cache(maxsize=256)
def _limits(rho: float, pairs: bytes) -> dict[str, float]:
    return pair_limits(rho, np.frombuffer(pairs).reshape(-1, 2))


def large_beta_pairs(beta2: float, rho: float, pairs: np.ndarray) -> dict[str, float]:
    """K1, K2, CK for β > QUADRATURE_BETA_MAX (one ρ): exact (`hardmax.LogPairSums`) up to β_c = PAIR_BETA_CAP;
    beyond, the near-tie expansion F(β) = F_∞ + c₂/β² + c₃/β³ about the hard-max limit F_∞ (`hardmax.pair_limits`),
    c₂ and c₃ from the exact values at β_c/2 and β_c. It starts at 1/β² for the pair functionals: a near tie of one
    query alone (probability ∝ 1/β) moves its weight between two keys that the other query, by the symmetry of the
    tied keys, reads alike, so the 1/β terms cancel; they remain for the rows (ΣS² = 1 − O(1/β)), which
    `hardmax.LogRowSums` computes exactly at every β."""
    key = np.ascontiguousarray(pairs, dtype=float).tobytes()
    if beta2 <= PAIR_BETA_CAP ** 2:
        return _log_pairs(beta2, rho, key)
    b1, b2 = PAIR_BETA_CAP / 2, PAIR_BETA_CAP
    far, one, two = _limits(rho, key), _log_pairs(b1 * b1, rho, key), _log_pairs(b2 * b2, rho, key)
    x, x1, x2 = 1 / math.sqrt(beta2), 1 / b1, 1 / b2
    out = {}
    for k, f_inf in far.items():                   # solve c₂x_i² + c₃x_i³ = F(β_i) − F_∞, i = 1, 2
        c2, c3 = np.linalg.solve([[x1 ** 2, x1 ** 3], [x2 ** 2, x2 ** 3]], [one[k] - f_inf, two[k] - f_inf])
        out[k] = f_inf + c2 * x * x + c3 * x ** 3
    return out


def pair_functionals(beta2: float, rho: float | np.ndarray, pairs: np.ndarray) -> dict[str, float | np.ndarray]:
    """Pair averages: K1 = EΣS_jS'_j, K2 = E⟨ΣS_jξ_j, ΣS'_jξ_j⟩ (ξ_j = (z_j, w_j)), CK = E tr(Q Q');
    floats for one ``rho``, arrays for an array of them. Beyond β = QUADRATURE_BETA_MAX: `large_beta_pairs`."""
    if beta2 <= QUADRATURE_BETA_MAX ** 2:
        out = _pair_terms(PairSums(beta2, rho, pairs))
    else:
        per = [large_beta_pairs(beta2, float(r), pairs) for r in np.atleast_1d(rho)]
        out = {k: np.array([f[k] for f in per]) for k in ("K1", "K2", "CK")}
    return out if np.ndim(rho) else {k: float(v[0]) for k, v in out.items()}


@dataclass(frozen=True)
class Softmax(Component):
    """Softmax over ``L`` entries (L >= 2); Moments describe the L entries (corr: between two entries)."""

    L: int

    def __post_init__(self) -> None:
        check_size("L", self.L, minimum=2)

    def _rows(self, m: Moments) -> dict[str, np.ndarray]:
        if m.corr < -1.0 / (self.L - 1):
            raise ValueError(f"corr of {self.L} exchangeable entries must be >= {-1 / (self.L - 1):.4g}, got {m.corr}")
        return row_functionals((1 - m.corr) * m.var, np.array([self.L]))

    def fwd(self, m: Moments) -> Moments:
        var = max(float(self._rows(m)["F2"][0]) / self.L - self.L ** -2, 0.0)
        return replace(m, mean=1.0 / self.L, var=var, corr=-1.0 / (self.L - 1))

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        jac = float(self._rows(m_in)["B"][0]) / self.L
        return replace(m_in, grad_var=(1 - g_out.grad_corr) * g_out.grad_var * jac, grad_corr=-1.0 / (self.L - 1))
