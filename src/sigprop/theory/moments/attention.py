"""Multi-head self-attention (standard or shaped), with Q/K/V/O projections: forward and backward.

Per head (d_k = d/H, weights N(0, σ_q²), N(0, σ_k²), N(0, σ_v²)), query i mixes the values of its
n_i visible keys (n_i = L, or i when causal) with the row a_ij = γ₁δ_ij + S'_ij − γ₂/n_i, where
S = softmax(q_i·k_j/τ) and S' = S ⊙ (Bernoulli mask)/(1−p) (attention dropout). Standard
attention: γ₁ = γ₂ = 0, τ² = d_k; shaped (`sigprop.nn.ShapedAttention`): τ² = τ₀² d d_k.

Derivation (docs/moments.md §attention). Write tokens x_j = m + s e_j with m shared by all
tokens (|m|² → d m₂, m₂ = μ² + rσ²) and e_j ~ N(0, I_d), s² = (1−r)σ². Given the query vector
u_i = W_k q_i/τ, the logits of query i are βz_j + const with z_j = e_j·û_i i.i.d. N(0,1) and
β² = s²|u_i|², β̄² = s² σ_q²σ_k² d² d_k (μ²+σ²)/τ². Two queries' z's have correlation
ρ = cos(u_i, u_i') ≈ m₂/(μ²+σ²). Splitting e_j along û_i (and the second query's direction, or
the value-gradient direction W_v g_i) and the d−1 (d−2) remaining directions, every moment is
exact in terms of the Gaussian-logit softmax functionals of `softmax.row_functionals`
(F2, Z1, Z2, B, Bz) and `softmax.pair_functionals` (K1, K2, CK):

  Var o = σ_v² ⟨c² d m₂ + s²((d−1)R_s + C_s)⟩_rows,   Cov o = σ_v² ⟨(γ₁−γ₂+1)² d m₂ + s²((d−2)R_c + C_c)⟩_pairs
  with c = Σ_j a_j; R_s = EΣa_j², C_s = E(Σa_j z_j)² (same row); R_c = EΣa_j a'_j, C_c the
  coupling ⟨Σa_jξ_j, Σa'_jξ_j⟩ (two rows); expanded in `_forward` (E[z̄ΣSz] = 1/n exactly).
  Backward = V path + Q path + K path (their cross terms are < 1% in Monte Carlo and dropped):
    V: σ_v² d σ_g² [R_s + r_g (L−1) R_c]
    Q: H σ_q²σ_k² s² λ/τ² [(1−1/d)(d Bz + (d_k−1)(d B + E(1−ΣS²)² + Bz)) + d_k Bz]
    K: H λ |u|² /d [E w B + r_g (L−1) E w ρ̂ CK]    (g^K_j = Σ_i ∂L/∂Y_ij u_i exactly)
  λ = η² + p σ_v² σ_g² d d_k m₂ over (1−p), η² = s² σ_v² σ_g² d d_k (variance of g_i·V_l across keys).
Finite-size fluctuations: β² = β̄² w with w ~ Gamma(mean 1, var κ), κ = (1+2/d)(1+2/d_k)(1+v_x) − 1
(|x_i|², |q_i|² and |W_k q_i|² fluctuate), and atanh ρ̂ ~ N(atanh ρ, 1/d_k + 2/d); the K path is
size-biased by w (its gradient carries |u_i|). L = math.inf gives the exact large-L forward limit
(F2, K1 → 0, Z1 → β̄², K2 → ρβ̄²): Var o → σ_v²(d m₂ + s²β̄²) → d σ_v² rσ² as d → ∞, the authors'
rank-collapse limit. Measured errors: docs/moments.md (worst cases: K path with r_g > 0 and
L ≥ d_k, where query-norm/ρ̂ correlations are not modelled, ~5%).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .linear import Linear
from .softmax import pair_functionals, row_functionals
from .state import Moments, check_nonneg, check_positive, check_prob, check_size, ratio


def gamma_nodes(kappa: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss rule for w ~ Gamma(shape 1/κ, scale κ) (mean 1, variance κ): Golub–Welsch on generalized Laguerre."""
    if kappa <= 0:
        return np.ones(1), np.ones(1)
    alpha, i = 1.0 / kappa - 1.0, np.arange(n)
    off = np.sqrt(i[1:] * (i[1:] + alpha))
    x, vec = np.linalg.eigh(np.diag(2 * i + alpha + 1) + np.diag(off, 1) + np.diag(off, -1))
    return x * kappa, vec[0] ** 2 / (vec[0] ** 2).sum()


