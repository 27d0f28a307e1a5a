"""Moments of a gated MLP y = W_d(φ(W_g x) ⊙ W_u x) (LLaMA's SwiGLU) at init: output variance and kernel.

Each rule is derived in its docstring and checked by Monte Carlo in ``tests/test_hf.py``.
"""
from __future__ import annotations

from typing import Callable

import torch

from .kernels import gaussian_kernel, gaussian_moment

Activation = Callable[[torch.Tensor], torch.Tensor]


def gate_moment(act: Activation, var: float = 1.0) -> float:
    """m₂(s²) = E[φ(s g)²], g ~ N(0, 1), by Gauss–Hermite quadrature (exact for the shaped ReLU,
    whose square is piecewise quadratic and symmetric nodes split it evenly). SiLU: m₂(1) ≈ 0.3557."""
    return gaussian_moment(lambda t: act(t) ** 2, var=var)


def gated_output_moment(act: Activation, d: int, d_ff: int, var_gate: float,
                        var_up: float, var_down: float, q: float = 1.0) -> float:
    """Second moment of one output of y = W_d (φ(W_g x) ⊙ W_u x), x ∈ R^d with q = |x|²/d.

    Weights i.i.d. N(0, var_gate | var_up | var_down). Given x, the pre-activations
    a_j = (W_g x)_j ~ N(0, d·var_gate·q) and b_j = (W_u x)_j ~ N(0, d·var_up·q) are all independent
    (independent weight rows), so h_j = φ(a_j) b_j has E[h_j] = E[φ(a)]·E[b] = 0 and
    E[h_j²] = E[φ(a)²]·E[b²] = m₂(d·var_gate·q) · d·var_up·q. W_d is independent of h, so
    E[y_i] = 0 and

        E[y_i²] = d_ff · var_down · d · var_up · q · m₂(d · var_gate · q),

    exactly at every width (no large-width limit). Unit output from unit-variance input
    (q = 1): var_gate = var_up = 1/d (unit pre-activations) and var_down = 1/(d_ff · m₂(1)),
    times (1 − p) for dropout p on the branch as in DSLM. Because b has zero mean, the gate's
    mean E[φ(a)] ≠ 0 (SiLU) never reaches the output.
    """
    return d_ff * var_down * d * var_up * q * gate_moment(act, d * var_gate * q)


def gated_kernel(act: Activation) -> Callable[[float], float]:
    """ρ ↦ normalized kernel of the gated unit h = φ(a)·b for unit inputs with token correlation ρ.

    Gate pre-activations (a, a') and up pre-activations (b, b') of two tokens are each
    correlated ρ and mutually independent, so E[h h'] = E[φ(a)φ(a')]·E[b b'] and

        E[h h'] / E[h²] = ρ · E[φ(a)φ(a')] / E[φ(a)²];

    W_down keeps it (its output correlation equals its input's). GeLU/SiLU: 2-D quadrature.
    """
    m2 = gate_moment(act)
    return lambda rho: rho * gaussian_kernel(act, rho) / m2
