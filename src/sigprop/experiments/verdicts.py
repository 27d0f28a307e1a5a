"""The claims' verdict rules as pure functions of plain numbers, fixed before the full runs.

Every runner writes its numbers to ``<out>/<claim>.json``; calling the function named after the claim on
those numbers gives the verdict back, so the verdict table can be regenerated from the JSON alone.

A *tuned model* is a mapping with

* ``lr_grid``: every peak lr tried on the tuning seed, ascending;
* ``tuning_loss``: the final validation loss at each of them (NaN or inf = diverged);
* ``tuning_seed``: the seed of those runs, never a scored seed;
* ``seeds`` and ``final_loss``: the scored seeds and their final validation loss at the chosen lr.

The rule shared by every claim (`tuning_problems`): the chosen lr is the grid lr with the lowest finite
tuning loss (`sigprop.train.lr_grid.best_lr`); a comparison is *inconclusive* if that lr sits at an edge
of the grid (the optimum
may lie outside it; the runners extend the grid in that direction first and say so), if every lr
diverged, if the tuning seed is also scored, or if fewer than ``min_seeds`` seeds are scored.
Verdicts: "reproduced", "partly", "not reproduced", "inconclusive".
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..train.levels import trains
from ..train.lr_grid import best_lr
from ..train.seed_stats import seed_stats

VERDICTS = ("reproduced", "partly", "not reproduced", "inconclusive")
Model = Mapping[str, Any]


def tuning_problems(label: str, m: Model, min_seeds: int) -> list[str]:
    """Why ``m``'s scored numbers cannot be judged (empty when they can), by the shared rule above."""
    out = []
    lr, edge = best_lr(m["lr_grid"], m["tuning_loss"])
    if lr is None:
        out.append(f"{label}: every lr of its grid diverged on the tuning seed")
    elif edge:
        out.append(f"{label}: best lr {lr:g} is at the edge of its grid "
                   f"{', '.join(f'{x:g}' for x in m['lr_grid'])}")
    if m["tuning_seed"] in m["seeds"]:
        out.append(f"{label}: tuning seed {m['tuning_seed']} is also scored")
    if len(m["seeds"]) < min_seeds:
        out.append(f"{label}: {len(m['seeds'])} scored seed(s), the rule needs {min_seeds}")
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Seed mean and sample std of ``values`` (`seed_stats`: NaN if a seed diverged)."""
    s = seed_stats(values)
    return s["mean"], s["std"]


def _inconclusive(problems: list[str]) -> tuple[str, str]:
    return "inconclusive", "; ".join(problems) + "."


SHAPED_TOLERANCE = {"reproduced": 0.05, "partly": 0.10}


def shaped_vs_preln(models: Mapping[str, Model], baseline: str = "Pre-LN", min_seeds: int = 3
                    ) -> tuple[str, str]:
    """Shaped Transformer vs a tuned Pre-LN (Noci et al. 2023, App. D: "comparable performance").

    Every model (the baseline and each shaped variant) is a tuned model with its own lr. With
    gap_v = mean_v / mean_baseline − 1 over the scored seeds (a diverged seed makes a variant's gap +inf):
    *reproduced* if every shaped variant has gap ≤ +5 %; *partly* if at least one has gap ≤ +5 % or all
    have gap ≤ +10 %; else *not reproduced*. *Inconclusive* under the shared tuning rule (≥ 3 scored seeds)
    or if the baseline diverges on a scored seed at its own lr."""
    problems = [p for label, m in models.items() for p in tuning_problems(label, m, min_seeds)]
    base, base_std = mean_std(models[baseline]["final_loss"])
    if not math.isfinite(base):
        problems.append(f"{baseline} diverged on a scored seed at its own lr")
    if problems:
        return _inconclusive(problems)
    gaps = {}
    for label, m in models.items():
        if label != baseline:
            mean = mean_std(m["final_loss"])[0]
            gaps[label] = mean / base - 1 if math.isfinite(mean) else math.inf
    within = [g <= SHAPED_TOLERANCE["reproduced"] for g in gaps.values()]
    if all(within):
        name = "reproduced"
    elif any(within) or all(g <= SHAPED_TOLERANCE["partly"] for g in gaps.values()):
        name = "partly"
    else:
        name = "not reproduced"
    detail = "; ".join(f"{k} {_loss(models[k])} ({g:+.1%})" for k, g in gaps.items())
    return name, (f"seed-mean final val loss, each model at its own tuned lr: {baseline} "
                  f"{base:.3f} ± {base_std:.3f}; {detail} (rule: every variant ≤ +5 % reproduced; one ≤ +5 % "
                  f"or all ≤ +10 % partly).")


def _loss(m: Model) -> str:
    mean, std = mean_std(m["final_loss"])
    return f"{mean:.3f} ± {std:.3f} at lr {best_lr(m['lr_grid'], m['tuning_loss'])[0]:g}"


def entropy_collapse(baseline: Mapping[float, Sequence[float]], shaped: Mapping[str, Mapping[float, Sequence[float]]],
                     limit: float, min_seeds: int = 3, min_lrs: int = 3) -> tuple[str, str]:
    """Attention entropy collapse at a large lr (Noci et al. 2023, App. D, Fig. 6).

    Arguments: lr → per-seed final attention entropy (per layer the softmax row entropy averaged over
    rows, heads and batch, as the paper measures it; then averaged over layers) for the Pre-LN
    ``baseline`` and for each ``shaped`` model; every model runs at every lr of one grid of large lrs
    (no lr is chosen, so no seed is spent on tuning). A seed *collapses* below ``limit``; a NaN entropy
    counts against the claim (collapsed for shaped, not collapsed for Pre-LN).

    With C = the lrs at which every Pre-LN seed collapses: *reproduced* if C is not empty and at every lr
    of C no seed of any shaped model collapses; *partly* if, at some lr, Pre-LN's seed mean is below the
    limit and every shaped model's seed mean is at or above it; *not reproduced* otherwise.
    *Inconclusive* if Pre-LN's seed mean stays at or above the limit at every lr (the grid does not reach
    the regime of the claim; the runner extends it upward first), if the grid has fewer than ``min_lrs``
    lrs, or if any model has fewer than ``min_seeds`` seeds at an lr."""
    lrs = sorted(baseline)
    problems = [f"{len(lrs)} lr(s), the rule needs {min_lrs}"] if len(lrs) < min_lrs else []
    for label, per_lr in {"Pre-LN": baseline, **shaped}.items():
        problems += [f"{label} at lr {lr:g}: {len(v)} seed(s), the rule needs {min_seeds}"
                     for lr, v in per_lr.items() if len(v) < min_seeds]
    pre = {lr: np.asarray(baseline[lr], dtype=float) for lr in lrs}
    if not any(np.nanmean(v) < limit for v in pre.values() if np.isfinite(v).any()):
        problems.append(f"Pre-LN's seed-mean entropy stays ≥ {limit:.2f} nats at every lr up to {lrs[-1]:g}")
    numbers = "; ".join(f"lr {lr:g}: " + ", ".join(f"{k} {np.mean(v[lr]):.2f}" for k, v in
                                                   {"Pre-LN": baseline, **shaped}.items()) for lr in lrs)
    if problems:
        return "inconclusive", "; ".join(problems) + f" ({numbers})."
    sh = {k: {lr: np.asarray(v[lr], dtype=float) for lr in lrs} for k, v in shaped.items()}
    collapse = [lr for lr in lrs if (pre[lr] < limit).all()]
    if collapse and all((v[lr] >= limit).all() for lr in collapse for v in sh.values()):
        name = "reproduced"
    elif any(pre[lr].mean() < limit and all(v[lr].mean() >= limit for v in sh.values()) for lr in lrs):
        name = "partly"
    else:
        name = "not reproduced"
    where = ", ".join(f"{lr:g}" for lr in collapse) or "none"
    return name, (f"seed-mean final attention entropy (mean over layers) vs {limit:.2f} nats — {numbers}; "
                  f"lrs where every Pre-LN seed collapses: {where}.")


MIN_STEPS = 300


def trained(m: Model) -> list[bool]:
    """Per scored seed of ``m`` (``final_loss``, ``unigram``): whether its run trains (`levels.trains`)."""
    return [trains(x, u) for x, u in zip(m["final_loss"], m["unigram"])]


def largest_stable_lr(m: Model) -> tuple[float | None, bool]:
    """(largest grid lr whose tuning run trains, whether it is the grid's largest lr); None if none trains.
    Uses ``m["tuning_unigram"]``, the unigram loss of the tuning seed's split."""
    ok = [lr for lr, loss in zip(m["lr_grid"], m["tuning_loss"]) if trains(loss, m["tuning_unigram"])]
    return (max(ok), max(ok) == max(m["lr_grid"])) if ok else (None, False)


def dslm_depth(dslm: Mapping[str, Model], standard: Mapping[str, Model], deep: Mapping[str, Model], steps: int,
               min_seeds: int = 2) -> tuple[str, str]:
    """DeepScaleLM's depth claim (Kedia et al. 2024): at 192 layers DSLM trains where the standard init
    diverges or stalls, and a 1000-layer DSLM model trains.

    Keys of ``dslm`` and ``standard`` are the norm placement ("preln", "postln"). Each DSLM model is a
    tuned model (constant lr after warmup) whose scored runs are at its own best lr; the standard model of
    the same norm has its lr grid and tuning losses (for its largest stable lr) and its scored runs at the
    DSLM model's best lr. Every scored entry also carries ``unigram`` (per seed); tuned entries carry
    ``tuning_unigram``. ``deep``: the 1000-layer DSLM models' ``seeds``, ``final_loss`` and ``unigram`` at
    the lr of the DSLM model of the same norm at 192 layers.

    Rule, with `trains` (≥ 0.1 nats below unigram): *reproduced* if every scored DSLM run (192 and 1000
    layers) trains and no scored standard run at DSLM's lr does; *partly* if every DSLM run trains and some
    standard run at DSLM's lr fails, or a standard model's largest stable lr is below the DSLM model's of
    the same norm; *not reproduced* otherwise. *Inconclusive* if runs are shorter than 300 steps, a DSLM
    model fails the shared tuning rule, or a standard model has fewer than 2 scored seeds."""
    problems = [f"{steps} steps, the rule needs {MIN_STEPS}"] if steps < MIN_STEPS else []
    for norm, m in dslm.items():
        problems += tuning_problems(f"DSLM {norm}", m, min_seeds)
    for norm, m in standard.items():
        if len(m["seeds"]) < min_seeds:
            problems.append(f"standard {norm}: {len(m['seeds'])} scored seed(s), the rule needs {min_seeds}")
    if problems:
        return _inconclusive(problems)
    dslm_ok = all(all(trained(m)) for m in (*dslm.values(), *deep.values()))
    std_fail = [not t for m in standard.values() for t in trained(m)]
    stable = {k: largest_stable_lr(m)[0] for k, m in {**{f"DSLM {n}": m for n, m in dslm.items()},
                                                       **{f"standard {n}": m for n, m in standard.items()}}.items()}
    # a standard model with no stable lr on the grid counts as below any DSLM one
    lower = [n for n in standard if stable[f"DSLM {n}"] is not None
             and (stable[f"standard {n}"] is None or stable[f"standard {n}"] < stable[f"DSLM {n}"])]
    if dslm_ok and std_fail and all(std_fail):
        name = "reproduced"
    elif dslm_ok and (any(std_fail) or lower):
        name = "partly"
    else:
        name = "not reproduced"
    runs = "; ".join(f"{k}: {sum(trained(m))}/{len(m['seeds'])} seeds train" for k, m in
                     {**{f"DSLM {n}": m for n, m in dslm.items()}, **{f"standard {n} at DSLM's lr": m
                                                                      for n, m in standard.items()},
                      **{f"{k}": m for k, m in deep.items()}}.items())
    lrs = ", ".join(f"{k} {'none' if v is None else f'{v:g}'}" for k, v in stable.items())
    return name, f"{runs}; largest stable lr (tuning seed): {lrs}."


HORIZON_STEPS = 2000      # the papers' Post-LN regime: a long horizon ...
HORIZON_WARMUP = 0.25     # ... with warmup over at least this share of it
IMPROVING = 0.02          # nats the held-out loss must still fall over the last quarter of a run to count as improving


def improving(val_curve: Sequence[Sequence[float]], steps: int) -> bool:
    """Whether a run is still improving at its end: its last held-out loss is at least `IMPROVING` nats below its
    loss at the last evaluation at or before 3/4 of ``steps`` (``val_curve``: [[step, loss], ...])."""
    before = [loss for step, loss in val_curve if step <= 0.75 * steps]
    return bool(before and val_curve) and math.isfinite(val_curve[-1][1]) and \
        val_curve[-1][1] <= before[-1] - IMPROVING


def postln_horizon(dslm: Model, standard: Model, others: Mapping[str, Model], reference: Model, steps: int,
                   warmup: int, min_seeds: int = 1) -> tuple[str, str]:
    """DeepScaleLM's Post-LN claim in the regime its papers train in (Kedia et al. 2024; Liu et al. 2020 for
    Admin): at 192 layers, with a long warmup and a long horizon, DSLM's Post-LN trains where the standard Post-LN
    does not.

    Every argument is a tuned model scored at its own lr, whose scored entries also carry ``unigram`` and
    ``improving`` (per seed, `improving`): ``dslm`` (DSLM Post-LN), ``standard`` (standard Post-LN), ``others``
    (further Post-LN models by label: Admin), ``reference`` (DSLM Pre-LN, which trains at 192 layers in
    300 steps). With `trains`: *reproduced* if every scored DSLM Post-LN run trains and no standard Post-LN run
    does; *partly* if some DSLM Post-LN run trains (but not every one, or a standard one trains too); *not
    reproduced* if none does. *Inconclusive* if the horizon is shorter than `HORIZON_STEPS` or its warmup below
    `HORIZON_WARMUP` of it, if a model fails the shared tuning rule, or if the reference does not train on every
    scored seed (then the regime, not the Post-LN stack, fails). The reason also answers "was the 300-step
    horizon the cause?" (`horizon_cause`)."""
    problems = [f"{steps} steps, the rule needs {HORIZON_STEPS}"] if steps < HORIZON_STEPS else []
    if warmup < HORIZON_WARMUP * steps:
        problems.append(f"warmup {warmup} of {steps} steps, the rule needs {HORIZON_WARMUP:.0%}")
    postln = {"DSLM Post-LN": dslm, "standard Post-LN": standard, **others}
    models = {**postln, "DSLM Pre-LN": reference}
    for label, m in models.items():
        problems += tuning_problems(label, m, min_seeds)
    if not problems and not all(trained(reference)):
        problems.append("the DSLM Pre-LN reference does not train on every scored seed")
    runs = "; ".join(f"{k}: {sum(trained(m))}/{len(m['seeds'])} seeds train, {sum(m['improving'])} still improving"
                     for k, m in models.items())
    if problems:
        return "inconclusive", "; ".join(problems) + f" ({runs})."
    name = ("reproduced" if all(trained(dslm)) and not any(trained(standard)) else "partly" if any(trained(dslm))
            else "not reproduced")
    return name, f"{runs}; was the 300-step horizon the cause: {': '.join(horizon_cause(postln))}."


def horizon_cause(models: Mapping[str, Model]) -> tuple[str, str]:
    """Was the short horizon why no Post-LN model trained at 192 layers in 300 steps? Over the Post-LN ``models``
    (scored at the long horizon, as in `postln_horizon`): *yes* if a scored run of one of them trains; *no* if
    none trains and none is still improving at its end; *open* if none trains but some run is still improving (a
    longer horizon might yet train it)."""
    postln = list(models.values())
    if any(any(trained(m)) for m in postln):
        return "yes", "a Post-LN model trains at the long horizon"
    if any(any(m["improving"]) for m in postln):
        return "open", "no Post-LN model trains yet, but some is still improving at its end"
    return "no", "no Post-LN model trains, and none is still improving at its end"


def admin_postln(admin: Mapping[str, Model], others: Mapping[str, Model], steps: int, min_seeds: int = 2
                 ) -> tuple[str, str]:
    """Admin's claim at depth (Liu et al. 2020, "Understanding the Difficulty of Training Transformers"): with
    Admin's shortcut weights ω a deep Post-LN Transformer trains, where the standard Post-LN does not.

    ``admin``: the Admin Post-LN models (one per ``admin_mode``), each a tuned model scored at its own lr;
    ``others``: the claim's other Post-LN models at the same depth (``seeds``, ``final_loss``, ``unigram`` of
    their scored runs: DSLM Post-LN at its lr, standard Post-LN at DSLM's lr). With `trains`: *reproduced* if
    some Admin model trains on every scored seed; *partly* if an Admin model trains on some scored seed; *not
    reproduced* if no Admin run trains. *Inconclusive* if runs are shorter than 300 steps or an Admin model fails
    the shared tuning rule. The reason answers "does any Post-LN scheme train at this depth?": every Post-LN
    model with the seeds on which it trains."""
    problems = [f"{steps} steps, the rule needs {MIN_STEPS}"] if steps < MIN_STEPS else []
    for label, m in admin.items():
        problems += tuning_problems(label, m, min_seeds)
    if not admin:
        problems.append("no Admin model")
    if problems:
        return _inconclusive(problems)
    every = [k for k, m in admin.items() if all(trained(m))]
    some = [k for k, m in admin.items() if any(trained(m))]
    name = "reproduced" if every else "partly" if some else "not reproduced"
    runs = "; ".join(f"{k}: {sum(trained(m))}/{len(m['seeds'])} seeds train" for k, m in {**admin, **others}.items())
    any_trains = [k for k, m in {**admin, **others}.items() if any(trained(m))]
    answer = f"Post-LN models that train: {', '.join(any_trains)}" if any_trains else "no Post-LN model trains"
    return name, f"{runs}. {answer}."


def deep_thin(settings: Mapping[str, Mapping[str, Model]], min_seeds: int = 2) -> tuple[str, str]:
    """DeepScaleLM's deep-thin claim (Kedia et al. 2024): at equal or fewer parameters the deeper-thinner
    model beats the shallow-wide one.

    ``settings``: name → {"deep-thin": tuned model, "shallow-wide": tuned model}, each shape at its own lr.
    Per setting, Δ = shallow − deep seed-mean final validation loss and se = √(se_deep² + se_shallow²)
    (standard errors of the means); deep-thin *wins* if Δ > se (a diverged seed: no win). *Reproduced* if
    it wins in every setting, *partly* if in some, *not reproduced* if in none; *inconclusive* if any
    model of any setting fails the shared tuning rule (≥ 2 scored seeds)."""
    problems = [p for name, pair in settings.items() for kind, m in pair.items()
                for p in tuning_problems(f"{name} {kind}", m, min_seeds)]
    if problems:
        return _inconclusive(problems)
    gaps = {name: deep_thin_gap(pair) for name, pair in settings.items()}
    wins = sum(g["deep_wins"] for g in gaps.values())
    name = "reproduced" if wins == len(gaps) else ("partly" if wins else "not reproduced")
    return name, (f"deep-thin wins (Δ = shallow − deep final val loss > combined s.e., each shape at its own lr) "
                  f"in {wins}/{len(gaps)} settings: " + "; ".join(
                      f"{n} Δ = {g['gap']:+.3f} ± {g['se']:.3f}" for n, g in gaps.items()) + ".")


def deep_thin_gap(pair: Mapping[str, Model]) -> dict[str, Any]:
    """Δ = shallow − deep seed-mean final loss, its combined standard error and the win flag (Δ > se)."""
    deep, wide = seed_stats(pair["deep-thin"]["final_loss"]), seed_stats(pair["shallow-wide"]["final_loss"])
    se = math.hypot(deep["se"], wide["se"])
    gap = wide["mean"] - deep["mean"]
    return {"gap": gap, "se": se, "deep_wins": bool(gap > se)}


TRANSFER_FACTOR = 2.0      # one step of a ×2 lr grid


def transfer_status(best_lrs: Sequence[float | None], edges: Sequence[bool], factor: float = TRANSFER_FACTOR) -> str:
    """Whether the best lr η* of the smallest size (first entry) carries to the largest (last entry):
    "transfers" if η*(largest)/η*(smallest) is within ``factor`` either way, "moves" if it is further, and
    "undetermined" if either η* is missing (every lr diverged) or sits at the edge of its grid (the optimum
    may lie outside it)."""
    lo, hi = best_lrs[0], best_lrs[-1]
    if lo is None or hi is None or edges[0] or edges[-1]:
        return "undetermined"
    return "transfers" if abs(math.log(hi / lo)) <= math.log(factor) + 1e-9 else "moves"


def depth_transfer(depth: Mapping[str, str], width: Mapping[str, str]) -> tuple[str, str]:
    """Hyperparameter transfer (Yang et al. TP-V and TP-VI; Bordelon et al. 2024; Dey et al. 2025): the
    best lr carries across depth under depth-μP and CompleteP and across width under μP, and moves under
    the standard rules.

    ``depth``: scheme label → `transfer_status` across depth (keys "Pre-LN", "depth-μP", "CompleteP" are
    read); ``width``: parametrization → status across width (keys "standard", "μP"). With the three
    predictions P = (CompleteP across depth, depth-μP across depth, μP across width): *reproduced* if every
    P transfers and the standard baseline moves (Pre-LN across depth or standard across width); *partly* if
    some P transfers (all of them with a baseline that does not move, or only some); *inconclusive* if none
    transfers and at least one is undetermined; *not reproduced* if every P moves."""
    good = [depth["CompleteP"], depth["depth-μP"], width["μP"]]
    baseline_moves = depth["Pre-LN"] == "moves" or width["standard"] == "moves"
    if all(x == "transfers" for x in good) and baseline_moves:
        name = "reproduced"
    elif any(x == "transfers" for x in good):
        name = "partly"
    elif any(x == "undetermined" for x in good):
        name = "inconclusive"
    else:
        name = "not reproduced"
    reason = ("depth: " + ", ".join(f"{k} {x}" for k, x in depth.items()) +
              "; width: " + ", ".join(f"{k} {x}" for k, x in width.items()) + ".")
    return name, reason


GROWTH_SAVING = 0.10     # fraction of the from-scratch compute growth must save on every seed


def growth(scratch: Model, grown: Model, fractions: Sequence[float | None], min_seeds: int = 3
           ) -> tuple[str, str]:
    """Growing depth during training vs the deep model from scratch at equal training FLOPs (Staged Training,
    Shen et al. 2022: up to 22 % of the compute saved).

    Both are tuned models, each at its own lr. ``fractions``: per scored seed (paired by seed), the compute at
    which the grown run first reaches scratch's final validation loss, over scratch's compute (None: never).
    *Reproduced* if every fraction is ≤ 1 − GROWTH_SAVING (≥ 10 % of the compute saved on every seed);
    *partly* if every fraction is ≤ 1 (the grown model reaches scratch's loss within the same compute, saving
    less); else *not reproduced*. *Inconclusive* under the shared tuning rule (≥ 3 scored seeds), if the
    two models' scored seeds differ, or if scratch does not train on a scored seed (its final loss is not
    ``TRAIN_MARGIN`` below its unigram level: there is no loss worth reaching)."""
    problems = [*tuning_problems("scratch", scratch, min_seeds), *tuning_problems("grown", grown, min_seeds)]
    if sorted(scratch["seeds"]) != sorted(grown["seeds"]) or len(fractions) != len(scratch["seeds"]):
        problems.append(f"scored seeds differ: scratch {list(scratch['seeds'])}, grown {list(grown['seeds'])}")
    idle = [s for s, loss, u in zip(scratch["seeds"], scratch["final_loss"], scratch["unigram"]) if not trains(loss, u)]
    if idle:
        problems.append(f"scratch does not train on seed(s) {idle}")
    if problems:
        return _inconclusive(problems)
    shown = ", ".join("never" if f is None else f"{f:.3f}" for f in fractions)
    reached = [f for f in fractions if f is not None]
    if len(reached) == len(fractions) and max(reached) <= 1 - GROWTH_SAVING:
        return "reproduced", (f"the grown model reaches scratch's final loss with {shown} of its compute (every seed "
                              f"saves ≥ {GROWTH_SAVING:.0%})")
    if len(reached) == len(fractions) and max(reached) <= 1:
        return "partly", (f"the grown model reaches scratch's final loss within the same compute ({shown} of it), "
                          f"saving less than {GROWTH_SAVING:.0%} on some seed")
    return "not reproduced", (f"the grown model does not reach scratch's final loss within the same compute on every "
                              f"seed (fractions {shown})")
