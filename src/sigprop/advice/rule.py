r"""From init measurements (`probe`) to the largest stable lr, a recommended lr and a predicted outcome per lr.

Seven measured lr scales, each the peak lr at which one quantity of AdamW's first step reaches its scale:

* ``edge of stability``: η λ_max(P⁻¹H) = 2(1 + β₁)/(1 − β₁) (Adam's stability edge, 38 at β₁ = 0.9);
* ``output change``: the first step changes the output by a fraction 1 (η · out_change = 1);
* ``layer change``: the first step changes some weight layer's output by a fraction 1 (η · layer_change = 1);
* ``median layer change``: the same for the median weight layer (η · median_layer_change = 1);
* ``attention logits``: the first step adds one nat to the largest attention logit (η · logit_growth = 1);
* ``one-step loss``: the smallest lr whose single step raises the held-out loss above its init value;
* ``one-step optimum``: the lr whose single step lowers the held-out loss most (a parabola in log lr through
  the lowest point of the profile and its two neighbours).

A `Rule` reads the stability edge off one of them (its ``edge_basis``) and the recommendation off one of them or
off the window below (its ``basis``; ``window`` = √(η_min η_max), the geometric middle between the stall bound
and the stability edge), both chosen on calibration sweeps by `sigprop.advice.fit`:

    recommended = best · η_basis,   interval = [lo, hi] · η_basis,   η_max = top · η_edge_basis,

each of the first two clipped into [η_min, η_max] below (never advised where the rule predicts a stall or a
divergence), or, when that window is empty, to at most η_max.

A run of ``steps`` steps at peak lr η (area A = Σ_t lr_t/η under its schedule) needs the first-order
progress η · slope · A to reach κ times the gap from the init loss to the training level (unigram − 0.1):

    η_min = κ · gap / (slope · A).

Outcome at η: ``diverges`` above η_max; ``stalls`` below η_min, at every lr when η_min > η_max (no lr
trains within the run's budget) or when the stack is rank-collapsed at init (last block's token correlation
≥ ``collapse``); else ``trains``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..train.levels import TRAIN_MARGIN as STALL_MARGIN  # within it of the unigram loss a run has stalled
from .data.fitted import CONSTANTS as FITTED
from .probe import Probe, last_corr

OUTCOMES = ("diverges", "stalls", "trains")
LIMITS = ("edge of stability", "output change", "layer change", "median layer change", "attention logits",
          "one-step loss", "one-step optimum")
WINDOW = "window"                     # the recommendation's basis √(η_min η_max)


@dataclass(frozen=True)
class Rule:
    """The constants of the advice (module docstring). Defaults: the fit of `sigprop.advice.fit` on every config of
    the lr benchmark (`sigprop.advice.data.fitted`, with the table and commit they came from); docs/advise.md scores
    the same fit leave-one-family-out. Each field's meaning is the comment beside it.

    Raises:
        ValueError: a ``basis`` or ``edge_basis`` that names no lr scale, a constant that is not a positive
            finite number, or not ``lo`` <= ``best`` <= ``hi``.
    """

    basis: str = FITTED["basis"]     # the scale the recommendation is read from (a LIMITS name or WINDOW)
    best: float = FITTED["best"]     # recommended lr / η_basis
    lo: float = FITTED["lo"]         # interval low end / η_basis
    hi: float = FITTED["hi"]         # interval high end / η_basis
    edge_basis: str = FITTED["edge_basis"]  # the scale the largest stable lr is read from
    top: float = FITTED["top"]       # η_max / η_edge_basis
    kappa: float = FITTED["kappa"]   # progress needed, in units of the gap to the training level
    collapse: float = 0.99           # last block's token correlation at init that makes the stack collapsed
    caveat: str = ("fitted on the lr benchmark's small models (decoders, transformers GPT-2 and LLaMA among them, "
                   "encoders, encoder-decoders and ViTs, width 32-256, 2-96 layers, 150-1000 steps on the embedded "
                   "corpus or the digits); how far it carries beyond them, and its held-out regret and outcome "
                   "accuracy: docs/advise.md")

    def __post_init__(self) -> None:
        if self.basis not in (*LIMITS, WINDOW):
            raise ValueError(f"Rule.basis={self.basis!r} must be one of {[*LIMITS, WINDOW]}")
        if self.edge_basis not in LIMITS:
            raise ValueError(f"Rule.edge_basis={self.edge_basis!r} must be one of {list(LIMITS)}")
        for name in ("best", "lo", "hi", "top", "kappa"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Rule.{name}={value!r} must be a positive finite number")
        if not self.lo <= self.best <= self.hi:
            raise ValueError(f"Rule: lo <= best <= hi must hold, got {self.lo}, {self.best}, {self.hi}")


def one_step_limit(p: Probe) -> float:
    """The smallest lr of ``p.line`` whose one step raises the held-out loss above ``p.loss0``, log-interpolated
    between its neighbours (inf if none does)."""
    pts = sorted(p.line)
    prev = None
    for lr, loss in pts:
        if loss > p.loss0:
            if prev is None:
                return lr
            (a, la), b = prev, lr
            if not math.isfinite(loss):
                return math.sqrt(a * b)
            t = (p.loss0 - la) / (loss - la)
            return math.exp(math.log(a) + t * (math.log(b) - math.log(a)))
        prev = (lr, loss)
    return math.inf


def one_step_optimum(p: Probe) -> float:
    """The lr of ``p.line`` with the lowest held-out loss after one step, refined by the parabola in log lr
    through it and its two neighbours (kept within them); the end point itself when the lowest is at an end."""
    pts = sorted((lr, loss) for lr, loss in p.line if math.isfinite(loss))
    if not pts:
        return math.inf
    i = min(range(len(pts)), key=lambda k: pts[k][1])
    if i in (0, len(pts) - 1):
        return pts[i][0]
    (x0, y0), (x1, y1), (x2, y2) = ((math.log(a), b) for a, b in pts[i - 1:i + 2])
    den = (x1 - x0) * (y1 - y2) - (x1 - x2) * (y1 - y0)
    if den == 0:
        return pts[i][0]
    vertex = x1 - 0.5 * ((x1 - x0) ** 2 * (y1 - y2) - (x1 - x2) ** 2 * (y1 - y0)) / den
    return math.exp(min(max(vertex, x0), x2))


def limits(p: Probe, beta1: float) -> dict[str, float]:
    """The six lr scales η_k of the module docstring, inf where a quantity does not grow."""
    edge = 2 * (1 + beta1) / (1 - beta1)
    inv = lambda x: 1.0 / x if x > 0 else math.inf
    return {"edge of stability": edge * inv(p.sharpness), "output change": inv(p.out_change),
            "layer change": inv(p.layer_change), "median layer change": inv(p.median_layer_change),
            "attention logits": inv(p.logit_growth), "one-step loss": one_step_limit(p),
            "one-step optimum": one_step_optimum(p)}


@dataclass(frozen=True)
class Decision:
    """What a `Rule` makes of one probe: the recommended lr and interval, η_max and the scale it is read from,
    η_min (the stall bound), why every lr stalls (None if some lr can train), and the basis lr the recommendation
    is read off (before its factor and clipping)."""

    recommended: float
    interval: tuple[float, float]
    eta_max: float
    decided_by: str
    eta_min: float
    no_window: str | None
    base: float


def decide(p: Probe, beta1: float, area: float, unigram: float, rule: Rule) -> Decision:
    """The rule applied to a probe, for a run whose schedule has area ``area`` and whose data has this
    ``unigram`` loss. ValueError when the scales the rule reads do not exist (no step changes anything)."""
    scales = limits(p, beta1)
    edge = scales[rule.edge_basis]
    eta_max = rule.top * edge
    gap = p.loss0 - (unigram - STALL_MARGIN)
    eta_min = rule.kappa * gap / (p.slope * area) if gap > 0 and p.slope > 0 and area > 0 else 0.0
    base = math.sqrt(max(eta_min, 0.0) * eta_max) if rule.basis == WINDOW else scales[rule.basis]
    if rule.basis == WINDOW and gap <= 0:
        raise ValueError(f"advise: the held-out loss at init, {p.loss0:.4g}, is already below the training level "
                         f"(unigram {unigram:.4g} - {STALL_MARGIN}), so no stall bound exists and the window it "
                         "bounds neither: give held-out batches whose unigram loss the model has not beaten at init "
                         "(text, not random ids, and more of it)")
    if not (math.isfinite(base) and base > 0 and math.isfinite(edge)):
        raise ValueError(f"advise: the {rule.basis!r} and {rule.edge_basis!r} scales are not measurable here (no "
                         "quantity grows along the first step: a zero gradient?); the lr cannot be judged")
    corr = last_corr(p.records) if p.records else None
    why = None
    if corr is not None and corr >= rule.collapse:
        why = f"rank collapse at init: last block token correlation {corr:.3f}"
    elif eta_min > eta_max:
        why = f"stall bound {eta_min:.3g} > max stable lr {eta_max:.3g}: no lr trains within the run's steps"
    clip = (lambda x: min(x, eta_max)) if why else (lambda x: min(max(x, eta_min), eta_max))
    return Decision(clip(rule.best * base), (clip(rule.lo * base), clip(rule.hi * base)), eta_max, rule.edge_basis,
                    eta_min, why, base)


def outcome(lr: float, d: Decision) -> tuple[str, str]:
    """(outcome, the quantity that decides it) of a run at peak ``lr``."""
    if d.no_window is not None:
        return "stalls", d.no_window
    if lr > d.eta_max:
        return "diverges", f"lr > max stable lr {d.eta_max:.3g} ({d.decided_by})"
    if lr < d.eta_min:
        return "stalls", f"lr < stall bound {d.eta_min:.3g} (first-order progress below kappa x gap to unigram-0.1)"
    return "trains", f"stall bound {d.eta_min:.3g} <= lr <= max stable lr {d.eta_max:.3g}"


def schedule_area(lrs: Sequence[float]) -> float:
    """A = Σ_t lr_t / peak over a run's per-step lrs."""
    peak = max(lrs)
    return sum(lrs) / peak if peak > 0 else 0.0
