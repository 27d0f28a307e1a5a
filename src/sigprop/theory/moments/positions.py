"""Per-position forward variances and tokenwise gradient factors of the maps of a causal stack, read off each map's
declared `Mixing` (`state`); derivations: docs/moments.md §causal stacks.

Forward (`position_fwd`): causal rows mix different numbers of keys, so a causal stack's positions carry different
variances v_i. A residual adds them per position, α²v_i + β²f_i; causal softmax attention gives row i the variance
of its n_i keys (`causal_attention.row_vars`), a ``CAUSAL`` map its own ``position_vars``; a scale-free map (a norm,
so also a Post-LN sublayer), a source and a map whose every row reads every position leave all positions alike; a
tokenwise map acts on each position's variance.

Backward, tokenwise (`position_gains`): G' = a·diag(G) + b·offdiag(G), with (a, b) the map's exchangeable factors
(`tokenwise_gains`) at each position's input variance; a scale-free map's as 1/v_i (N(cx) = N(x)); an affine map's
once per map (they do not read the input).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .blocks import Serial
from .causal_attention import row_vars
from .covariances import alike
from .postnorm import PostNormResidual
from .residual import Residual
from .state import Component, Mixing, Moments, replace, token_mixing

_UNIT, _SHARED = Moments(0.0, 1.0, 0.0, 1.0, 0.0), Moments(0.0, 1.0, 0.0, 1.0, 1.0)
CAUSAL_ROWS = frozenset({Mixing.CAUSAL_SOFTMAX, Mixing.CAUSAL_SHAPED})   # closed-form causal rows: `causal_attention`
_AFFINE = frozenset({Mixing.IDENTITY, Mixing.AFFINE})
_ALIKE = frozenset({Mixing.SCALE_FREE, Mixing.SOURCE, Mixing.ALL})      # output positions alike whatever the input's
COMPOSITES = (Serial, Residual, PostNormResidual)     # compositions, walked by their structure rather than declared


@lru_cache(maxsize=65536)
def tokenwise_gains(c: Component, m: Moments) -> tuple[float, float]:
    """A tokenwise map's (diagonal, off-diagonal) gradient factors on input ``m``: the variance of its backward of a
    unit, uncorrelated gradient and the covariance of its backward of a unit, fully shared one."""
    return c.bwd(m, _UNIT).grad_var, c.bwd(m, _SHARED).grad_cov


def position_gains(c: Component, m: Moments, v: np.ndarray | None) -> tuple[np.ndarray | float, np.ndarray | float]:
    """`tokenwise_gains` on the exchangeable input ``m``, or per position where the input variances ``v``
    differ: (diagonal factors a_i, off-diagonal s_i with entry (j, k) × s_j s_k, s_i = √b_i). A scale-free map's
    factors go as 1/v_i; an affine map's are taken once (at a unit input); any other is evaluated at each v_i.

    Raises:
        NotImplementedError: negative off-diagonal factors that differ by position (no per-position root).
    """
    mixing = token_mixing(c)
    if mixing in _AFFINE:
        return tokenwise_gains(c, _UNIT)
    if v is None or alike(v):
        return tokenwise_gains(c, m)
    if mixing is Mixing.SCALE_FREE:
        a0, b0 = tokenwise_gains(c, m)
        a, b = a0 * m.var / v, b0 * m.var / v
    else:
        a, b = np.array([tokenwise_gains(c, replace(m, var=float(x))) for x in v]).T
    if np.any(b < 0):
        raise NotImplementedError(f"{type(c).__name__}: a negative off-diagonal gradient factor differing by "
                                  "position has no per-position form")
    return a, np.sqrt(b)


def position_fwd(c: Component, m_in: Moments, v: np.ndarray, m_out: Moments | None = None,
                 inner: list[np.ndarray] | None = None) -> np.ndarray:
    """Per-position forward variances (L,) at the output of ``c`` (module docstring), given those of its input ``v``
    and the exchangeable input ``m_in`` (which gives every position its mean and correlation); ``m_out``: ``c``'s
    exchangeable output if known (else ``c.fwd(m_in)``); ``inner``: `residual_inputs` of a residual ``c``.

    Raises:
        NotImplementedError: a map that does not declare its `Mixing`, named.
    """
    if isinstance(c, Serial):
        return serial_inputs(c.components, c.trace(m_in), v)[-1]
    if isinstance(c, Residual):
        return c.alpha ** 2 * v + c.beta ** 2 * (position_fwd(c.branch, m_in, v) if inner is None else inner[-1])
    mixing = Mixing.SCALE_FREE if isinstance(c, PostNormResidual) else token_mixing(c)
    if mixing is Mixing.CAUSAL:
        return c.position_vars(m_in)
    out_var = (c.fwd(m_in) if m_out is None else m_out).var
    if mixing in CAUSAL_ROWS:
        return row_vars(c, m_in, out_var)
    if mixing in _ALIKE or alike(v):
        return np.full(len(v), out_var)
    if mixing in _AFFINE and m_in.var > 0:
        f1 = c.fwd(replace(m_in, var=2 * m_in.var)).var
        return out_var + (f1 - out_var) * (v / m_in.var - 1)
    return np.array([c.fwd(replace(m_in, var=float(x))).var for x in v])


def serial_inputs(components: tuple[Component, ...], states: list[Moments] | tuple[Moments, ...], v: np.ndarray
                  ) -> list[np.ndarray]:
    """Per-position variances at the input of each of ``components`` (exchangeable ``states``: the input, then
    each output), then at the output: `position_fwd` along the chain."""
    per = [v]
    for comp, m, m_out in zip(components, states, states[1:]):
        per.append(position_fwd(comp, m, per[-1], m_out))
    return per


def residual_inputs(c: Component, m_in: Moments, v: np.ndarray) -> list[np.ndarray] | None:
    """`serial_inputs` of the branch of a residual ``c`` on per-position input variances ``v``, which its forward
    (`position_fwd`) and its backward (`causal.position_bwd`) both read; None for any other map."""
    if isinstance(c, Residual) and isinstance(c.branch, Serial):
        return serial_inputs(c.branch.components, c.branch.trace(m_in), v)
    return None
