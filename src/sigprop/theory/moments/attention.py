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
  Backward = V path + Q path + K path (their cross terms are dropped: their size in docs/moments.md §3):
    V: σ_v² d σ_g² [R_s + r_g (L−1) R_c]
    Q: H σ_q²σ_k² s² λ/τ² [(1−1/d)(d Bz + (d_k−1)(d B + E(1−ΣS²)² + Bz)) + d_k Bz]
    K: H λ |u|² /d [E w B + r_g (L−1) E w ρ̂ CK]    (g^K_j = Σ_i ∂L/∂Y_ij u_i exactly)
  λ = η² + p σ_v² σ_g² d d_k m₂ over (1−p), η² = s² σ_v² σ_g² d d_k (variance of g_i·V_l across keys).
Finite-size fluctuations: β² = β̄² w with w ~ Gamma(mean 1, var κ), κ = (1+2/d)(1+2/d_k)(1+v_x) − 1
(|x_i|², |q_i|² and |W_k q_i|² fluctuate), and atanh ρ̂ ~ N(atanh ρ, 1/d_k + 2/d); the K path is
size-biased by w (its gradient carries |u_i|). L = math.inf gives the exact large-L forward limit
(F2, K1 → 0, Z1 → β̄², K2 → ρβ̄²): Var o → σ_v²(d m₂ + s²β̄²) → d σ_v² rσ² as d → ∞, the authors'
rank-collapse limit. Measured errors: docs/moments.md (the worst: the K path with r_g > 0 and L ≥ d_k, where
query-norm/ρ̂ correlations are not modelled).
``qk_norm`` (k > 0): each head's queries and keys normalized in k degrees of freedom (`qk_norm`): the logits
read the projected tokens' cosines (β² from `qk_norm.logit_scale`, ρ the queries' mean cosine, κ = 0) and the
Q and K paths pass through the norms' Jacobians.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import NamedTuple

import numpy as np

from . import qk_norm as qkn
from .linear import Linear
from .state import (
    Component,
    Mixing,
    Moments,
    check_nonneg,
    check_positive,
    check_prob,
    check_size,
    norm_dispersion,
    ratio,
    replace,
)
from .tables import (
    PAIR_KEYS,
    ROW_KEYS,
    FunctionalTable,
    RowTable,
    exact_pairs,
    exact_profiles,
    exact_rows,
    functional_table,
    key_counts,
    row_table,
)


