"""The forward of a causal stack with one token covariance per pair of positions (derivation: docs/moments.md
§causal stacks, the forward per pair).

State: C (L, L), C_jk = Cov(x_j^a, x_k^a). Causal softmax attention mixes C (`causal_attention.attention_pairs`);
a run of tokenwise maps acts on each pair through its correlation map ρ ↦ ρ' (the run's exchangeable forward at
the input's mean and variance, interpolated over the pairs' range of ρ through PAIR_NODES Chebyshev nodes; every
record within 2e-4 of 7 nodes': tests/test_moments_causal.py), scaled by the per-position output variances
(`positions.position_fwd`); a residual adds α²C + β²B (B the branch's C, uncorrelated with its input at init); a
Post-LN sublayer normalizes α²C + β²B per position (entry (j, k) over √(Z_jj Z_kk)) and shifts every correlation
by the exchangeable map's O(1/d) correction. A uniform C gives every exchangeable map back. The records and
every exchangeable map downstream read C's means; the backward reads C's diagonal and each causal row's key
spread (`causal_attention.row_spread`).

Covered (`pairs_cover`): a source (an embedding), then tokenwise maps (cross-attention's `QueryView` among them)
and residual or Post-LN sublayers whose branches hold tokenwise maps and causal softmax attention.
"""
from __future__ import annotations

import numpy as np

from .blocks import Serial, parts
from .causal_attention import attention_pairs
from .covariances import alike, residual_sum, summary, uniform
from .positions import COMPOSITES, position_fwd, serial_inputs
from .postnorm import PostNormResidual
from .residual import Residual
from .state import Component, Mixing, Moments, replace, token_mixing

PAIR_NODES = 3          # Chebyshev nodes of a tokenwise run's correlation map over the pairs' range (`pair_forward`)


def _tokenwise(c: Component) -> bool:
    """Whether ``c`` is a map (not a composition) that declares a tokenwise `Mixing`."""
    return not isinstance(c, COMPOSITES) and token_mixing(c).tokenwise


def _softmax_rows(c: Component) -> bool:
    """Whether ``c`` is causal softmax attention, whose mixing of C is derived (`causal_attention`)."""
    return not isinstance(c, COMPOSITES) and token_mixing(c) is Mixing.CAUSAL_SOFTMAX


def pairs_cover(components: list[Component] | tuple[Component, ...], L: int) -> bool:
    """Whether `pair_forward` traces this chain (module docstring) over L ≥ 2 positions.

    Raises:
        NotImplementedError: a map on the way that does not declare its `Mixing`, named.
    """
    def covered(c: Component) -> bool:
        if isinstance(c, (Residual, PostNormResidual)):
            return all(_tokenwise(q) or _softmax_rows(q) for q in parts(c.branch))
        return _tokenwise(c)
    return (L >= 2 and len(components) > 0 and not isinstance(components[0], COMPOSITES)
            and token_mixing(components[0]) is Mixing.SOURCE and all(covered(c) for c in components[1:]))


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
    same = alike(v_out)
    scale = float(v_out[0]) if same else 1.0                     # folded into the polynomial when uniform
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
    if same:
        mapped.flat[::L + 1] = scale
    else:
        mapped.flat[::L + 1] = 1.0
        out_sd = np.sqrt(v_out)
        mapped *= out_sd[:, None]
        mapped *= out_sd
    return mapped


Spreads = list[tuple[float, ...] | None]    # per map of a branch: causal softmax attention's key spreads, else None


def _branch_pairs(branch: Component, m: Moments, C: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], Spreads]:
    """C at the output of a residual branch from C at its input, the per-position variances at the input of
    each of its maps, then at its output (what `causal.position_bwd` reads as ``inner``), and each map's key spreads
    (``spreads``). Each map is evaluated on the branch's exchangeable trace from ``m`` (C's means at the branch
    input), as the backward evaluates it."""
    maps = parts(branch)
    states = branch.trace(m) if isinstance(branch, Serial) else [m, branch.fwd(m)]
    within, spreads = [np.diagonal(C).copy()], [None] * len(maps)
    i = 0
    while i < len(maps):
        if _softmax_rows(maps[i]):
            C, spreads[i] = attention_pairs(maps[i], states[i], C, states[i + 1])
            within.append(np.diagonal(C).copy())
            i += 1
        elif token_mixing(maps[i]) is Mixing.IDENTITY:
            within.append(within[-1])
            i += 1
        else:
            j = i
            while j < len(maps) and not _softmax_rows(maps[j]):
                j += 1
            per = serial_inputs(maps[i:j], states[i:j + 1], within[-1])[1:]
            C = _tokenwise_pairs(maps[i:j], states[i], C, per[-1])
            within += per
            i = j
    return C, within, spreads


def _postnorm_pairs(c: PostNormResidual, C: np.ndarray, B: np.ndarray, out: Moments) -> np.ndarray:
    """C at the output of the Post-LN sublayer ``c`` from C and the branch's B at its input: the sum α²C + β²B
    (the branch is uncorrelated with its input at init) normalized per position, plus the exchangeable map's
    O(1/d) shift of the correlation (``out``: its output), so a uniform C gives that map back."""
    Z = residual_sum(c, C, B)
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
            C = uniform(out, L)
        elif isinstance(c, Residual):
            B, within, spread = _branch_pairs(c.branch, m, C)
            C = residual_sum(c, C, B)
            out = summary(C, c.fwd(m))                              # the branch trace is cached
        elif isinstance(c, PostNormResidual):
            B, within, spread = _branch_pairs(c.branch, m, C)
            out = c.fwd(m)                                          # C's means by construction
            C = _postnorm_pairs(c, C, B, out)
        else:
            out = c.fwd(m)
            C = _tokenwise_pairs((c,), m, C, position_fwd(c, m, per[-1], out))
            out = summary(C, out)
        states.append(out)
        per.append(np.diagonal(C).copy())
        inner.append(within)
        spreads.append(spread)
        m = out
    return states, per, inner, spreads
