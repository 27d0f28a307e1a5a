"""Causal softmax attention per token position: its rows' variances, its backward on a gradient covariance over
positions, and its mixing of a token covariance over positions (derivations: docs/moments.md §causal attention).

Row i reads its n_i = i + 1 keys with weights a_ij = γ₁δ_ij + S'_ij − γ₂/n_i (standard: γ₁ = γ₂ = 0),
S' = S ⊙ mask/(1 − p); F2_i = EΣ_j S_ij² and B_i = E tr Q_S² (Q_S = diag S − SSᵀ) are its softmax profiles
(`attention.row_profiles`), averaged over the logit-scale fluctuations. Rows are taken independent given the
forward moments and each row's keys exchangeable, except for the same-key excess of two rows below.

* Forward variance per row (`row_vars`): a branch output linear in the attention output, of row average f̄,
  has at row i the variance f̄ (m₂ + s²F2_i)/(m₂ + s²F̄2) (F̄2 the rows' mean).
* Backward (`attention_bwd`), G (L, L) at the output, per feature: the output projection scales it by dσ_o²;
  the V path gives
      G' = dσ_v² (Mᵀ G M + Σ_i G_ii D_i + c·K),   M = γ₁I + (1 − γ₂)U,  U_ij = 1[j ≤ i]/n_i,
      (D_i)_jj = 1[j ≤ i] (F2_i/(n_i(1 − p)) − 1/n_i²),
      (D_i)_jk = 1[j, k ≤ i] ((1 − F2_i)/(n_i(n_i − 1)) − 1/n_i²)   (j ≠ k),
  exact for uniform rows. c = `row_pair_excess` (E[S_ij S_i'j] = (1 + c)/(n_i n_i') for rows i ≠ i' on a key
  both read; 0 with row 0) and K = `_shared_keys`:
      K_jj = Σ_{i ≠ i', min(i, i') ≥ max(j, 1)} G_ii'/(n_i n_i'),
      K_jk = −Σ_{i ≠ i', min(i, i') ≥ max(j, k)} G_ii'/(n_i n_i' (min(n_i, n_i') − 1))   (j ≠ k).
  The Q and K paths carry the exchangeable map's totals (`Attention.query_path`, `key_path`) at the
  position-averaged gradient, given to the rows in proportion to w_i ∝ G_ii B_i: row i's Q path on query i, its K
  path evenly on its n_i keys (key j gets Σ_{i ≥ j} w_i/n_i). A position-independent G gives the exchangeable
  totals back.
* Key spread (`row_spread`): with C (L, L) the keys' covariance over positions, row i's keys vary about their
  common part by s_i = v_i − c_i (v_i their mean variance, c_i the mean covariance of their pairs), against
  s̄ = v̄ − c̄ of the whole input; row i is read at logit variance (s_i/s̄)β̄² (its F2_i, B_i), its Q path ∝ s_i²B_i
  and its K path ∝ s_iB_i. Every s_i = s̄ gives the maps above back.
* Mixing of a token covariance (`value_mix`, `attention_pairs`):
      P(C)_ii' = Σ_{k ≤ i, k' ≤ i'} C_kk'/(n_i n_i')   (i ≠ i'),
      P(C)_ii  = F2_i/(n_i(1 − p)) Σ_{k ≤ i} C_kk + (1 − F2_i)/(n_i(n_i − 1)) Σ_{k ≠ k' ≤ i} C_kk',
  and C' = a·P(C) + (E − a·P(C̄)), a = d²σ_v²σ_o², C̄ the uniform C of C's means, E the exchangeable map's output
  (row i's variance `row_vars`, every covariance shifted by the mean off-diagonal of E − a·P(C̄)): a uniform C
  gives the exchangeable map back.

Monte Carlo: tests/test_moments_causal.py (P against sampled causal rows; the sublayers' per-position gradient).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from .attention import Attention, row_profiles
from .covariances import grad_summary, later, position_means, tail, upper
from .state import Moments
from .tables import key_counts


def _times_u(G: np.ndarray, n: np.ndarray) -> np.ndarray:
    """G U (U_jk = 1[k ≤ j]/n_j) in O(L²): (G U)_ik = Σ_{j ≥ k} G_ij/n_j (torch's cumulative sum along rows:
    numpy's is a few times slower there)."""
    return torch.from_numpy(G / n).flip(1).cumsum(1).flip(1).numpy()


def row_pair_excess(pairs: dict[str, float]) -> float:
    """c with E[S_ij S_i'j] = (1 + c)/(n_i n_i') for two causal rows i ≠ i' and a key j both read: the pair
    functional K1 = E Σ_j S_ij S_i'j (averaged over query pairs and the logit fluctuations, `Attention`'s
    ``pairs``) over its value 1/max(n_i, n_i') for uniform rows; > 0, since two queries' logits on one key are
    correlated (ρβ²: c ≈ e^{ρβ²} − 1)."""
    return pairs["K1"] / pairs["inv_n2"] - 1.0


@lru_cache(maxsize=8)
def _later_pairs(L: int) -> np.ndarray:
    """1/(n_i n_i') for causal rows i < i' (n = key counts), else 0, (L, L) (read-only)."""
    n = np.arange(1.0, L + 1)
    out = np.triu(1 / np.outer(n, n), 1)
    out.flags.writeable = False
    return out


def _shared_keys(G: np.ndarray, n: np.ndarray, c: float) -> np.ndarray:
    """c·K with Σ_{i ≠ i'} G_ii' (E[S_ij S_i'k] − E S_ij E S_i'k) = c·K_jk for the causal rows' softmax weights S
    (module docstring, the V path: two rows on the keys they share): K_jj = A_max(j,1), K_jk = −T_max(j,k)
    (j ≠ k), with A_l = Σ_{i ≠ i', min(i, i') ≥ l} G_ii'/(n_i n_i') and T_l the same sum with each pair over
    min(n_i, n_i') − 1. O(L²): each is twice a reversed cumulative sum of the upper triangle's row sums."""
    L = len(G)
    rows = np.einsum("ij,ij->i", G, _later_pairs(L))       # Σ_{i' > i} G_ii'/(n_i n_i'), per row i
    shared = 2 * c * tail(rows)                              # c·A_l
    other = np.zeros(L)
    other[1:] = rows[1:] / (n[1:] - 1)
    out = (-2 * c * tail(other))[later(L)]                   # −c·T_max(j,k)
    out.flat[::L + 1] = shared
    out[0, 0] = shared[1] if L > 1 else 0.0                  # row 0 reads one key: no excess with it
    return out


def attention_bwd(att: Attention, m: Moments, G: np.ndarray, coherent: float = 1.0,
                  spread: tuple[float, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """G at the input of causal attention, and G_o M (G_o: the gradient at the mix's output, after the output
    projection's backward; the V path's coherent part Mᵀ G_o M carries the factor ``coherent``). ``spread``: the
    rows' key spreads s_i (`row_spread`), which set each row's softmax profile and its Q and K paths' shares."""
    if not att.causal:
        raise NotImplementedError("the per-position backward is derived for causal attention only")
    st = att._setup(m)
    G = G * (att.d * att.o_var)                                                      # output projection
    L = len(G)
    n = key_counts(L, True)[0]
    f2, b = row_profiles(att, m, spread)
    gm = _times_u(G, n)                                                             # G M, M = U (standard)
    if att.shaped:                                                                  # M = γ₁I + (1 − γ₂)U
        gm = att.gamma1 * G + (1 - att.gamma2) * gm
    mgm = _times_u(gm.T, n).T                                                       # Uᵀ G M
    if att.shaped:
        mgm = att.gamma1 * gm + (1 - att.gamma2) * mgm                              # Mᵀ G M
    gii = np.diag(G)
    on = gii * (f2 / (n * (1 - att.p)) - 1 / n ** 2)                                   # per row i
    off = gii * np.where(n > 1, (1 - f2) / (n * np.maximum(n - 1, 1)) - 1 / n ** 2, 0.0)
    rows = tail(off)[later(L)]                                                       # Σ_{i ≥ max(j, k)}
    rows.flat[::L + 1] = tail(on)
    rows += mgm if coherent == 1.0 else coherent * mgm
    excess = coherent * row_pair_excess(st.pairs)
    if excess != 0.0:
        rows += _shared_keys(G, n, excess)
    v_path = rows
    v_path *= att.d * att.v_var
    g = grad_summary(G, m)                                                     # the Q and K paths read its grad fields
    (q_var, q_cov), (k_var, k_cov) = att.query_path(st, g), att.key_path(st, g, att.L)   # `mix_bwd_paths`' Q + K
    qk_var, qk_cov = q_var + k_var, q_cov + k_cov
    sbar, bbar = float(gii.sum()) / L, b if spread is None else row_profiles(att, m)[1]
    if qk_var <= 0 or sbar <= 0 or bbar.sum() <= 0:
        return v_path, gm
    w = L * gii * b / (sbar * bbar.sum())                     # row weights ∝ G_ii B(n_i), mean 1 if G_ii ∝ 1
    wq, wk = (w, w) if spread is None else (w * np.square(spread), w * np.asarray(spread))     # Q ∝ s_i², K ∝ s_i
    q_diag = (qk_var - k_var) * wq + k_var * tail(wk / n)                     # Q on the query, K over its n_i keys
    q = np.sqrt(q_diag / qk_var)
    qk = q[:, None] * q
    qk *= qk_cov
    qk.flat[::L + 1] = q_diag
    v_path += qk
    return v_path, gm


def row_vars(att: Attention, m: Moments, fvar: float) -> np.ndarray:
    """Per causal row i, the variance of a branch output whose row average is ``fvar`` and which is linear in
    ``att``'s output on input ``m``: the V-path forward of a row with n_i keys, f̄ (m₂ + s²F2_i)/(m₂ + s²F̄2)."""
    st = att._setup(m)
    f2 = row_profiles(att, m)[0]
    return fvar * (st.m2 + st.s2 * f2) / (st.m2 + st.s2 * float(f2.sum()) / len(f2))


def value_mix(C: np.ndarray, f2: np.ndarray, p: float, scale: float = 1.0) -> np.ndarray:
    """``scale``·P(C) of the module docstring: Σ_{k, k'} E[a_ik a_i'k'] C_kk' for causal rows with F2_i = EΣ_k S_ik²
    and attention dropout ``p``, rows independent and keys exchangeable within a row, for a symmetric C; O(L²)
    by prefix sums (each a cumulative sum along rows: Σ_{k ≤ i, k' ≤ i'} C_kk' is that of the transposed row
    sums, C being symmetric)."""
    L = len(C)
    n = np.arange(1.0, L + 1)
    out = torch.from_numpy(C).cumsum(1).T.cumsum(1).numpy()      # Σ_{k ≤ i, k' ≤ i'} C_kk'
    own = np.cumsum(np.diagonal(C))                                 # Σ_{k ≤ i} C_kk
    shared = np.diagonal(out) - own
    w = scale / n
    out *= w[:, None]
    out *= 1 / n
    out.flat[::L + 1] = w * (f2 / (1 - p) * own + np.where(n > 1, (1 - f2) / np.maximum(n - 1, 1), 0.0) * shared)
    return out


SPREAD_TOLERANCE = 1e-9     # key spreads all within it of 1: the rows read the input's logit variance


def row_spread(C: np.ndarray) -> tuple[float, ...] | None:
    """Per causal row i, s_i = (v_i − c_i)/(v̄ − c̄): the own variance of its keys 0..i (v_i their mean variance,
    c_i the mean covariance of their pairs) over the whole input's (C's means), so row i's logits q_i·k_j spread
    over its keys with variance s_i β² (module docstring); row 0 (one key) 1. None when every s_i is 1 (a uniform
    C) or the input has no spread of its own (v̄ = c̄). O(L²): the prefix's pair sum Σ_{k, k' ≤ i} C_kk' grows
    by C_ii plus twice the column above the diagonal."""
    L = len(C)
    n = np.arange(1.0, L + 1)
    diag = np.diagonal(C)
    own = np.cumsum(diag)
    block = np.cumsum(2 * (np.ones(L) @ (C * upper(L))) + diag)
    var, cov = position_means(C)
    if var - cov <= SPREAD_TOLERANCE * var:
        return None
    s = (own / n - (block - own) / np.maximum(n * (n - 1), 1)) / (var - cov)
    s[0] = 1.0
    if np.max(np.abs(s - 1)) <= SPREAD_TOLERANCE:
        return None
    return tuple(np.maximum(s, 0.0).tolist())


def attention_pairs(att: Attention, m: Moments, C: np.ndarray, out: Moments
                    ) -> tuple[np.ndarray, tuple[float, ...] | None]:
    """C at the output of causal attention ``att`` (input ``m`` = C's means, exchangeable output ``out``):
    a·P(C) with each row's F2 at its key spread (`row_spread`) plus the exchangeable map's shift from a·P(C̄)
    (module docstring); and that spread. P(C̄) of the uniform C̄ in closed form: diagonal F2_i σ²/(1 − p) +
    (1 − F2_i) rσ² (n_i > 1), off-diagonal rσ² + (1 − r)σ²/max(n_i, n_i'), whose mean over the pairs is
    rσ² + (1 − r)σ² (L − H_L)/C(L, 2)."""
    L = len(C)
    n = np.arange(1.0, L + 1)
    spread = row_spread(C)
    f2 = row_profiles(att, m)[0]
    a = att.d * att.v_var * att.d * att.o_var
    base_diag = a * (f2 * m.var / (1 - att.p) + np.where(n > 1, (1 - f2) * m.cov, 0.0))
    base_off = a * (m.cov + (m.var - m.cov) * float(np.sum((n - 1) / n)) / (L * (L - 1) / 2))
    mixed = value_mix(C, f2 if spread is None else row_profiles(att, m, spread)[0], att.p, a)
    shift = out.cov - base_off
    mixed += shift
    mixed.flat[::L + 1] += row_vars(att, m, out.var) - base_diag - shift
    return mixed, spread
