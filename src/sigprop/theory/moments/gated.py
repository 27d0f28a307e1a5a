"""Gated MLP y = W_d(φ(W_g x) ⊙ W_u x) (LLaMA's SwiGLU): forward and backward moments.

Weights i.i.d. N(0, σ_g²), N(0, σ_u²), N(0, σ_d²), shapes d → d_ff (gate, up) and d_ff → d (down), no biases.
Given the input, the gate pre-activation a = W_g x and the up pre-activation b = W_u x are independent
Gaussians (independent weights) with the moments of `Linear` (mean 0, variances d σ_g² E x², d σ_u² E x²,
token correlation r' = (rσ² + μ²)/(σ² + μ²) each), so h = φ(a)·b has

    E h = E φ(a) · E b = 0,   Var h = E φ(a)² · Var b,   Cov(h_i, h_j) = E φ(a_i)φ(a_j) · r' Var b,

and W_d maps it as a `Linear` (σ_y² = d_ff σ_d² Var h, the correlation kept). This is
`sigprop.theory.gated.gated_output_moment`'s variance; it is exact at every width when |x|² does not
fluctuate (the input of LLaMA's MLP is an RMSNorm output, |x|² = d). Backward, with g_h = W_dᵀ g_y
(variance d σ_d² σ_g², correlation kept) independent of the forward (`state`):

    g_x = W_gᵀ(g_h ⊙ φ'(a) ⊙ b) + W_uᵀ(g_h ⊙ φ(a)),
    σ_gx² = d_ff σ_gh² (σ_g² E φ'(a)² Var b + σ_u² E φ(a)²),
    Cov_gx = d_ff Cov_gh (σ_g² E φ'(a_i)φ'(a_j) r' Var b + σ_u² E φ(a_i)φ(a_j)),

the two paths uncorrelated (W_g and W_u independent, zero-mean). φ's Gaussian expectations come from its
pointwise map (`pointwise`: `Smooth("silu")`, `GeLU`, `ReLU`, ...).
"""
from __future__ import annotations

from dataclasses import dataclass

from .linear import Linear
from .state import Component, Mixing, Moments, check_nonneg, check_size, ratio, replace


@dataclass(frozen=True)
class GatedMLP(Component):
    """y = W_d(φ(W_g x) ⊙ W_u x) over ``d`` → ``d_ff`` → ``d``; ``gate``: φ's pointwise map (has ``expectations``)."""

    d: int
    d_ff: int
    gate_var: float
    up_var: float
    down_var: float
    gate: Component

    def __post_init__(self) -> None:
        check_size("d", self.d)
        check_size("d_ff", self.d_ff)
        for name in ("gate_var", "up_var", "down_var"):
            check_nonneg(name, getattr(self, name))
        if not hasattr(self.gate, "expectations"):
            raise NotImplementedError(f"gated MLP gate {self.gate!r} is not a pointwise map with Gaussian "
                                      "expectations")

    def _parts(self, m: Moments) -> tuple[Moments, float, object]:
        """(gate pre-activation moments, Var b, φ's expectations on a)."""
        a = Linear(self.d, self.d_ff, self.gate_var).fwd(m)
        b = Linear(self.d, self.d_ff, self.up_var).fwd(m)
        return a, b.var, self.gate.expectations(a)

    def fwd(self, m: Moments) -> Moments:
        a, var_b, e = self._parts(m)
        var_h, cov_h = e.second * var_b, e.cross * a.corr * var_b
        h = replace(m, mean=0.0, var=var_h, corr=ratio(cov_h, var_h))
        return Linear(self.d_ff, self.d, self.down_var).fwd(h)

    def token_mixing(self) -> Mixing:
        return Mixing.TOKENWISE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        a, var_b, e = self._parts(m_in)
        gh = self.d * self.down_var * g_out.grad_var
        var = self.d_ff * gh * (self.gate_var * e.d2 * var_b + self.up_var * e.second)
        cov = self.d_ff * gh * g_out.grad_corr * (self.gate_var * e.dcross * a.corr * var_b + self.up_var * e.cross)
        return replace(m_in, grad_var=var, grad_corr=ratio(cov, var))
