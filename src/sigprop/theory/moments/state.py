"""The value type of every moment map, and the convention all components follow.

`Moments` describes one point of a network (a (tokens, features) activation and the
gradient of the loss with respect to it), at initialization, averaged over the random
weights and inputs:

* ``mean``  μ   = E[x_i^a]                        (the same for every token i and feature a)
* ``var``   σ²  = Var(x_i^a)
* ``corr``  r   = Cov(x_i^a, x_j^a) / σ², i ≠ j   (two different tokens, same feature)
* ``grad_var``  σ_g² = Var(g_i^a),  g = ∂loss/∂x  (the gradient has mean 0)
* ``grad_corr`` r_g  = Cov(g_i^a, g_j^a) / σ_g², i ≠ j
* ``norm_disp`` e and ``kurtosis`` κ: how a token's squared norm |x_i|² = Σ_a (x_i^a)² (over the d features)
  spreads over tokens and networks. Given the token's scale its features are taken i.i.d. with
  κ = E x⁴/(E x²)² (raw moments; 3 for Gaussian features), and the scale itself varies with relative variance
  e, so Var|x|²/(E|x|²)² = e + (κ − 1)/d (to first order): i.i.d. Gaussian features give 2/d (e = 0, κ = 3).
  A norm's backward gain reads it (E[1/|u|²]; `norm`); maps that do not touch it pass it on.

Means and covariances are over the weight ensemble too, so a per-feature offset that is
random over weights but shared by all tokens (e.g. μ·Σ_k W_ka after a linear map) counts
in ``corr``, not in ``mean``.

Convention (every component in this package):

* ``fwd(m) -> Moments`` maps (mean, var, corr) of the input to those of the output. The
  grad fields are copied from ``m`` unchanged; they mean nothing until a backward pass
  fills them.
* ``bwd(m_in, g_out) -> Moments`` takes the *forward input* moments ``m_in`` (what ``fwd``
  received) and ``g_out``, whose (grad_var, grad_corr) describe ∂loss/∂output, and returns
  ``m_in`` with (grad_var, grad_corr) replaced by those of ∂loss/∂input.
* Gradient independence: the upstream gradient is independent of the forward activations
  and weights (the usual mean-field assumption; exact in the Monte-Carlo tests, which
  back-propagate a fresh random gradient).
* ``token_mixing() -> Mixing`` declares how output position i reads the input's positions, which the
  per-position theory of a causal stack (`causal`) reads; a map that declares none raises
  NotImplementedError naming it there (`Component`'s default).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Moments:
    """Forward (mean, var, corr) and backward (grad_var, grad_corr) moments at one point.

    Attributes:
        mean: the mean of a feature over tokens and networks.
        var: its variance.
        corr: the correlation of one feature between two different tokens, in [−1, 1].
        grad_var: the variance of ∂loss/∂x at this point.
        grad_corr: the correlation of ∂loss/∂x between two different tokens, in [−1, 1].
        norm_disp: e, the relative dispersion of a token's squared norm beyond its features' (module docstring).
        kurtosis: κ, the features' raw fourth moment over their second squared (3 for Gaussian features).

    Raises:
        ValueError: a value that is not finite, a negative variance, or a correlation outside [−1, 1].
    """

    mean: float
    var: float
    corr: float
    grad_var: float = 1.0
    grad_corr: float = 0.0
    norm_disp: float = 0.0
    kurtosis: float = 3.0

    def __post_init__(self) -> None:
        m, v, c, gv, gc, e, k = (self.mean, self.var, self.corr, self.grad_var, self.grad_corr, self.norm_disp,
                                 self.kurtosis)
        if (type(m) is float and type(v) is float and type(c) is float and type(gv) is float and type(gc) is float
                and type(e) is float and type(k) is float and math.isfinite(m + v + gv + e + k) and v >= 0.0
                and gv >= 0.0 and -1.0 <= c <= 1.0 and -1.0 <= gc <= 1.0):
            return                                          # fast path: plain, valid floats
        for name in ("mean", "var", "corr", "grad_var", "grad_corr", "norm_disp", "kurtosis"):
            value = float(getattr(self, name))          # plain floats, also from numpy scalars
            if not math.isfinite(value):
                raise ValueError(f"Moments.{name} must be finite, got {value}")
            object.__setattr__(self, name, value)
        check_nonneg("var", self.var)
        check_nonneg("grad_var", self.grad_var)
        check_corr("corr", self.corr)
        check_corr("grad_corr", self.grad_corr)

    @property
    def cov(self) -> float:
        """Cov(x_i^a, x_j^a), i ≠ j."""
        return self.corr * self.var

    @property
    def grad_cov(self) -> float:
        """Cov(g_i^a, g_j^a), i ≠ j."""
        return self.grad_corr * self.grad_var


def replace(m: Moments, **changes: float) -> Moments:
    """``dataclasses.replace`` for `Moments`, 3–4× faster (every map calls it; a 1000-layer predict ~30k times)."""
    get = changes.get
    return Moments(get("mean", m.mean), get("var", m.var), get("corr", m.corr), get("grad_var", m.grad_var),
                   get("grad_corr", m.grad_corr), get("norm_disp", m.norm_disp), get("kurtosis", m.kurtosis))


def norm_dispersion(m: Moments, d: int) -> float:
    """R = Var|x|²/(E|x|²)² of a token of ``d`` features with moments ``m``: e + (κ − 1)/d (module docstring)."""
    return m.norm_disp + (m.kurtosis - 1) / d


class Mixing(enum.Enum):
    """How a map's output at token position i reads its input's positions (n_i = i + 1 under a causal mask).

    Tokenwise kinds (output position i reads input position i alone, or token i for a source, with inputs every
    position shares, such as a memory, held fixed): the backward on a gradient covariance G over positions is
    G' = a·diag(G) + b·offdiag(G), with a, b the map's exchangeable factors at that position's input.
    """

    IDENTITY = "identity"              # y = x
    AFFINE = "affine"                  # tokenwise; output variance affine in the input's, factors independent of it
    TOKENWISE = "tokenwise"            # tokenwise; output variance and factors read at each position's input
    SCALE_FREE = "scale-free"          # tokenwise and N(cx) = N(x): output variance alike, factors ∝ 1/v_i
    SOURCE = "source"                  # positions made from tokens (an embedding): exchangeable whatever its input
    CAUSAL_SOFTMAX = "causal-softmax"  # row i = softmax over keys j ≤ i, exchangeable within the row
    CAUSAL_SHAPED = "causal-shaped"    # row i = γ₁δ_ij + softmax_j − γ₂/n_i over keys j ≤ i
    CAUSAL = "causal"                  # row i reads positions ≤ i: the map carries position_vars, position_bwd
    ALL = "all"                        # every row reads every position: output positions alike

    @property
    def tokenwise(self) -> bool:
        """Whether output position i reads input position i alone."""
        return self in _TOKENWISE


_TOKENWISE = frozenset({Mixing.IDENTITY, Mixing.AFFINE, Mixing.TOKENWISE, Mixing.SCALE_FREE, Mixing.SOURCE})


class Component(Protocol):
    """A moment map: see the module docstring for the convention. A map class subclasses it and declares its
    `token_mixing`; the default raises."""

    def fwd(self, m: Moments) -> Moments: ...

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments: ...

    def token_mixing(self) -> Mixing:
        """How this map mixes token positions.

        Raises:
            NotImplementedError: the map does not declare it (the default), named.
        """
        raise NotImplementedError(f"{type(self).__name__} does not declare how it mixes token positions "
                                  "(token_mixing): the per-position theory of a causal stack has no map for it")


def token_mixing(c: object) -> Mixing:
    """The `Mixing` map ``c`` declares (`Component.token_mixing`), whether or not it subclasses `Component`.

    Raises:
        NotImplementedError: ``c`` declares none, named.
    """
    declared = getattr(c, "token_mixing", None)
    return Component.token_mixing(c) if declared is None else declared()


def check_nonneg(name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_corr(name: str, value: float) -> None:
    if not -1.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [-1, 1], got {value}")


def check_prob(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def check_size(name: str, value: int, minimum: int = 1) -> None:
    if int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")


def ratio(cov: float, var: float) -> float:
    """cov/var clipped to [-1, 1] (round-off); 0 when var == 0 (a constant has no correlation)."""
    return 0.0 if var == 0 else max(-1.0, min(1.0, cov / var))
