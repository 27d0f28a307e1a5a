"""qk-norm: each head's queries and keys normalized before the logits, as the attention map reads them.

Queries q_i = W_q x_i and keys k_j = W_k x_j of one head (d_k coordinates) go through a norm of their own
(Wortsman et al. 2023, arXiv 2309.14322; Dehghani et al. 2023, arXiv 2302.05442; OLMo 2, Qwen3, Gemma 3):
q̂ = g_q √d_k u/|u| with u = q − mean(q) (LayerNorm: k = d_k − 1 degrees of freedom) or u = q (RMSNorm: k = d_k),
and the logits are y_ij = scale·q̂_i·k̂_j. With `sigprop.theory.moments.attention.Attention`'s convention
(logits q·k/τ, τ² = d_k), its ``q_var`` holds g_q²(scale·τ)² and ``k_var`` g_k²: the variance of a normalized
coordinate, the module's logit scale folded into the queries.

Forward. Given the tokens, the coordinates of q_i are i.i.d. over W_q with pair correlation the tokens' cosine
ρ = m₂/(μ² + σ²) (`Attention.setup`), so two normalized queries (keys) have the mean cosine ĉ = E[cos] of two
correlated Gaussian vectors in k dimensions (`norm.mean_cosine`: ρ(1 − (1 − ρ²)/(2k) + O(k⁻²))). The logits
therefore read correlations, not variances: |q̂|² = g_q² d_k exactly, and over the keys of one row (the keys'
common part cancels in the softmax) the logit spreads with

    β² = Var_j(y_ij) = scale² |q̂|² · g_k² d_k (1 − ĉ_k)/k = q_var k_var d_k² (1 − ĉ_k)/(k τ²)      (`logit_scale`),

whatever the tokens' variance. Two queries' logit directions have cosine ĉ_q. The row's scale does not
fluctuate over queries (|q̂| is fixed, and the keys' spread along q̂ is (1 − ĉ_k)|k̂|²/k), so κ = 0.

The logits are not Gaussian. On uncorrelated tokens the normalized keys are uniform on a sphere, so a row's
logits are β z_j with z = √k·t, t one coordinate of a uniform unit vector in k dimensions (variance 1, lighter
tails than N(0, 1)): E e^{βz} = M_k(β) = ₀F₁(; k/2; kβ²/4) against e^{β²/2}. A row's softmax weights read the
logits through e^{βz}, and over many keys ΣS² → E e^{2βz}/(n (E e^{βz})²): e^{β²} for Gaussian logits,
M_k(2β)/M_k(β)² here (2.34 against e = 2.72 at β = 1, k = 15). So the row functionals (F2, B, Z1, …) are the
exact ones of these logits (`softmax.RowSums` with ``dof`` = k, Gauss–Gegenbauer nodes); the pair functionals,
a small part of the covariances, are the Gaussian ones at the scale β_s² = log M_k(2β) − 2 log M_k(β) that gives
them the same mean square weight (`softmax_scale`; β² − 7β⁴/(2(k + 2)) + O(β⁶)). On correlated tokens the keys'
spread part is taken with the same shape at its variance 1 − ĉ_k.

Fixed-norm keys. A key's norm |W_k x_j| is independent of its direction, which alone sets its logit: with
z_j = √k·t_j, x_j's k − 1 other directions in W_k's row space carry |w_j|²(1 − t_j²), on average k − z_j², not
k − 1. Weighted by a row's squared weights, the forward's bulk Σ_j a_j²|x_j⊥|² is d R_s − Z2/(1 − p) rather than
(d − 1)R_s (`bulk_shift`; R_s = F2/(1 − p), Z2 = EΣS²z²).

Backward. The norm's Jacobian is (g√d_k/|u|)(P − ûûᵀ) (`norm`): it divides by |u| (independent of û, so
E[1/|u|²] = 1/((k − 2)E|u|²/k) exactly, χ²_k) and removes the radial direction. The gradient reaching x is W_qᵀ
of it (queries) and W_kᵀ of it (keys):

* Q path: ∂L/∂q̂_i = scale Σ_l dY_il k̂_l. Its component along q̂_i, Σ_l dY_il y_il, is what the unnormalized map
  carries in its d·Bz term (W_k's component along q_i) and its d_k·Bz term (W_q's component along x_i, which
  meets the gradient only through q_i·∂L/∂q_i): both are removed. The rest is Σ_l dY_il k̂_l⊥ with
  |k̂_l⊥|² = g_k² d_k (1 − z_l²/k), so its mean square is g_k² d_k λ (B − Bzz/k) per row (Bzz = EΣ_l (Q_S²)_ll z_l²,
  the weights' tilt toward large logits: Bzz/B → E[z² e^{2βz}]/E[e^{2βz}] at many keys), plus the coherent
  part along the value-gradient direction (E(1 − ΣS²)², in k − 1 directions as before). With the query's Jacobian,
  E[g_q² d_k/|u_q|²] = g_q² d_k/((k − 2)σ_q² d x_q²):

      Var g^Q = H q_var k_var λ/τ² · d_k² (1 − ĉ_k)/(d² x_q² k (k − 2)) · (1 − 1/d)(d (k B − Bzz) + (k − 1)E(1 − ΣS²)²)

  (x² = μ² + σ²): the unnormalized Q path H q_var k_var s² λ/τ² q_rows with q_var k_var times `query_gain` and
  q_rows replaced by `query_rows`.
* K path: g^K_j = W_kᵀ J_N(k_j)ᵀ w_j, w_j = scale Σ_i dY_ij q̂_i, the unnormalized map's Σ_i dY_ij u_i with |u|²
  taken as E|u_K|²: the Jacobian's k/(k − 2), and its projection, which removes w_j's component along k̂_j,
  Σ_i dY_ij y_ij: a share (1 − ĉ_k) Bzz/(k B) of |w_j|² (rows independent). Against the β²/s² the functionals
  read, `key_gain` = k(1 − ρ_k)/((k − 2)(1 − ĉ_k)) · (1 − (1 − ĉ_k) Bzz/(k B)).
* V path: unchanged (it reads only the softmax weights).
"""
from __future__ import annotations

