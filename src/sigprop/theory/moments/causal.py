"""The backward of a causal stack with one gradient covariance per pair of token positions, and the trace that
composes it with the forward per position or per pair (derivations: docs/moments.md §causal stacks).

State: G (L, L), G_ij = E[g_i^a g_j^a] per feature; a record's grad_var is tr G/L. Each map acts as its declared
`Mixing` says (`state`; a map without a declaration raises NotImplementedError naming it):

* tokenwise: G' = a·diag(G) + b·offdiag(G), a and b its exchangeable factors, per position where the input
  variances differ (`positions.position_gains`);
* causal softmax or shaped attention: `causal_attention.attention_bwd`; any other causal map: its own
  ``position_bwd``; a map whose every row reads every position has no per-position backward and raises;
* Residual: G' = α²G + β²branch(G); Serial: the maps in reverse order;
* Post-LN sublayer y = N(αx + βf(x)): `PostNormResidual`'s per-token factors (1 + v)(1 − S/d)/EK (diagonal)
  and (1 + ¾v + ¼c₂)(1 − S(1 − ρ²/2)/d)/EK (off-diagonal, geometric mean of the two tokens'), with row i's
  branch variance B_ii of the forward per pair where it ran, else `causal_attention.row_vars`. The radial
  constraint (`postnorm`): after a homogeneous FFN branch `PostNormResidual.radial_factor`; after an attention
  branch the coherent value path's Mᵀ G_z M × (1 − δ_V/(k − 1)) and the cross term −αβκ(G_z M + (G_z M)ᵀ), which
  on the first token (M₀₀ = 1) are its exact single-token factor.

The forward the backward reads (`position_forward`): per pair of positions (`pairs.pair_forward`) where
`pairs.pairs_cover` accepts the chain, else the exchangeable states with per-position variances
(`positions.position_fwd`). Monte Carlo: tests/test_moments_causal.py, tests/test_predict_knobs.py.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .blocks import Serial, parts, serial
from .causal_attention import attention_bwd, row_vars
from .covariances import alike, gains, grad_summary, residual_sum
from .pairs import Forward, Spreads, pair_forward, pairs_cover
from .positions import CAUSAL_ROWS, COMPOSITES, position_fwd, position_gains, residual_inputs, serial_inputs
from .postnorm import PostNormResidual, coherent_attention, homogeneous_kurtosis
from .residual import Residual
from .state import Component, Mixing, Moments, token_mixing


def _postnorm(c: PostNormResidual, m: Moments, f: Moments, rows: np.ndarray | None = None
              ) -> tuple[np.ndarray | float, np.ndarray | float]:
    """The norm's diagonal and off-diagonal gradient factors (module docstring): per position after a branch
    that opens with causal softmax (or shaped) attention, scalars after a tokenwise one; ``f``: the branch output;
    ``rows``: its per-position variances where the forward traced them (`pair_forward`), else those of
    `row_vars`."""
    first = parts(c.branch)[0]
    if rows is None:
        fvar = row_vars(first, m, f.var) if token_mixing(first) in CAUSAL_ROWS else f.var
    else:
        fvar = f.var if alike(rows) else rows
    on, off = c.grad_gains(m, fvar, f.corr)
    return on, np.sqrt(off) if isinstance(off, np.ndarray) else off   # `gains`: a vector enters squared


def _postnorm_bwd(c: PostNormResidual, m_in: Moments, G: np.ndarray, inner: list[np.ndarray] | None = None,
                  spreads: Spreads | None = None) -> tuple[np.ndarray, np.ndarray]:
    """G at the input of the Post-LN sublayer ``c``, and the diagonal of its branch part β²·branch(G_z), the
    part that is not mean-free (`position_trace` sets the next sublayer's S from it). After an attention
    branch the coherent value path carries the radial constraint (module docstring): its Mᵀ G_z M part
    × (1 − δ_V/(k − 1)), and the residual–value cross term −αβκ(G_z M + (G_z M)ᵀ). ``inner``, ``spreads``: the
    branch's per-position variances and key spreads where the forward traced them per pair (`pair_forward`)."""
    maps = parts(c.branch)
    states = serial(*maps).trace(m_in)
    Gz = gains(G, *_postnorm(c, m_in, states[-1], None if inner is None else inner[-1]))
    if (att := coherent_attention(c.branch)) is not None:
        eps_v, kappa = c.coherent_radial(att)
        branch, gm = attention_bwd(att, m_in, Gz, 1 - eps_v, None if spreads is None else spreads[maps.index(att)])
        out = gm + gm.T
        out *= -c.alpha * c.beta * kappa / (att.d * att.o_var)                 # −αβκ(G_z M + (G_z M)ᵀ)
        out += c.alpha ** 2 * Gz
        out += c.beta ** 2 * branch
        return out, c.beta ** 2 * np.diag(branch)
    branch = _serial_bwd(maps, states, Gz, spreads=spreads)
    out = c.alpha ** 2 * Gz + c.beta ** 2 * branch
    if (eta := homogeneous_kurtosis(c.branch)) is not None:
        out = gains(out, *c.radial_factor(m_in, states[-1].var, states[-1].corr, eta))
    return out, c.beta ** 2 * np.diag(branch)


def _serial_bwd(components: tuple[Component, ...], states: list[Moments], G: np.ndarray,
                v: np.ndarray | None = None, inner: list[np.ndarray] | None = None,
                spreads: Spreads | None = None) -> np.ndarray:
    """G back through ``components`` given their forward ``states`` (input, then each output) and, with
    ``v``, the per-position input variances (``inner``: those at each component, `serial_inputs`, if known;
    ``spreads``: each causal attention's key spreads, `row_spread`). The factors of consecutive tokenwise maps
    multiply, so a run of them touches G once.

    Raises:
        NotImplementedError: a map that does not declare its `Mixing`, or one whose every row reads every
            position, named.
    """
    per: list[np.ndarray | None] = [None] * len(components)
    if inner is not None:
        per = inner
    elif v is not None:
        per = serial_inputs(components[:-1], states, v)
    spreads = spreads or [None] * len(components)
    on: np.ndarray | float = 1.0
    off: np.ndarray | float = 1.0
    for comp, m, p, spread in zip(reversed(components), reversed(states[:-1]), reversed(per[:len(components)]),
                                  reversed(spreads)):
        if isinstance(comp, COMPOSITES):
            G = position_bwd(comp, m, G if _unit(on, off) else gains(G, on, off), p)
            on = off = 1.0
        elif not (mixing := token_mixing(comp)).tokenwise:
            G = _mixing_bwd(comp, mixing, m, G if _unit(on, off) else gains(G, on, off), spread)
            on = off = 1.0
        else:
            a, b = position_gains(comp, m, p)
            if isinstance(b, np.ndarray) or isinstance(off, np.ndarray):      # entry (j, k) × s_j s_k from here on
                off, b = _root(off, comp), _root(b, comp)
            on, off = on * a, off * b
    return G if _unit(on, off) else gains(G, on, off)


def _mixing_bwd(c: Component, mixing: Mixing, m: Moments, G: np.ndarray, spread: tuple[float, ...] | None
                ) -> np.ndarray:
    """G at the input of ``c``, whose rows read several positions (``mixing``, its declared `Mixing`), given G at
    its output: causal softmax or shaped rows by `attention_bwd` (at the rows' key spreads ``spread``), any other
    causal map by its own ``position_bwd``.

    Raises:
        NotImplementedError: every row reads every position: no per-position backward is derived.
    """
    if mixing in CAUSAL_ROWS:
        return attention_bwd(c, m, G, spread=spread)[0]
    if mixing is Mixing.CAUSAL:
        return c.position_bwd(m, G)
    raise NotImplementedError(f"{type(c).__name__}: every row reads every position ({mixing.value}); the "
                              "per-position backward is derived for causal and tokenwise maps")


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
    per-position input variances that tokenwise gains read; ``inner``: `residual_inputs` of a residual ``c``;
    ``spreads``: the key spreads of its (branch's) maps, from `pair_forward`), given G at its output.

    Raises:
        NotImplementedError: a map that does not declare its `Mixing`, or one whose every row reads every
            position, named.
    """
    if isinstance(c, Serial):
        return _serial_bwd(c.components, c.trace(m_in), G, v, inner, spreads)
    if isinstance(c, Residual):
        return residual_sum(c, G, position_bwd(c.branch, m_in, G, v, inner, spreads))
    if isinstance(c, PostNormResidual):
        return _postnorm_bwd(c, m_in, G, inner, spreads)[0]
    mixing = token_mixing(c)
    if mixing.tokenwise:
        return gains(G, *position_gains(c, m_in, v))
    return _mixing_bwd(c, mixing, m_in, G, spreads[0] if spreads else None)


def position_forward(components: list[Component], states: list[Moments], L: int, pairs: bool = True) -> Forward:
    """The forward that `position_trace`'s backward reads: (states, the per-position variances at each component's
    input then at the output, those inside each residual's branch or None, and its branch maps' key spreads or
    None, as `pair_forward`). With ``pairs``, a chain `pairs_cover` accepts is traced per pair of positions from
    ``states[0]`` (`pair_forward`); any other chain, or ``pairs=False``, keeps the exchangeable ``states`` (the
    input, then each component's output) and takes the per-position variances of `position_fwd`."""
    if pairs and pairs_cover(components, L):
        return pair_forward(components, states[0], L)
    per, inner = [np.full(L, states[0].var)], []
    for c, m, m_out in zip(components, states, states[1:]):
        inner.append(residual_inputs(c, m, per[-1]))
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
    out = [grad_summary(G, states[-1])]
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
        out.append(grad_summary(G, m))
    return out[::-1]
