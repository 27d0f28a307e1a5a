"""Backward pass of a causal decoder with one gradient covariance per pair of token positions.

The exchangeable maps carry one gradient variance and one correlation for all tokens. A causal,
rank-collapsed Post-LN stack breaks that: position i attends to n_i = i + 1 keys, so token 1
(0-based 0) sees only itself and its attention output is its own value, while every later
position is an average that its own perturbations barely move. Going down the stack the
gradient of position j > 0 decays by ≈ (1 + c_v/n_j)/(1 + c_v) per attention sublayer (c_v =
d²σ_v²σ_o², the V∘O gain) and position 0 keeps gain ≈ 1, so below the top layers the first
token carries almost all the gradient (measured > 99% at depth 48).

State: G (L, L), G_ij = E[g_i^a g_j^a] (per feature; the record's grad_var is tr G / L). Forward
moments come from the exchangeable chain; per-row quantities from the causal softmax profiles
F2(n) = EΣS², B(n) = E tr Q_S² of a row with n keys (`tables.FunctionalTable.profiles`),
averaged over the finite-width logit-scale fluctuations like `Attention`.

* Tokenwise map c (linear, norm, activation, dropout): its exchangeable backward is linear in
  (σ_g², Cov_g) and acts per token, so G' = a·diag(G) + b·offdiag(G) with
  a = c.bwd(m, (1, 0)).grad_var and b = c.bwd(m, (1, 1)).grad_cov.
* Attention, V path: g^V_j = W_vᵀ Σ_i a_ij g_i, so G' = d σ_v² Σ_{i,i'} E[a_ij a_i'k] G_ii'. With
  rows independent given the forward moments (E[a_ij a_i'k] = E a_ij E a_i'k, i ≠ i') and each
  row's keys exchangeable (S' = S ⊙ mask/(1−p)):
      G' = d σ_v² (Mᵀ G M + Σ_i G_ii D_i),   M = γ₁I + (1 − γ₂)U,  U_ij = 1[j ≤ i]/n_i,
      (D_i)_jk = 1[j, k ≤ i] (F2_i/(n_i(1−p)) − 1/n_i²)              for j = k,
               = 1[j, k ≤ i] ((1 − F2_i)/(n_i(n_i − 1)) − 1/n_i²)     for j ≠ k.
  Exact for uniform rows (F2 = 1/n: the rank-collapsed regime, logit scale β² ∝ 1 − r → 0).
  Rows are not independent: two queries' logits on a key they both read have covariance ρβ² (ρ the
  queries' correlation), so E[S_ij S_i'j] = (1 + c)/(n_i n_i') for i ≠ i', j ≤ min(i, i'), with c =
  `row_pair_excess` = K1/K1_uniform − 1 (K1 = E Σ_j S_ij S_i'j, the pair functional `Attention` averages over
  query pairs, against 1/max(n_i, n_i') for uniform rows; c ≈ e^{ρβ²} − 1, taken alike for every pair of rows
  that read two keys or more; row 0 reads one, S_00 = 1, so c = 0 with it). Each row sums to 1, so the
  weights of two rows i < i' on two different keys covary the less: with n = n_i (row i's keys are all shared),
  row i's sum over its keys for a fixed k ≤ i gives E[S_ij S_i'k] = (1 − c/(n − 1))/(n n_i') for j ≠ k both
  shared, and then row i''s sum gives exactly 1/(n n_i') for a key k > i only row i' reads. The dropout masks
  of two rows are independent, so the V path gains c·K (`_shared_keys`):
      K_jj = Σ_{i ≠ i', min(i, i') ≥ max(j, 1)} G_ii'/(n_i n_i'),
      K_jk = −Σ_{i ≠ i', min(i, i') ≥ max(j, k)} G_ii'/(n_i n_i' (min(n_i, n_i') − 1))   (j ≠ k):
  nothing for independent upstream gradients; for correlated ones the gradient the early keys collect from
  every later row, and less covariance between keys. Against Monte Carlo of a Pre-LN and a Post-LN sublayer at
  r = 0.3 under upstream gradients correlated 0.8 (tests/test_moments_causal.py): without c the position
  average 5 % low; with the same-key excess put on every pair of keys the covariance between positions 5–6 %
  high; with K within 1.3 %. In a deep standard Pre-LN decoder that excess between keys compounds through the
  bottom blocks, whose norms multiply the gradient by ~d/2: put on every pair of keys it left a 48-layer
  decoder's embedding gradient 81 % high, with K it is within its Monte-Carlo error (bench/preln_bottom.py).
* Attention, Q and K paths: the exchangeable map's totals (`Attention.query_path`, `key_path`) at
  the position-averaged gradient, given to the rows in proportion to w_i ∝ G_ii B(n_i) (query i's
  softmax Jacobian Q_S vanishes when it sees one key, B(1) = 0, so a gradient held by the first
  token has no Q/K path). Row i's Q path lands on query i; its K path g^K_j = Σ_i dY_ij u_i lands
  on the n_i keys it reads, evenly (they are exchangeable within the row): key j gets
  Σ_{i ≥ j} w_i/n_i of it. A position-independent gradient recovers the exchangeable totals.
* Key spread per row (`row_spread`, from the forward per pair below). Row i's logits q_i·k_j vary over its
  keys j ≤ i only through the keys' own parts: with the keys' covariance C over positions, their variance
  about the row's common part is s_i = v_i − c_i (v_i the keys' mean variance, c_i the mean covariance of
  their pairs), against s̄ = v̄ − c̄ of the whole input, which the exchangeable map reads (its s² = (1 − r)σ²).
  Causal averaging leaves early positions more alike, so the early rows' keys spread less. Row i is then read
  at its own logit variance (s_i/s̄)β̄²: its F2 and B profiles, so its
  softmax and its V path; its Q path ∝ s_i² B_i (the query gradient Σ_l dY_il x_l carries the keys'
  spread once through dY_il ∝ g_i·(V_l − V̄), λ ∝ s_i, and once through x_l) and its K path ∝ s_i B_i (once,
  through λ), both against the exchangeable totals at s̄ (so a uniform C, every s_i = s̄, gives them back).
  Against Monte Carlo of a Pre-LN and a Post-LN sublayer on such a covariance (tests/test_moments_causal.py):
  every position within 2.6 %; every row at s̄ puts the second position 8 % high.
* Forward variance per position (`position_fwd`): causal rows mix different numbers of keys, so a
  causal stack's positions carry different variances (row i's attention output f̄ (m₂ + s²F2_i)/
  (m₂ + s²F̄2)); a residual adds them per position. Tokenwise backward factors are then taken per
  position, a norm's as 1/v_i (N(cx) = N(x)), which turns the early positions (large variance, where
  the V path piles the gradient) down and the late ones up.
* Forward covariance per pair of positions (`pair_forward`). Causal rows also make the token correlation
  depend on the pair: after one attention sublayer rows i and i' share their first min(n_i, n_i') values
  (covariance ∝ 1/max(n_i, n_i') on top of the shared part), so early positions are more alike than late
  ones, and row i of the next attention averages its own prefix, whose mean correlation exceeds the stack's.
  The exchangeable maps read the stack's mean and under-predict the early rows (a 3-block norm-free decoder's
  forward variance 13.8 % low in median, its upper blocks' most: bench/pair_forward.py). State: C (L, L),
  C_jk = Cov(x_j^a, x_k^a).
  Attention mixes the values with rows independent given the forward moments and keys exchangeable within
  a row, as in the V path above:
      P(C)_ii' = Σ_{k ≤ i, k' ≤ i'} C_kk'/(n_i n_i')                                          (i ≠ i'),
      P(C)_ii  = F2_i/(n_i(1 − p)) Σ_{k ≤ i} C_kk + (1 − F2_i)/(n_i(n_i − 1)) Σ_{k ≠ k' ≤ i} C_kk',
  and C' = a·P(C) + (E − a·P(C̄)), a = d²σ_v²σ_o², C̄ the exchangeable input (variance and covariance of the
  pair means): the exchangeable map E (which also carries what P leaves out, the logits' coupling to the
  values and across rows) shifts row i's variance by E_ii − a·P(C̄)_ii (E_ii = `row_vars`) and every
  covariance by the mean off-diagonal of E − a·P(C̄), so a uniform C gives the exchangeable map back.
  A run of tokenwise maps acts on each pair through its correlation map ρ ↦ ρ' (the run's exchangeable forward at
  the input's mean and variance, interpolated over the pairs' range of ρ through PAIR_NODES Chebyshev nodes: every
  record within 2e-4 of 7 nodes', tests/test_moments_causal.py), scaled by the per-position output variances
  (`position_fwd`); reading the map at the mean variance is exact for homogeneous maps (linear, ReLU) and for norms.
  A residual adds C's. The records and every exchangeable map downstream then read C's means (variance: the mean
  diagonal; correlation: the mean off-diagonal over it), and the backward the per-position variances on C's
  diagonal and each causal row's key spread (`row_spread`). A Post-LN sublayer y = N(αx + βf) adds α²C + β²B
  (B the branch's C, uncorrelated with its input at init), normalizes each position (entry (j, k) over
  √(Z_jj Z_kk)) and shifts every correlation by the exchangeable map's O(1/d) correction (so a uniform C gives
  `PostNormResidual.fwd` back); its norm's backward then reads each row's branch variance from B's diagonal.
  Cross-attention (`QueryView`) is tokenwise over the decoder's positions: row i's output reads its own query
  and the memory only, so a pair's covariance is the exchangeable map's at that pair's query correlation (the
  memory shared by both rows, as that map takes it) and a position's variance the map's at its own; it joins the
  runs of tokenwise maps. (A 3-block Pre-LN encoder–decoder, width 32, 16 tokens, 1500 networks: the decoder's
  token correlation within 0.008 in its upper two blocks, against 0.012–0.014 with the exchangeable forward.)
  Covered (`pairs_cover`): an embedding, then tokenwise maps and residual or Post-LN sublayers whose branches
  hold tokenwise maps, cross-attention and standard causal attention; any other chain (shaped attention, RoPE)
  keeps the per-position variances of `position_fwd`.
  Monte Carlo: tests/test_moments_causal.py (the mixing P against sampled causal rows; a norm-free stack per
  position), the knob test of `predict` (tests/test_predict_knobs.py) and bench/pair_forward.py (Pre-LN, Post-LN,
  DSLM, Admin, GPT-2-style and norm-free decoders, per pair against per position alone).
* Post-LN sublayer y = N(α x + β f(x)): `PostNormResidual`'s per-token factors (1 + v)(1 − S/d)/EK
  (diagonal) and (1 + ¾v + ¼c₂)(1 − S(1 − ρ²/2)/d)/EK (off-diagonal, geometric mean of the two
  tokens'), with the attention branch variance of row i: B_ii of the forward per pair where it ran, else
  f̄ (m₂ + s²F2_i)/(m₂ + s²F̄2) (V-path forward of a row with n_i keys; f̄, F̄2 the row averages).
  The radial constraint (`postnorm` module docstring): after a homogeneous FFN branch both factors of
  `PostNormResidual.radial_factor`; after an attention branch the coherent value path's matrices, Mᵀ G_z M
  × (1 − δ_V/(k − 1)) and −αβκ(G_z M + (G_z M)ᵀ), which on the first token (M₀₀ = 1) are its exact
  single-token factor (x W_v W_o is homogeneous there).
* Residual: G' = α² G + β² branch(G); Serial: the maps in reverse order.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
import torch

from .attention import Attention, row_profiles
from .blocks import Serial, parts, serial
from .cross_attention import QueryView
from .dropout import Dropout
from .embedding import Embedding
from .gated import GatedMLP
from .linear import Linear
from .norm import LayerNorm, RMSNorm
from .pointwise import GeLU, PiecewiseLinear, ReLU, ShapedReLU, Smooth
from .postnorm import PostNormResidual, coherent_attention, homogeneous_kurtosis
from .residual import Residual
from .rope import RopeAttention
from .state import Component, Moments, ratio, replace
from .tables import key_counts

_UNIT, _SHARED = Moments(0.0, 1.0, 0.0, 1.0, 0.0), Moments(0.0, 1.0, 0.0, 1.0, 1.0)
PAIR_NODES = 3          # Chebyshev nodes of a tokenwise run's correlation map over the pairs' range (`pair_forward`)
_TOKENWISE = (Linear, Dropout, LayerNorm, RMSNorm, GeLU, PiecewiseLinear, ReLU, ShapedReLU, Smooth, GatedMLP,
              QueryView)     # maps acting on each position alone (`QueryView` with the memory fixed)


@lru_cache(maxsize=8)
def _later(L: int) -> np.ndarray:
    """max(j, k) over position pairs, (L, L) (read-only)."""
    idx = np.arange(L)
    out = np.maximum.outer(idx, idx)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=8)
def _upper(L: int) -> np.ndarray:
    """1[j < k] over position pairs, (L, L) (read-only)."""
    out = np.triu(np.ones((L, L)), 1)
    out.flags.writeable = False
    return out


def _tail(x: np.ndarray) -> np.ndarray:
    """Σ_{i ≥ j} x_i for every j (a reversed cumulative sum)."""
    return np.cumsum(x[::-1])[::-1]


def _times_u(G: np.ndarray, n: np.ndarray) -> np.ndarray:
    """G U (U_jk = 1[k ≤ j]/n_j) in O(L²): (G U)_ik = Σ_{j ≥ k} G_ij/n_j (torch's cumulative sum along rows:
    numpy's is a few times slower there)."""
    return torch.from_numpy(G / n).flip(1).cumsum(1).flip(1).numpy()


def _residual_sum(c: Residual | PostNormResidual, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """α²X + β²Y of the residual sublayer ``c`` (its input's and its branch's covariances), written into ``Y``
    when it is not ``X`` (a branch's result is a new array unless the branch is the identity)."""
    if Y is X:
        return (c.alpha ** 2 + c.beta ** 2) * X
    if c.beta != 1.0:
        Y *= c.beta ** 2
    Y += X if c.alpha == 1.0 else c.alpha ** 2 * X
    return Y


def _alike(v: np.ndarray) -> bool:
    """Whether every position's value is the same."""
    return bool(v.max() == v.min())


def _gains(G: np.ndarray, on: np.ndarray | float, off: np.ndarray | float) -> np.ndarray:
    """G with its diagonal times ``on`` and its off-diagonal times ``off`` (scalars, or per-position
    vectors: entry (j, k) × off_j off_k)."""
    if isinstance(off, np.ndarray):
        out = off[:, None] * off
        out *= G
    else:
        out = G * off
    out.flat[::len(G) + 1] = np.diagonal(G) * on
    return out


@lru_cache(maxsize=65536)
def _tokenwise_gains(c: Component, m: Moments) -> tuple[float, float]:
    """A map's (diagonal, off-diagonal) gradient factors on input ``m``: the variance of its backward of a unit,
    uncorrelated gradient and the covariance of its backward of a unit, fully shared one. Two calls, since a map
    that mixes tokens without a per-position form (`RopeAttention`) reads the gradient's correlation in its
    variance."""
    return c.bwd(m, _UNIT).grad_var, c.bwd(m, _SHARED).grad_cov


_AFFINE = (Linear, Dropout)     # output variance affine in the input's, gradient factors independent of it


def _position_gains(c: Component, m: Moments, v: np.ndarray | None) -> tuple[np.ndarray | float, np.ndarray | float]:
    """`_tokenwise_gains` on the exchangeable input ``m``, or per position where the input variances ``v``
    differ: (diagonal factors a_i, off-diagonal s_i with entry (j, k) × s_j s_k, s_i = √b_i). A norm is scale
    invariant, N(cx) = N(x), so both of its factors go as 1/v_i; any other map is evaluated at each v_i. An
    affine map's backward does not read its input, so its factors are taken once per map (at ``_UNIT``)."""
    if isinstance(c, _AFFINE):
        return _tokenwise_gains(c, _UNIT)
    if v is None or _alike(v):
        return _tokenwise_gains(c, m)
    if isinstance(c, (LayerNorm, RMSNorm)):
        a0, b0 = _tokenwise_gains(c, m)
        a, b = a0 * m.var / v, b0 * m.var / v
    else:
        a, b = np.array([_tokenwise_gains(c, replace(m, var=float(x))) for x in v]).T
    if np.any(b < 0):
        raise NotImplementedError(f"{type(c).__name__}: a negative off-diagonal gradient factor differing by "
                                  "position has no per-position form")
    return a, np.sqrt(b)


def position_fwd(c: Component, m_in: Moments, v: np.ndarray, m_out: Moments | None = None,
                 inner: list[np.ndarray] | None = None) -> np.ndarray:
    """Per-position forward variances (L,) at the output of ``c``, given those of its input ``v`` and the
    exchangeable input ``m_in`` (which gives every position its mean and correlation); ``m_out``: ``c``'s
    exchangeable output if known (else ``c.fwd(m_in)``); ``inner``: `_residual_inputs` of a residual ``c``.

    A residual adds per position, α²v_i + β²f_i (the branch output is uncorrelated with its input at init);
    causal attention gives row i the variance of its n_i keys (`row_vars`, from the exchangeable input: exact
    behind a norm, which makes every position's input alike; with RoPE, `RopeAttention.position_vars` from its
    samples); a norm, and so a Post-LN sublayer, leaves all positions alike; any other tokenwise map acts on each
    position's variance."""
    if isinstance(c, Serial):
        return _serial_inputs(c.components, c.trace(m_in), v)[-1]
    if isinstance(c, Residual):
        return c.alpha ** 2 * v + c.beta ** 2 * (position_fwd(c.branch, m_in, v) if inner is None else inner[-1])
    out_var = (c.fwd(m_in) if m_out is None else m_out).var
    if isinstance(c, Attention) and c.causal:
        return row_vars(c, m_in, out_var)
    if isinstance(c, RopeAttention) and c.attention.causal:
        return c.position_vars(m_in)
    if isinstance(c, (PostNormResidual, Attention, LayerNorm, RMSNorm)) or _alike(v):
        return np.full(len(v), out_var)
    if isinstance(c, _AFFINE) and m_in.var > 0:
        f1 = c.fwd(replace(m_in, var=2 * m_in.var)).var
        return out_var + (f1 - out_var) * (v / m_in.var - 1)
    return np.array([c.fwd(replace(m_in, var=float(x))).var for x in v])


def _serial_inputs(components: tuple[Component, ...], states: list[Moments] | tuple[Moments, ...], v: np.ndarray
                   ) -> list[np.ndarray]:
    """Per-position variances at the input of each of ``components`` (exchangeable ``states``: the input, then
    each output), then at the output: `position_fwd` along the chain."""
    per = [v]
    for comp, m, m_out in zip(components, states, states[1:]):
        per.append(position_fwd(comp, m, per[-1], m_out))
    return per


def _residual_inputs(c: Component, m_in: Moments, v: np.ndarray) -> list[np.ndarray] | None:
    """`_serial_inputs` of the branch of a residual ``c`` on per-position input variances ``v``, which its forward
    (`position_fwd`) and its backward (`position_bwd`) both read; None for any other map."""
    if isinstance(c, Residual) and isinstance(c.branch, Serial):
        return _serial_inputs(c.branch.components, c.branch.trace(m_in), v)
    return None


def _position_means(M: np.ndarray) -> tuple[float, float]:
    """(mean diagonal, mean off-diagonal) of an (L, L) covariance over positions."""
    L = len(M)
    var = float(M.trace()) / L
    return var, (float(M.sum()) - L * var) / (L * (L - 1))


def _scalar(G: np.ndarray, m: Moments) -> Moments:
    """``m`` with the position-averaged gradient moments of G."""
    var, cov = _position_means(G)
    return replace(m, grad_var=var, grad_corr=ratio(cov, var))


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
    upper = np.einsum("ij,ij->i", G, _later_pairs(L))     # Σ_{i' > i} G_ii'/(n_i n_i'), per row i
    shared = 2 * c * _tail(upper)                            # c·A_l
    other = np.zeros(L)
    other[1:] = upper[1:] / (n[1:] - 1)
    out = (-2 * c * _tail(other))[_later(L)]                 # −c·T_max(j,k)
    out.flat[::L + 1] = shared
    out[0, 0] = shared[1] if L > 1 else 0.0                  # row 0 reads one key: no excess with it
    return out


def _attention(att: Attention, m: Moments, G: np.ndarray, coherent: float = 1.0,
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
    rows = _tail(off)[_later(L)]                                                       # Σ_{i ≥ max(j, k)}
    rows.flat[::L + 1] = _tail(on)
    rows += mgm if coherent == 1.0 else coherent * mgm
    excess = coherent * row_pair_excess(st.pairs)
    if excess != 0.0:
        rows += _shared_keys(G, n, excess)
    v_path = rows
    v_path *= att.d * att.v_var
    g = _scalar(G, m)                                                     # the Q and K paths read its grad fields
    (q_var, q_cov), (k_var, k_cov) = att.query_path(st, g), att.key_path(st, g, att.L)   # `mix_bwd_paths`' Q + K
    qk_var, qk_cov = q_var + k_var, q_cov + k_cov
    sbar, bbar = float(gii.sum()) / L, b if spread is None else row_profiles(att, m)[1]
    if qk_var <= 0 or sbar <= 0 or bbar.sum() <= 0:
        return v_path, gm
    w = L * gii * b / (sbar * bbar.sum())                     # row weights ∝ G_ii B(n_i), mean 1 if G_ii ∝ 1
    wq, wk = (w, w) if spread is None else (w * np.square(spread), w * np.asarray(spread))     # Q ∝ s_i², K ∝ s_i
    q_diag = (qk_var - k_var) * wq + k_var * _tail(wk / n)                     # Q on the query, K over its n_i keys
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


def _standard_causal(c: Component) -> bool:
    return isinstance(c, Attention) and c.causal and not c.shaped


def pairs_cover(components: list[Component] | tuple[Component, ...], L: int) -> bool:
    """Whether `pair_forward` traces this chain: an `Embedding`, then tokenwise maps and `Residual` or
    `PostNormResidual` sublayers whose branches hold only tokenwise maps (cross-attention among them) and standard
    causal attention, over L ≥ 2 positions."""
    def covered(c: Component) -> bool:
        if isinstance(c, (Residual, PostNormResidual)):
            return all(isinstance(q, _TOKENWISE) or _standard_causal(q) for q in parts(c.branch))
        return isinstance(c, _TOKENWISE)
    return L >= 2 and len(components) > 0 and isinstance(components[0], Embedding) and all(
        covered(c) for c in components[1:])


def _uniform(m: Moments, L: int) -> np.ndarray:
    """The exchangeable covariance over L positions: σ² on the diagonal, rσ² off it."""
    out = np.full((L, L), m.cov)
    out.flat[::L + 1] = m.var
    return out


def _summary(C: np.ndarray, m: Moments) -> Moments:
    """``m`` with C's position means: variance the mean diagonal, correlation the mean off-diagonal over it."""
    var, cov = _position_means(C)
    return replace(m, var=var, corr=ratio(cov, var))


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
    block = np.cumsum(2 * (np.ones(L) @ (C * _upper(L))) + diag)
    var, cov = _position_means(C)
    if var - cov <= SPREAD_TOLERANCE * var:
        return None
    s = (own / n - (block - own) / np.maximum(n * (n - 1), 1)) / (var - cov)
    s[0] = 1.0
    if np.max(np.abs(s - 1)) <= SPREAD_TOLERANCE:
        return None
    return tuple(np.maximum(s, 0.0).tolist())


def _attention_pairs(att: Attention, m: Moments, C: np.ndarray, out: Moments
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


_CHEB = np.polynomial.chebyshev.chebpts1(PAIR_NODES)
_CHEB_INV = np.linalg.inv(np.vander(_CHEB, PAIR_NODES, increasing=True))     # node values -> monomials in x
_NEGLIGIBLE = 1e-9      # a monomial whose largest contribution over the range is below it is dropped


def _run_corr(run: tuple[Component, ...], m: Moments, corr: float) -> float:
    """The output correlation of the maps ``run`` in turn on ``m`` with its correlation set to ``corr``."""
    m = replace(m, corr=corr)
    for c in run:
        m = c.fwd(m)
    return m.corr


def _tokenwise_pairs(run: tuple[Component, ...], m: Moments, C: np.ndarray, v_out: np.ndarray) -> np.ndarray:
    """C at the output of a run of tokenwise maps: each pair's correlation through the run's exchangeable
    correlation map at ``m``, interpolated by the degree PAIR_NODES − 1 polynomial through its values at the
    Chebyshev nodes of the pairs' range [lo, hi] of ρ (evaluated by Horner in ρ − c, c the range's centre; the
    top terms dropped while each adds less than _NEGLIGIBLE over the range), times the per-position output
    standard deviations ``v_out``^½."""
    L = len(C)
    inv_sd = 1 / np.sqrt(np.diagonal(C))
    rho = C * inv_sd[:, None]
    rho *= inv_sd
    rho.flat[::L + 1] = rho[0, 1]
    lo, hi = float(rho.min()), float(rho.max())
    centre, half = (lo + hi) / 2, (hi - lo) / 2
    uniform = _alike(v_out)
    scale = float(v_out[0]) if uniform else 1.0                     # folded into the polynomial when uniform
    if half <= 1e-12:
        mapped = np.full((L, L), scale * _run_corr(run, m, max(-1.0, min(1.0, centre))))
    else:
        at = np.clip(centre + half * _CHEB, -1.0, 1.0)
        values = np.array([_run_corr(run, m, float(x)) for x in at])
        coef = _CHEB_INV @ values                                   # monomials in x = (ρ − c)/half ∈ [−1, 1]
        degree = PAIR_NODES - 1
        while degree > 1 and abs(coef[degree]) < _NEGLIGIBLE:
            degree -= 1
        coef = coef[:degree + 1] / half ** np.arange(degree + 1)    # monomials in u = ρ − c
        if degree == 1 and abs(coef[0] - centre) < _NEGLIGIBLE and abs(coef[1] - 1) < _NEGLIGIBLE:
            mapped = rho                                            # the identity
            mapped *= scale
        else:
            coef *= scale
            u = rho
            u -= centre
            mapped = u * coef[-1]
            for c in coef[-2:0:-1]:
                mapped += c
                mapped *= u
            mapped += coef[0]
    if uniform:
        mapped.flat[::L + 1] = scale
    else:
        mapped.flat[::L + 1] = 1.0
        out_sd = np.sqrt(v_out)
        mapped *= out_sd[:, None]
        mapped *= out_sd
    return mapped


Spreads = list[tuple[float, ...] | None]    # per map of a branch: a causal attention's key spreads, else None


def _branch_pairs(branch: Component, m: Moments, C: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], Spreads]:
    """C at the output of a residual branch from C at its input, the per-position variances at the input of
    each of its maps, then at its output (what `position_bwd` reads as ``inner``), and each map's key spreads
    (``spreads``). Each map is evaluated on the branch's exchangeable trace from ``m`` (C's means at the branch
    input), as the backward evaluates it."""
    maps = parts(branch)
    states = branch.trace(m) if isinstance(branch, Serial) else [m, branch.fwd(m)]
    within, spreads = [np.diagonal(C).copy()], [None] * len(maps)
    i = 0
    while i < len(maps):
        if _standard_causal(maps[i]):
            C, spreads[i] = _attention_pairs(maps[i], states[i], C, states[i + 1])
            within.append(np.diagonal(C).copy())
            i += 1
        elif isinstance(maps[i], Dropout) and maps[i].p == 0:            # the identity
            within.append(within[-1])
            i += 1
        else:
            j = i
            while j < len(maps) and not _standard_causal(maps[j]):
                j += 1
            per = _serial_inputs(maps[i:j], states[i:j + 1], within[-1])[1:]
            C = _tokenwise_pairs(maps[i:j], states[i], C, per[-1])
            within += per
            i = j
    return C, within, spreads


def _postnorm_pairs(c: PostNormResidual, C: np.ndarray, B: np.ndarray, out: Moments) -> np.ndarray:
    """C at the output of the Post-LN sublayer ``c`` from C and the branch's B at its input: the sum α²C + β²B
    (the branch is uncorrelated with its input at init) normalized per position, plus the exchangeable map's
    O(1/d) shift of the correlation (``out``: its output), so a uniform C gives that map back."""
    Z = _residual_sum(c, C, B)
    inv_sd = 1 / np.sqrt(np.diagonal(Z))
    Z *= inv_sd[:, None]
    Z *= inv_sd
    L = len(Z)
    Z += out.corr - (float(Z.sum()) - float(np.trace(Z))) / (L * (L - 1))
    Z.flat[::L + 1] = 1.0
    Z *= out.var
    return Z


Forward = tuple[list[Moments], list[np.ndarray], list[list[np.ndarray] | None], list[Spreads | None]]


def pair_forward(components: list[Component], m_in: Moments, L: int) -> Forward:
    """The forward trace of a chain `pairs_cover` accepts, with one covariance per pair of positions (module
    docstring): (states: the input, then each component's output, with C's means; the per-position variances at
    each component's input, then at the output; for each residual or Post-LN sublayer, those inside its branch,
    else None; and its branch maps' key spreads, else None)."""
    m, C = m_in, None
    states, per, inner, spreads = [m_in], [np.full(L, m_in.var)], [], []
    for c in components:
        within = spread = None
        if C is None:                                               # the embedding: exchangeable tokens
            out = c.fwd(m)
            C = _uniform(out, L)
        elif isinstance(c, Residual):
            B, within, spread = _branch_pairs(c.branch, m, C)
            C = _residual_sum(c, C, B)
            out = _summary(C, c.fwd(m))                             # the branch trace is cached
        elif isinstance(c, PostNormResidual):
            B, within, spread = _branch_pairs(c.branch, m, C)
            out = c.fwd(m)                                          # C's means by construction
            C = _postnorm_pairs(c, C, B, out)
        else:
            out = c.fwd(m)
            C = _tokenwise_pairs((c,), m, C, position_fwd(c, m, per[-1], out))
            out = _summary(C, out)
        states.append(out)
        per.append(np.diagonal(C).copy())
        inner.append(within)
        spreads.append(spread)
        m = out
    return states, per, inner, spreads


def _postnorm(c: PostNormResidual, m: Moments, f: Moments, rows: np.ndarray | None = None
              ) -> tuple[np.ndarray | float, np.ndarray | float]:
    """The norm's diagonal and off-diagonal gradient factors (module docstring): per position after an
    attention branch, scalars after a tokenwise one; ``f``: the branch output; ``rows``: its per-position
    variances where the forward traced them (`pair_forward`), else those of `row_vars`."""
    att = parts(c.branch)[0]
    if rows is None:
        fvar = row_vars(att, m, f.var) if isinstance(att, Attention) else f.var
    else:
        fvar = f.var if _alike(rows) else rows
    on, off = c.grad_gains(m, fvar, f.corr)
    return on, np.sqrt(off) if isinstance(off, np.ndarray) else off   # `_gains`: a vector enters squared


def _postnorm_bwd(c: PostNormResidual, m_in: Moments, G: np.ndarray, inner: list[np.ndarray] | None = None,
                  spreads: Spreads | None = None) -> tuple[np.ndarray, np.ndarray]:
    """G at the input of the Post-LN sublayer ``c``, and the diagonal of its branch part β²·branch(G_z), the
    part that is not mean-free (`position_trace` sets the next sublayer's S from it). After an attention
    branch the coherent value path carries the radial constraint (module docstring): its Mᵀ G_z M part
    × (1 − δ_V/(k − 1)), and the residual–value cross term −αβκ(G_z M + (G_z M)ᵀ). ``inner``, ``spreads``: the
    branch's per-position variances and key spreads where the forward traced them per pair (`pair_forward`)."""
    maps = parts(c.branch)
    states = serial(*maps).trace(m_in)
    Gz = _gains(G, *_postnorm(c, m_in, states[-1], None if inner is None else inner[-1]))
    if (att := coherent_attention(c.branch)) is not None:
        eps_v, kappa = c.coherent_radial(att)
        branch, gm = _attention(att, m_in, Gz, 1 - eps_v, None if spreads is None else spreads[maps.index(att)])
        out = gm + gm.T
        out *= -c.alpha * c.beta * kappa / (att.d * att.o_var)                 # −αβκ(G_z M + (G_z M)ᵀ)
        out += c.alpha ** 2 * Gz
        out += c.beta ** 2 * branch
        return out, c.beta ** 2 * np.diag(branch)
    branch = _serial_bwd(maps, states, Gz, spreads=spreads)
    out = c.alpha ** 2 * Gz + c.beta ** 2 * branch
    if (eta := homogeneous_kurtosis(c.branch)) is not None:
        out = _gains(out, *c.radial_factor(m_in, states[-1].var, states[-1].corr, eta))
    return out, c.beta ** 2 * np.diag(branch)


def _serial_bwd(components: tuple[Component, ...], states: list[Moments], G: np.ndarray,
                v: np.ndarray | None = None, inner: list[np.ndarray] | None = None,
                spreads: Spreads | None = None) -> np.ndarray:
    """G back through ``components`` given their forward ``states`` (input, then each output) and, with
    ``v``, the per-position input variances (``inner``: those at each component, `_serial_inputs`, if known;
    ``spreads``: each causal attention's key spreads, `row_spread`). The factors of consecutive tokenwise maps
    multiply, so a run of them touches G once."""
    per: list[np.ndarray | None] = [None] * len(components)
    if inner is not None:
        per = inner
    elif v is not None:
        per = _serial_inputs(components[:-1], states, v)
    spreads = spreads or [None] * len(components)
    on: np.ndarray | float = 1.0
    off: np.ndarray | float = 1.0
    for comp, m, p, spread in zip(reversed(components), reversed(states[:-1]), reversed(per[:len(components)]),
                                  reversed(spreads)):
        if isinstance(comp, Attention):
            G = _attention(comp, m, G if _unit(on, off) else _gains(G, on, off), spread=spread)[0]
            on = off = 1.0
        elif isinstance(comp, RopeAttention) and comp.attention.causal:
            G = comp.position_bwd(m, G if _unit(on, off) else _gains(G, on, off))
            on = off = 1.0
        elif isinstance(comp, (Serial, Residual, PostNormResidual)):
            G = position_bwd(comp, m, G if _unit(on, off) else _gains(G, on, off), p)
            on = off = 1.0
        else:
            a, b = _position_gains(comp, m, p)
            if isinstance(b, np.ndarray) or isinstance(off, np.ndarray):      # entry (j, k) × s_j s_k from here on
                off, b = _root(off, comp), _root(b, comp)
            on, off = on * a, off * b
    return G if _unit(on, off) else _gains(G, on, off)


def _root(off: np.ndarray | float, c: Component) -> np.ndarray | float:
    """An off-diagonal factor as the per-position root s (entry (j, k) × s_j s_k): a vector already is one."""
    if isinstance(off, np.ndarray):
        return off
    if off < 0:
        raise NotImplementedError(f"{type(c).__name__}: a negative off-diagonal gradient factor beside "
                                  "per-position ones has no per-position form")
    return off ** 0.5


def _unit(on: np.ndarray | float, off: np.ndarray | float) -> bool:
    return not isinstance(on, np.ndarray) and not isinstance(off, np.ndarray) and on == off == 1.0


def position_bwd(c: Component, m_in: Moments, G: np.ndarray, v: np.ndarray | None = None,
                 inner: list[np.ndarray] | None = None, spreads: Spreads | None = None) -> np.ndarray:
    """The gradient covariance over positions at the input of ``c`` (forward input ``m_in``; with ``v``, the
    per-position input variances that tokenwise gains read; ``inner``: `_residual_inputs` of a residual ``c``;
    ``spreads``: the key spreads of its (branch's) maps, from `pair_forward`), given G at its output."""
    if isinstance(c, Serial):
        return _serial_bwd(c.components, c.trace(m_in), G, v, inner, spreads)
    if isinstance(c, Residual):
        return _residual_sum(c, G, position_bwd(c.branch, m_in, G, v, inner, spreads))
    if isinstance(c, PostNormResidual):
        return _postnorm_bwd(c, m_in, G, inner, spreads)[0]
    if isinstance(c, Attention):
        return _attention(c, m_in, G, spread=spreads[0] if spreads else None)[0]
    if isinstance(c, RopeAttention) and c.attention.causal:
        return c.position_bwd(m_in, G)
    return _gains(G, *_position_gains(c, m_in, v))


def position_forward(components: list[Component], states: list[Moments], L: int, pairs: bool = True) -> Forward:
    """The forward that `position_trace`'s backward reads: (states, the per-position variances at each component's
    input then at the output, those inside each residual's branch or None, and its branch maps' key spreads or
    None, as `pair_forward`). With ``pairs``, a chain `pairs_cover`
    accepts is traced per pair of positions from ``states[0]`` (`pair_forward`); any other chain, or
    ``pairs=False``, keeps the exchangeable ``states`` (the input, then each component's output) and takes the
    per-position variances of `position_fwd`."""
    if pairs and pairs_cover(components, L):
        return pair_forward(components, states[0], L)
    per, inner = [np.full(L, states[0].var)], []
    for c, m, m_out in zip(components, states, states[1:]):
        inner.append(_residual_inputs(c, m, per[-1]))
        per.append(position_fwd(c, m, per[-1], m_out, inner[-1]))
    return list(states), per, inner, [None] * len(components)


def position_trace(components: list[Component], states: list[Moments], g_out: Moments, L: int,
                   pairs: bool = True) -> list[Moments]:
    """``states`` (the forward trace: input, then each component's output) with the gradient moments of
    the per-position backward: position-averaged variance tr G/L and correlation. The backward starts from
    ``g_out`` (exchangeable) at the output. A centred Post-LN sublayer under another gets, per position, the
    upper one's non-mean-free share S_j = β²branch_jj/G_jj as ``upstream_align`` (as `postnorm.trace_bwd`
    does for the exchangeable backward). With ``pairs``, a chain `pairs_cover` accepts is traced forward per pair
    of positions from ``states[0]`` (`pair_forward`; the rest of ``states`` is not read, so the input alone will
    do), and its returned states carry that forward's means; any other chain, or ``pairs=False``, keeps
    ``states`` and the per-position variances of `position_fwd`."""
    G = g_out.grad_var * ((1 - g_out.grad_corr) * np.eye(L) + g_out.grad_corr)
    align: np.ndarray | None = None
    states, per, inner, spreads = position_forward(components, states, L, pairs)
    out = [_scalar(G, states[-1])]
    for c, m, p, within, spread in zip(reversed(components), reversed(states[:-1]), reversed(per[:-1]),
                                       reversed(inner), reversed(spreads)):
        if isinstance(c, PostNormResidual):
            if align is not None and c.centered:
                c = dataclasses.replace(c, upstream_align=align)
            G, branch = _postnorm_bwd(c, m, G, within, spread)
            total = np.diag(G)
            align = np.divide(branch, total, out=np.zeros_like(total), where=total > 0)  # deep late positions underflow
        else:
            G, align = position_bwd(c, m, G, p, within, spread), None
        out.append(_scalar(G, m))
    return out[::-1]