import math
from functools import lru_cache

from .norm import mean_cosine


def _log_hyp0f1(b: float, x: float) -> float:
    """log ₀F₁(; b; x) for x >= 0 (series: terms x^n/(n! (b)_n), summed until they stop counting)."""
    total, term, n = 1.0, 1.0, 0
    while term > 1e-17 * total:
        term *= x / ((n + 1) * (b + n))
        total += term
        n += 1
    return math.log(total)


@lru_cache(maxsize=4096)
def softmax_scale(beta2: float, dof: int) -> float:
    """β_s² = log M_k(2β) − 2 log M_k(β), M_k(β) = ₀F₁(; k/2; kβ²/4): the Gaussian-logit scale at which the softmax
    functionals give the mean square weight of logits β·√k·t (t a coordinate of a uniform unit vector in k
    dimensions) (module docstring)."""
    return _log_hyp0f1(dof / 2, dof * beta2) - 2 * _log_hyp0f1(dof / 2, dof * beta2 / 4)


def cosines(dof: int, rho_q: float, rho_k: float) -> tuple[float, float]:
    """(ĉ_q, ĉ_k): the mean cosines of two normalized queries and of two normalized keys, from the tokens'
    cosines ρ on each side, in ``dof`` = k dimensions."""
    return mean_cosine(dof, max(0.0, min(1.0, rho_q))), mean_cosine(dof, max(0.0, min(1.0, rho_k)))


def logit_scale(q_var: float, k_var: float, d_k: int, dof: int, c_k: float, tau2: float) -> float:
    """β² = q_var k_var d_k² (1 − ĉ_k)/(k τ²): the logits' variance over one row's keys."""
    return q_var * k_var * d_k * d_k * (1.0 - c_k) / (dof * tau2)


def key_gain(dof: int, rho_k: float, c_k: float, rows: dict[str, float]) -> float:
    """E|u_K|² over β²/s²: k(1 − ρ_k)/((k − 2)(1 − ĉ_k)) · (1 − (1 − ĉ_k) Bzz/(k B)) (module docstring)."""
    kept = 1.0 - (1.0 - c_k) * rows["Bzz"] / (dof * rows["B"]) if rows["B"] > 0 else (dof - 1) / dof
    spread = 1.0 if c_k >= 1.0 else (1.0 - rho_k) / (1.0 - c_k)
    return dof / (dof - 2) * kept * spread


def query_gain(d: int, d_k: int, dof: int, xq2: float, s2: float, c_k: float) -> float:
    """The factor d_k²(1 − ĉ_k)/(d² x_q² s² k (k − 2)) on the unnormalized Q path's q_var·k_var (module docstring)."""
    return d_k * d_k * (1.0 - c_k) / (d * d * xq2 * s2 * dof * (dof - 2)) if s2 > 0 else 0.0


def query_rows(d: int, dof: int, rows: dict[str, float]) -> float:
    """(1 − 1/d)(d (k B − Bzz) + (k − 1) E(1 − ΣS²)²): the Q path's directions orthogonal to q̂ (module docstring)."""
    one = 1 - 2 * rows["F2"] + rows["F22"]
    return (1 - 1 / d) * (d * (dof * rows["B"] - rows["Bzz"]) + (dof - 1) * one)


def bulk_shift(rows: dict[str, float], p: float) -> float:
    """(R_s − Z2/(1 − p)): the forward's bulk (d − 1)R_s is d R_s − Z2/(1 − p) under qk-norm (module docstring)."""
    return (rows["F2"] - rows["Z2"]) / (1 - p)