@lru_cache(maxsize=64)
def gamma_nodes(kappa: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss rule for w ~ Gamma(shape 1/κ, scale κ) (mean 1, variance κ): Golub–Welsch on generalized Laguerre."""
    if kappa <= 0:
        return np.ones(1), np.ones(1)
    alpha, i = 1.0 / kappa - 1.0, np.arange(n)
    off = np.sqrt(i[1:] * (i[1:] + alpha))
    x, vec = np.linalg.eigh(np.diag(2 * i + alpha + 1) + np.diag(off, 1) + np.diag(off, -1))
    return x * kappa, vec[0] ** 2 / (vec[0] ** 2).sum()


_HERMITE3 = np.array([-math.sqrt(3.0), 0.0, math.sqrt(3.0)]), np.array([1 / 6, 2 / 3, 1 / 6])


def _rho_nodes(rho: float, k_rho: float) -> tuple[np.ndarray, np.ndarray]:
    """3-node rule for ρ̂ = tanh(atanh ρ + N(0, 1/k_ρ))."""
    if rho >= 1 - 1e-9:
        return np.ones(1), np.ones(1)
    x, w = _HERMITE3
    return np.tanh(np.arctanh(rho) + x / math.sqrt(k_rho)), w


@lru_cache(maxsize=4096)
def _functionals(beta2: float, kappa: float, rho: float, k_rho: float, L: int, causal: bool, exact: bool,
                 dof: int = 0) -> tuple[dict[str, float], dict[str, float]]:
    """Fluctuation-averaged row functionals (row average) and pair functionals (pair average).

    β² w with w on a 6-node (rows) / 4-node (pairs) Gamma rule, ρ̂ on a 3-node tanh-normal rule. The
    functionals come from `tables.functional_table` (Chebyshev, relative error ≲ 1e-3) unless ``exact``
    or a node lies beyond the table's β_max; then from the exact quadrature in `softmax` (beyond β = 4, near
    hard-max, the log-domain one of `hardmax`, at any β). With ``dof`` (qk-norm)
    the rows are the exact ones of sphere-coordinate logits in ``dof`` dimensions, the pairs the Gaussian ones at
    the scale with their mean square weight (`qk_norm.softmax_scale`).
    """
    w6, t6 = gamma_nodes(kappa, 6)
    w4, t4 = gamma_nodes(kappa, 4)
    r3, q3 = _rho_nodes(rho, k_rho)
    pw, pr, pt = np.repeat(w4, len(r3)), np.concatenate([r3] * len(w4)), (t4[:, None] * q3).ravel()
    if dof:
        per_row = [exact_rows(beta2 * w, L, causal, dof) for w in w6]
        per_pair = [exact_pairs(qkn.softmax_scale(beta2 * w, dof), r, L, causal) for w, r in zip(pw, pr)]
        f_rows = {k: np.array([f[k] for f in per_row]) for k in per_row[0]}
        f_pairs = {k: np.array([f[k] for f in per_pair]) for k in PAIR_KEYS}
    elif not exact and FunctionalTable.covers(beta2 * max(w6.max(), w4.max())):
        table = functional_table(L, causal)
        f_rows, f_pairs = table.rows(beta2 * w6), table.pairs(beta2 * pw, pr)
    else:
        per_row = [exact_rows(beta2 * w, L, causal) for w in w6]
        per_pair = [exact_pairs(beta2 * w, r, L, causal) for w, r in zip(pw, pr)]
        f_rows = {k: np.array([f[k] for f in per_row]) for k in ROW_KEYS}
        f_pairs = {k: np.array([f[k] for f in per_pair]) for k in PAIR_KEYS}
    inv_n, inv_n1, inv_n2 = _inverse_counts(L, causal)
    rows = {k: float(t6 @ v) for k, v in f_rows.items()}
    rows["wB"] = float(t6 @ (w6 * f_rows["B"]))
    rows["inv_n"] = inv_n
    pair = {k: float(pt @ v) for k, v in f_pairs.items()}
    pair["wrCK"] = float(pt @ (pw * pr * f_pairs["CK"]))
    pair["inv_n1"], pair["inv_n2"] = inv_n1, inv_n2
    return rows, pair


@lru_cache(maxsize=16)
def _inverse_counts(L: int, causal: bool) -> tuple[float, float, float]:
    """Mean 1/n over rows, and mean 1/n1, 1/n2 over query pairs."""
    ns, pairs = key_counts(L, causal)
    return float(np.mean(1 / ns)), float(np.mean(1 / pairs[:, 0])), float(np.mean(1 / pairs[:, 1]))


def _limit_functionals(beta2: float, rho: float) -> tuple[dict[str, float], dict[str, float]]:
    """L → ∞: ΣS² → 0, ΣS_j z_j → β (so Z1 → β², K2 → ρβ²), pair overlaps → 0."""
    rows = {"F2": 0.0, "F22": 0.0, "Z1": beta2, "Z2": 0.0, "B": 0.0, "Bz": 0.0, "wB": 0.0, "inv_n": 0.0}
    return rows, {"K1": 0.0, "K2": rho * beta2, "CK": 0.0, "wrCK": 0.0, "inv_n1": 0.0, "inv_n2": 0.0}


class _Setup(NamedTuple):
    s2: float      # (1−r)σ², token-specific variance
    m2: float      # μ² + rσ², shared second moment
    u2: float      # E|u_i|² = σ_q²σ_k² d² d_k (μ²+σ²)/τ²  (β̄² = s² u2)
    rho: float     # logit correlation of two queries on one key
    rows: dict[str, float]     # row-averaged functionals (the maps are linear in them)
    pairs: dict[str, float]    # pair-averaged functionals
    key_gain: float = 1.0      # qk-norm: E|u_K|² of the K path over u2 (`qk_norm.key_gain`)
    query_gain: float = 1.0    # qk-norm: factor on q_var k_var in the Q path (`qk_norm.query_gain`)


@dataclass(frozen=True)
class Attention(Component):
    """Multi-head self-attention over L tokens (``L=math.inf``: large-L forward limit), output projection included.

    ``p``: dropout on the softmax probabilities. ``shaped``: A = γ₁I + Softmax(QKᵀ/τ) − γ₂C with
    τ = τ₀√(d·d_k), C uniform over each row's visible keys; otherwise γ₁, γ₂, τ₀ are unused.
    ``exact``: evaluate the softmax functionals by quadrature instead of the Chebyshev tables
    (`tables`, within 1e-3 relative of it: tests/test_predict.py; the cost of each: docs/moments.md §3).
    ``qk_norm``: the degrees of freedom k of each head's normalized queries and keys (d_k − 1 for LayerNorm, d_k
    for RMSNorm; 0: none); then ``q_var`` and ``k_var`` are the variances of the normalized coordinates (gains
    squared, the logit scale's (scale·τ)² on ``q_var``; `qk_norm`).
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
    exact: bool = False
    qk_norm: int = 0

    def __post_init__(self) -> None:
        check_size("d", self.d)
        check_size("n_heads", self.n_heads)
        if self.d % self.n_heads:
            raise ValueError(f"d ({self.d}) must be divisible by n_heads ({self.n_heads})")
        if self.qk_norm and not (3 <= self.qk_norm <= self.d_k and not self.shaped):
            raise ValueError(f"qk_norm must be 0 or in [3, d_k = {self.d_k}] (softmax attention), got {self.qk_norm}")
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
    def vo_gain(self) -> float:
        """a = d²σ_v²σ_o²: the gain of the value–output path x ↦ x W_v W_o."""
        return self.d ** 2 * self.v_var * self.o_var

    @cached_property
    def out_proj(self) -> Linear:
        return Linear(self.d, self.d, self.o_var)

    @property
    def tau2(self) -> float:
        """τ², the logits' divisor squared: τ₀² d d_k when shaped, else d_k."""
        return self.tau0 ** 2 * self.d * self.d_k if self.shaped else self.d_k

    def _gammas(self) -> tuple[float, float]:
        return (self.gamma1, self.gamma2) if self.shaped else (0.0, 0.0)

    def kappa(self, m: Moments) -> float:
        """Relative variance κ of the logit scale β² over queries (finite-width fluctuations; 0 under qk-norm,
        whose queries have a fixed norm)."""
        if self.qk_norm:
            return 0.0
        x2 = m.mean ** 2 + m.var
        v_x = (2 * m.var ** 2 + 4 * m.mean ** 2 * m.var) / (self.d * x2 ** 2)
        return (1 + 2 / self.d) * (1 + 2 / self.d_k) * (1 + v_x) - 1

    def _setup(self, m: Moments) -> _Setup:
        return self.setup(m, m)

    def setup(self, m_q: Moments, m_kv: Moments) -> _Setup:
        """Everything the maps need: the key side (tokens whose logits and values are mixed, ``m_kv``) gives
        s², m₂ and, with the query side (``m_q``), β̄² = s²|u|²; |u|², ρ and κ come from the query side alone
        (u_i = W_kᵀW_q x_i/τ). Self-attention passes the same moments twice; `CrossAttention` two streams."""
        for side, m in (("query", m_q), ("key", m_kv)):
            check_positive(f"var (attention {side} input)", m.var)
            if m.corr < 0:
                raise NotImplementedError(f"attention moments are derived for corr >= 0 (got corr={m.corr})")
        d, dk, tau2 = self.d, self.d_k, self.tau2
        m2, s2 = m_kv.mean ** 2 + m_kv.corr * m_kv.var, (1 - m_kv.corr) * m_kv.var
        xq2, mq2 = m_q.mean ** 2 + m_q.var, m_q.mean ** 2 + m_q.corr * m_q.var
        u2 = self.q_var * self.k_var * d * d * dk * xq2 / tau2
        rho = mq2 / xq2
        if self.qk_norm:
            k, rho_k = self.qk_norm, m2 / (m_kv.mean ** 2 + m_kv.var)
            rho, c_k = qkn.cosines(k, rho, rho_k)
            u2 = qkn.logit_scale(self.q_var, self.k_var, dk, k, c_k, tau2) / s2 if s2 > 0 else 0.0
        if self.L == math.inf:
            if self.causal:
                raise NotImplementedError("causal attention has no L → ∞ limit here; give a finite L")
            rows, pairs = _limit_functionals(s2 * u2, rho)
        else:
            rows, pairs = _functionals(s2 * u2, self.kappa(m_q), rho, 1 / (1 / dk + 2 / d), int(self.L), self.causal,
                                       self.exact, self.qk_norm)
        if self.qk_norm:
            gains = qkn.key_gain(k, rho_k, c_k, rows), qkn.query_gain(d, dk, k, xq2, s2, c_k)
            return _Setup(s2, m2, u2, rho, rows, pairs, *gains)
        return _Setup(s2, m2, u2, rho, rows, pairs)

    def _forward(self, st: _Setup) -> tuple[float, float, float, float, float]:
        """Row-averaged E c², R_s, C_s; pair-averaged R_c, C_c."""
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
        return self.mix_fwd(self._setup(m), m)

    def mix_fwd(self, st: _Setup, m: Moments) -> Moments:
        """``m`` with the mixing step's output (mean, var, corr) for the prepared inputs ``st`` (`setup`)."""
        c2, rs, cs, rc, cc = self._forward(st)
        g1, g2 = self._gammas()
        d = self.d
        bulk = (d - 1) * rs + (qkn.bulk_shift(st.rows, self.p) if self.qk_norm else 0.0)
        var = self.v_var * (c2 * d * st.m2 + st.s2 * (bulk + cs))
        cov = self.v_var * ((g1 - g2 + 1) ** 2 * d * st.m2 + st.s2 * ((d - 2) * rc + cc))
        return replace(m, mean=0.0, var=var, corr=ratio(cov, var),
                       norm_disp=self.mixed_dispersion(st, m) * (1 + 2 / d), kurtosis=3.0)

    def mixed_dispersion(self, st: _Setup, m: Moments) -> float:
        """R = Var|ȳ|²/(E|ȳ|²)² of a row's mix ȳ_i = Σ_j a_ij x_j of the input tokens (`state`), before W_V, which
        adds a χ²_d given ȳ (so the mix step's output has e = R(1 + 2/d), κ = 3). With tokens of correlation ρ and
        dispersion R_x, |ȳ|²/(d x̄²) = ΣS²(1 − ρ) + ρ + Σ_{j≠j'} S_jS_j'(c_jj' − ρ) + Σ S_j²(|x_j|²/(d x̄²) − 1),
        c the pair cosines:
          * the softmax: (1 − ρ)²·Var(ΣS²) within a row (its logits, and the spread of its logit scale over
            queries), F22 − ⟨F2_i²⟩_rows with F2 = EΣS², F22 = E(ΣS²)²; the H heads draw independent weights and
            their outputs add, each through its own W_V columns, so it enters over H. Causal rows of different
            lengths differ in mean, not in spread: a position's own variance (`causal`) carries that;
          * the pair cosines: 2(1 − ρ²)²(F2² − F4)/d, F4 = EΣS⁴ ≈ F2³ (exact for uniform rows);
          * the token norms: F4·R_x;
        over (F2(1 − ρ) + ρ)². The heads share the tokens, so the last two do not average over them. Shaped
        attention (its identity part dominates at init) passes the input's R on. Against measurement at every
        sublayer input of Pre-LN models: tests/test_moments_dispersion.py (the table: docs/moments.md §5)."""
        if self.shaped or self.L == math.inf:
            return norm_dispersion(m, self.d)
        f2, f22, rho = st.rows["F2"], st.rows["F22"], max(0.0, min(1.0, ratio(st.m2, st.m2 + st.s2)))
        rows = row_profiles(self, m)[0] if self.causal else np.array([f2])
        per_head = max(f22 - float(rows @ rows) / len(rows), 0.0)                 # within a row, and its β² spread
        f4 = f2 ** 3
        mean = f2 * (1 - rho) + rho
        spread = ((1 - rho) ** 2 * per_head / self.n_heads
                  + 2 * (1 - rho * rho) ** 2 * max(f2 * f2 - f4, 0.0) / self.d)
        return (spread + f4 * norm_dispersion(m, self.d)) / mean ** 2

    def _mix_bwd(self, m_in: Moments, g: Moments) -> Moments:
        (v_var, v_cov), (qk_var, qk_cov) = self.mix_bwd_paths(m_in, g)
        total = v_var + qk_var
        return replace(m_in, grad_var=total, grad_corr=ratio(v_cov + qk_cov, total))

    def mix_bwd_paths(self, m_in: Moments, g: Moments) -> tuple[tuple[float, float], tuple[float, float]]:
        """(variance, covariance) of the mixing step's input gradient: V path, and Q + K paths (g: gradient
        at the mix's output, i.e. before the output projection's backward)."""
        if self.L == math.inf:
            raise NotImplementedError("attention backward has no L → ∞ form here; give a finite L")
        st = self._setup(m_in)
        q_var, q_cov = self.query_path(st, g)
        k_var, k_cov = self.key_path(st, g, self.L)
        return self.value_path(st, g, self.L), (q_var + k_var, q_cov + k_cov)

    def value_path(self, st: _Setup, g: Moments, n_q: int) -> tuple[float, float]:
        """(variance, covariance) over keys of the V-path gradient W_vᵀ Σ_i a_ij g_i, with ``n_q`` queries
        reading the L keys (self-attention: n_q = L)."""
        c2, rs, cs, rc, _ = self._forward(st)
        g1, g2 = self._gammas()
        d, L, sg, rg, share = self.d, self.L, g.grad_var, g.grad_corr, n_q / self.L
        v_var = self.v_var * d * sg * share * (rs + rg * (n_q - 1) * rc)
        off = rg * (n_q - 1) * ((g1 - g2 + 1) ** 2 - rc)
        v_cov = self.v_var * d * sg * share / (L - 1) * (c2 - rs + off)
        return v_var, v_cov

    def _lam(self, st: _Setup, g: Moments) -> float:
        """λ: variance of g_i·V_l across keys, η² = s²σ_v²σ_g² d d_k, with the masked common part, over (1−p)."""
        return self.v_var * g.grad_var * self.d * self.d_k * (st.s2 + self.p * st.m2) / (1 - self.p)

    def query_path(self, st: _Setup, g: Moments, value_trace: bool = False) -> tuple[float, float]:
        """(variance, covariance) over queries of the Q-path gradient W_qᵀW_k Σ_l dY_il x_l/τ.

        ``value_trace``: add to the covariance the two queries' coupling along their value-gradient
        directions W_vᵀg_i (cosine r_g), E[tr Q_S tr Q_S'] ≈ (1 − F2)², the pair analogue of the variance's
        E(1 − ΣS²)² term; O(n/d) of the covariance (`CrossAttention` uses it; self-attention's Q-path
        covariance, a small part of its total, is kept as it was)."""
        d, dk, h, r = self.d, self.d_k, self.n_heads, st.rows
        lam, rg, tau2 = self._lam(st, g), g.grad_corr, self.tau2
        one = 1 - 2 * r["F2"] + r["F22"]
        if self.qk_norm:
            q_rows, qk = qkn.query_rows(d, self.qk_norm, r), self.q_var * self.k_var * st.query_gain
        else:
            q_rows = (1 - 1 / d) * (d * r["Bz"] + (dk - 1) * (d * r["B"] + one + r["Bz"])) + dk * r["Bz"]
            qk = self.q_var * self.k_var
        q_var = h * qk * st.s2 * lam / tau2 * q_rows
        q_cov = h * qk * dk / tau2 * st.s2 * d * lam * rg * st.pairs["CK"]
        if value_trace:
            q_cov += h * qk * dk / tau2 * st.s2 * lam * rg * (1 - r["F2"]) ** 2
        return q_var, q_cov

    def key_path(self, st: _Setup, g: Moments, n_q: int) -> tuple[float, float]:
        """(variance, covariance) over keys of the K-path gradient Σ_i dY_ij u_i (``n_q`` queries); the
        covariance is −var/(L−1) exactly, since Σ_j dY_ij = 0."""
        L, rg = self.L, g.grad_corr
        share = n_q / L
        pairs = rg * (n_q - 1) * st.pairs["wrCK"]
        k_var = self.n_heads * self._lam(st, g) * st.u2 * st.key_gain / self.d * share * (st.rows["wB"] + pairs)
        return k_var, -k_var / (L - 1)

    def fwd(self, m: Moments) -> Moments:
        return self.out_proj.fwd(self._mix_fwd(m))

    def token_mixing(self) -> Mixing:
        """Causal rows read keys j ≤ i (softmax rows, or shaped ones); bidirectional rows read every position."""
        if not self.causal:
            return Mixing.ALL
        return Mixing.CAUSAL_SHAPED if self.shaped else Mixing.CAUSAL_SOFTMAX

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self._mix_bwd(m_in, self.out_proj.bwd(self._mix_fwd(m_in), g_out))


@lru_cache(maxsize=4096)
def row_profiles(att: Attention, m: Moments, spread: tuple[float, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """F2(n_i) and B(n_i) of each causal row i (n_i = i + 1 keys) of ``att`` on input ``m``, averaged over the
    logit-scale fluctuations (6-node Gamma rule), read-only. ``spread``: per row, its keys' own variance over the
    input's (`causal_attention.row_spread`), which scales that row's logit variance β²; None: every row at the
    input's. Cached for every attention sublayer of a deep stack: its forward (the norm dispersion, the
    causal forward) reads them bottom-up, the causal backward top-down."""
    st = att._setup(m)
    w, t = gamma_nodes(att.kappa(m), 6)
    beta2 = st.s2 * st.u2 * w
    if spread is not None:
        beta2 = np.outer(beta2, spread)                                              # (6, L): row i at its own
    L = int(att.L)
    if not att.exact and not att.qk_norm and FunctionalTable.covers(float(beta2.max())):
        table = functional_table(L, True)
        prof = table.profiles(beta2) if spread is None else table.profiles_by_row(beta2)   # (6, 2, L)
    else:
        prof = np.array([exact_profiles(b, L, att.qk_norm) for b in beta2])
    f2, b = t @ prof[:, 0], np.maximum(t @ prof[:, 1], 0.0)
    f2.flags.writeable = b.flags.writeable = False
    return f2, b


def attention_gain(r: float, L: int, causal: bool, d: int, n_heads: int) -> float:
    """G = E[o²]/(d²σ_v²σ_o²σ²): the output variance of standard attention at init per unit value–output gain.

    Tokens of variance σ², mean 0, correlation r; Q, K ~ N(0, 1/d) (logit variance 1 for unit tokens),
    ``L`` keys per row (causal: row i sees i). It is `Attention`'s forward variance with σ_v² = σ_o² = 1/d,
    which needs only the row functionals (no query pairs, so causal L in the thousands stays cheap):

        G = r + (1 − r)·((d − 1)·F2 + Z1)/d,

    F2 = EΣ_j a_ij², Z1 = E(Σ_j a_ij z_j)² averaged over rows and over the finite-width spread of the logit
    scale β² = (1 − r)w (`Attention.kappa`). It tends to DeepScaleLM's r for long bidirectional rows and
    wide models; at L = 16–128 it is within 2 % + 2 s.e. of Monte Carlo of a real layer
    (tests/test_attention_gain.py, docs/moments.md §7), where the closed forms r + (1−r)·min(1, e^{1−r}/n) and
    r + (1−r)·e^v/(e^v + n − 1) miss by more than 30 % and 10 % on short causal rows (the same test).
    """
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"attention_gain: token correlation r must be in [0, 1], got {r}")
    if r == 1.0 or L == 1:
        return 1.0                     # identical tokens, or a single key: o = x W_v W_o
    att = Attention(d, n_heads, L, 1 / d, 1 / d, 1 / d, 1 / d, causal=causal)
    m = Moments(0.0, 1.0, r)
    w, t = gamma_nodes(att.kappa(m), 6)
    beta2 = (1.0 - r) * w
    if RowTable.covers(float(beta2.max())):
        f = row_table(int(L), causal).rows(beta2)
    else:
        per = [exact_rows(float(b), int(L), causal) for b in beta2]
        f = {k: np.array([p[k] for p in per]) for k in ("F2", "Z1")}
    f2, z1 = float(t @ f["F2"]), float(t @ f["Z1"])
    return r + (1.0 - r) * ((d - 1) * f2 + z1) / d