def _rho_nodes(rho: float, k_rho: float) -> tuple[np.ndarray, np.ndarray]:
    if rho >= 1 - 1e-9:
        return np.ones(1), np.ones(1)
    x, w = np.polynomial.hermite_e.hermegauss(3)
    return np.tanh(np.arctanh(rho) + x / math.sqrt(k_rho)), w / w.sum()


@lru_cache(maxsize=256)
def _functionals(beta2: float, kappa: float, rho: float, k_rho: float, L: int, causal: bool
                 ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Fluctuation-averaged row functionals (per row type) and pair functionals (pair average)."""
    ns = np.arange(1, L + 1, dtype=float) if causal else np.array([float(L)])
    pairs = (np.stack(np.triu_indices(L, 1), 1) + 1.0 if causal else np.array([[L, L]], dtype=float))
    rows = {k: np.zeros_like(ns) for k in ("F2", "F22", "Z1", "Z2", "B", "Bz", "wB")}
    for w, wt in zip(*gamma_nodes(kappa, 6)):
        f = row_functionals(beta2 * w, ns)
        for k in ("F2", "F22", "Z1", "Z2", "B", "Bz"):
            rows[k] += wt * f[k]
        rows["wB"] += wt * w * f["B"]
    rows["inv_n"] = 1.0 / ns
    pair = {"K1": 0.0, "K2": 0.0, "CK": 0.0, "wrCK": 0.0,
            "inv_n1": float(np.mean(1 / pairs[:, 0])), "inv_n2": float(np.mean(1 / pairs[:, 1]))}
    for w, wt in zip(*gamma_nodes(kappa, 4)):
        for r, rt in zip(*_rho_nodes(rho, k_rho)):
            f = pair_functionals(beta2 * w, r, pairs)
            for k in ("K1", "K2", "CK"):
                pair[k] += wt * rt * f[k]
            pair["wrCK"] += wt * rt * w * r * f["CK"]
    return rows, pair


def _limit_functionals(beta2: float, rho: float) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """L → ∞: ΣS² → 0, ΣS_j z_j → β (so Z1 → β², K2 → ρβ²), pair overlaps → 0."""
    zero = np.zeros(1)
    rows = {"F2": zero, "F22": zero, "Z1": np.full(1, beta2), "Z2": zero, "B": zero, "Bz": zero,
            "wB": zero, "inv_n": zero}
    return rows, {"K1": 0.0, "K2": rho * beta2, "CK": 0.0, "wrCK": 0.0, "inv_n1": 0.0, "inv_n2": 0.0}


class _Setup(NamedTuple):
    s2: float      # (1−r)σ², token-specific variance
    m2: float      # μ² + rσ², shared second moment
    u2: float      # E|u_i|² = σ_q²σ_k² d² d_k (μ²+σ²)/τ²  (β̄² = s² u2)
    rho: float     # logit correlation of two queries on one key
    rows: dict[str, np.ndarray]
    pairs: dict[str, float]


@dataclass(frozen=True)
class Attention:
    """Multi-head self-attention over L tokens (``L=math.inf``: large-L forward limit), output projection included.

    ``p``: dropout on the softmax probabilities. ``shaped``: A = γ₁I + Softmax(QKᵀ/τ) − γ₂C with
    τ = τ₀√(d·d_k), C uniform over each row's visible keys; otherwise γ₁, γ₂, τ₀ are unused.
    """

    d: int
    n_heads: int
    L: int | float
    q_var: float
    k_var: float
    v_var: float
    o_var: float
    p: float = 0.0
    causal: bool = False
    shaped: bool = False
    tau0: float = 1.0
    gamma1: float = 1.0
    gamma2: float = 1.0

    def __post_init__(self) -> None:
        check_size("d", self.d)
        check_size("n_heads", self.n_heads)
        if self.d % self.n_heads:
            raise ValueError(f"d ({self.d}) must be divisible by n_heads ({self.n_heads})")
        if self.L != math.inf:
            check_size("L", self.L, minimum=2)
        for name in ("q_var", "k_var", "v_var", "o_var"):
            check_nonneg(name, getattr(self, name))
        check_prob("p", self.p)
        check_positive("tau0", self.tau0)

    @property
    def d_k(self) -> int:
        return self.d // self.n_heads

    @property
    def out_proj(self) -> Linear:
        return Linear(self.d, self.d, self.o_var)

    def _gammas(self) -> tuple[float, float]:
        return (self.gamma1, self.gamma2) if self.shaped else (0.0, 0.0)

    def _setup(self, m: Moments) -> _Setup:
        check_positive("var (input of Attention)", m.var)
        if m.corr < 0:
            raise NotImplementedError(f"attention moments are derived for corr >= 0 (got corr={m.corr})")
        d, dk = self.d, self.d_k
        tau2 = self.tau0 ** 2 * d * dk if self.shaped else dk
        x2, m2, s2 = m.mean ** 2 + m.var, m.mean ** 2 + m.corr * m.var, (1 - m.corr) * m.var
        u2 = self.q_var * self.k_var * d * d * dk * x2 / tau2
        rho = m2 / x2
        if self.L == math.inf:
            if self.causal:
                raise NotImplementedError("causal attention has no L → ∞ limit here; give a finite L")
            rows, pairs = _limit_functionals(s2 * u2, rho)
        else:
            v_x = (2 * m.var ** 2 + 4 * m.mean ** 2 * m.var) / (d * x2 ** 2)
            kappa = (1 + 2 / d) * (1 + 2 / dk) * (1 + v_x) - 1
            rows, pairs = _functionals(s2 * u2, kappa, rho, 1 / (1 / dk + 2 / d), int(self.L), self.causal)
        return _Setup(s2, m2, u2, rho, rows, pairs)

    def _forward(self, st: _Setup) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
        """Per row: E c², R_s, C_s; pair-averaged R_c, C_c."""
        g1, g2 = self._gammas()
        r, pr, q, p = st.rows, st.pairs, self.p / (1 - self.p), self.p
        inv, io = r["inv_n"], 0.0 if self.causal else 1.0
        c2 = (g1 - g2 + 1) ** 2 + q * r["F2"]
        rs = g1 ** 2 + 2 * (g1 - g1 * g2 - g2) * inv + r["F2"] / (1 - p) + g2 ** 2 * inv
        cs = g1 ** 2 + r["Z1"] + q * r["Z2"] + 2 * (g1 - g1 * g2 - g2) * inv + g2 ** 2 * inv
        i1, i2 = pr["inv_n1"], pr["inv_n2"]
        rc = (g1 - g1 * g2) * (i2 + io * i1) + pr["K1"] - 2 * g2 * i2 + g2 ** 2 * i2
        cc = 2 * (g1 - g1 * g2) * (i2 + io * i1) + pr["K2"] - 4 * g2 * i2 + 2 * g2 ** 2 * i2
        return c2, rs, cs, rc, cc

    def _mix_fwd(self, m: Moments) -> Moments:
        st = self._setup(m)
        c2, rs, cs, rc, cc = self._forward(st)
        g1, g2 = self._gammas()
        d = self.d
        var = self.v_var * float(np.mean(c2 * d * st.m2 + st.s2 * ((d - 1) * rs + cs)))
        cov = self.v_var * ((g1 - g2 + 1) ** 2 * d * st.m2 + st.s2 * ((d - 2) * rc + cc))
        return replace(m, mean=0.0, var=var, corr=ratio(cov, var))

    def _mix_bwd(self, m_in: Moments, g: Moments) -> Moments:
        if self.L == math.inf:
            raise NotImplementedError("attention backward has no L → ∞ form here; give a finite L")
        st = self._setup(m_in)
        c2, rs, cs, rc, _ = self._forward(st)
        g1, g2 = self._gammas()
        d, dk, h, L, r = self.d, self.d_k, self.n_heads, self.L, st.rows
        sg, rg = g.grad_var, g.grad_corr
        v_var = self.v_var * d * sg * (float(np.mean(rs)) + rg * (L - 1) * rc)
        v_cov = self.v_var * d * sg / (L - 1) * (float(np.mean(c2 - rs)) + rg * (L - 1) * ((g1 - g2 + 1) ** 2 - rc))
        lam = self.v_var * sg * d * dk * (st.s2 + self.p * st.m2) / (1 - self.p)
        tau2 = self.tau0 ** 2 * d * dk if self.shaped else dk
        one = 1 - 2 * r["F2"] + r["F22"]
        q_rows = (1 - 1 / d) * (d * r["Bz"] + (dk - 1) * (d * r["B"] + one + r["Bz"])) + dk * r["Bz"]
        q_var = h * self.q_var * self.k_var * st.s2 * lam / tau2 * float(np.mean(q_rows))
        q_cov = h * self.q_var * self.k_var * dk / tau2 * st.s2 * d * lam * rg * st.pairs["CK"]
        k_var = h * lam * st.u2 / d * (float(np.mean(r["wB"])) + rg * (L - 1) * st.pairs["wrCK"])
        total = v_var + q_var + k_var
        return replace(m_in, grad_var=total, grad_corr=ratio(v_cov + q_cov - k_var / (L - 1), total))

    def fwd(self, m: Moments) -> Moments:
        return self.out_proj.fwd(self._mix_fwd(m))

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self._mix_bwd(m_in, self.out_proj.bwd(self._mix_fwd(m_in), g_out))
