r"""From init measurements (`probe`) to the largest stable lr, a recommended lr and a predicted outcome per lr.

Four measured limits, each the peak lr at which one quantity of AdamW's first step reaches its scale:

* ``edge of stability``: η λ_max(P⁻¹H) = 2(1 + β₁)/(1 − β₁) (Adam's stability edge, 38 at β₁ = 0.9);
* ``output change``: the first step changes the output by a fraction 1 (η · out_change = 1);
* ``attention logits``: the first step adds one nat to the largest attention logit (η · logit_growth = 1);
* ``one-step loss``: the smallest lr whose single step raises the held-out loss above its init value.

    η_max = min_k c_k η_k,        recommended = r · η_max,        interval = [r_lo, r_hi] · η_max,

with the constants c_k, r, r_lo, r_hi of a `Rule` (fitted on calibration sweeps by bench/advise.py; its
defaults are that fit; docs/advise.md reports them on calibration and scoring sweeps apart). The limit that
attains the minimum is the one that decides.

Outcome of a run at peak lr η (``steps`` steps of the run's schedule, area A = Σ_t lr_t/η):
``diverges`` if η > η_max; else ``stalls`` if the first-order progress η · slope · A falls short of κ times
the gap to the training level (init loss − (unigram loss − 0.1)), or the stack is rank-collapsed at init
(last block's token correlation ≥ ``collapse``); else ``trains``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .probe import Probe

STALL_MARGIN = 0.1           # nats above the unigram loss within which a run counts as stalled
OUTCOMES = ("diverges", "stalls", "trains")


@dataclass(frozen=True)
class Rule:
    """The constants of the advice (module docstring). Defaults: the fit of bench/advise.py on its calibration
    sweeps; docs/advise.md reports what that fit can and cannot say."""

    c_eos: float = 3444.31          # edge-of-stability limit multiplier
    c_out: float = 3444.31          # output-change limit multiplier
    c_att: float = 3444.31          # attention-logit limit multiplier
    c_line: float = 3444.31         # one-step-loss limit multiplier
    ratio: float = 0.0110485        # recommended lr / η_max
    ratio_lo: float = 0.000654402    # interval low end / η_max
    ratio_hi: float = 0.0282545     # interval high end / η_max
    kappa: float = 45.2548          # progress needed, in units of the gap to the training level
    collapse: float = 0.99       # last block's token correlation at init that makes the stack rank-collapsed
    caveat: str = ("the calibration sweeps never reached a diverging lr, so the limit multipliers are not identified "
                   "and the largest stable lr is extrapolated beyond every lr they tried (docs/advise.md)")

    def __post_init__(self) -> None:
        for name in ("c_eos", "c_out", "c_att", "c_line", "ratio", "ratio_lo", "ratio_hi", "kappa"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Rule.{name}={value!r} must be a positive finite number")
        if not self.ratio_lo <= self.ratio <= self.ratio_hi:
            raise ValueError(f"Rule: ratio_lo <= ratio <= ratio_hi must hold, got {self.ratio_lo}, {self.ratio}, "
                             f"{self.ratio_hi}")


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


def limits(p: Probe, beta1: float) -> dict[str, float]:
    """The four raw limits η_k (before the rule's multipliers), inf where a quantity does not grow."""
    edge = 2 * (1 + beta1) / (1 - beta1)
    inv = lambda x: 1.0 / x if x > 0 else math.inf
    return {"edge of stability": edge * inv(p.sharpness), "output change": inv(p.out_change),
            "attention logits": inv(p.logit_growth), "one-step loss": one_step_limit(p)}


def max_stable_lr(p: Probe, beta1: float, rule: Rule) -> tuple[float, str]:
    """(η_max, the limit that decides it)."""
    mult = {"edge of stability": rule.c_eos, "output change": rule.c_out, "attention logits": rule.c_att,
            "one-step loss": rule.c_line}
    scaled = {k: mult[k] * v for k, v in limits(p, beta1).items()}
    name = min(scaled, key=scaled.get)
    if not math.isfinite(scaled[name]):
        raise ValueError("advise: no measured quantity grows along the first step (zero gradient?); "
                         "the largest stable lr cannot be judged")
    return scaled[name], name


def outcome(lr: float, p: Probe, eta_max: float, decider: str, area: float, unigram: float, rule: Rule
            ) -> tuple[str, str]:
    """(outcome, the quantity that decides it) of a run at peak ``lr``."""
    if lr > eta_max:
        return "diverges", f"lr > max stable lr {eta_max:.3g} ({decider})"
    last = p.records[-1] if p.records else None
    blocks = [r for r in p.records if r.layer >= 1 and last is not None and r.stack == last.stack]
    if blocks and blocks[-1].token_corr >= rule.collapse:
        return "stalls", f"rank collapse at init: last block token correlation {blocks[-1].token_corr:.3f}"
    gap = p.loss0 - (unigram - STALL_MARGIN)
    progress = lr * p.slope * area
    if gap > 0 and progress < rule.kappa * gap:
        return "stalls", f"first-order progress {progress:.3g} nats < {rule.kappa:.3g} x gap {gap:.3g} to unigram-0.1"
    return "trains", f"lr <= max stable lr {eta_max:.3g}; progress {progress:.3g} nats >= {rule.kappa:.3g} x gap"


def schedule_area(lrs: Sequence[float]) -> float:
    """A = Σ_t lr_t / peak over a run's per-step lrs."""
    peak = max(lrs)
    return sum(lrs) / peak if peak > 0 else 0.0
