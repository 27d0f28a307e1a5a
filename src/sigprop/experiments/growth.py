"""Growing depth during training at CPU scale: *scratch*, ``depth`` Pre-LN blocks for ``steps`` steps, against
*grown*, ``small_depth`` blocks grown to ``depth`` (`sigprop.train.growth`) after ``grow_fraction`` of as many steps
as spend scratch's training FLOPs (`sigprop.models.flops`, per step at that step's depth). Measured per scored seed:
the compute at which the grown run first reaches scratch's final loss, over scratch's compute. Rule:
`sigprop.experiments.verdicts.growth`."""
from __future__ import annotations

from functools import partial
from typing import Any, Mapping, Sequence

from ..models.build import meta_model
from ..models.flops import train_flops_per_token
from . import verdicts
from .claim import FINAL, LR, MODEL, UNIGRAM, Claim, Model, lr_panel, tuned, val_panel

VOCAB = 512
FULL = {"small_depth": 4, "depth": 16, "width": 64, "heads": 4, "seq": 32, "batch": 16, "steps": 600,
        "grow_fraction": 0.25, "mode": "identity", "every": 1, "lrs": (1e-3, 3e-3, 1e-2), "seeds": (0, 1, 2),
        "eval_every": 20, "eval_batches": 4}
QUICK = {"small_depth": 1, "depth": 2, "width": 16, "heads": 2, "seq": 16, "batch": 4, "steps": 16,
         "lrs": (3e-3, 1e-2), "eval_every": 4}


def flops_per_token(s: Mapping[str, Any], depth: int) -> float:
    """Training FLOPs per token of one step of the decoder of ``depth`` blocks at sizes ``s``."""
    return train_flops_per_token(meta_model(run_config(s, depth, 1)["model"]), s["seq"])


def grown_schedule(s: Mapping[str, Any]) -> tuple[int, int]:
    """(steps, grow_at) of the grown run: grow_at = round(f · steps) and grow_at · F_small + (steps − grow_at) ·
    F_deep = T · F_deep (F: FLOPs per token, T: scratch's steps), so steps = T F_deep / (f F_small + (1 − f) F_deep)."""
    small, deep, f = flops_per_token(s, s["small_depth"]), flops_per_token(s, s["depth"]), s["grow_fraction"]
    steps = round(s["steps"] * deep / (f * small + (1 - f) * deep))
    return steps, max(1, round(f * steps))


def run_config(s: Mapping[str, Any], depth: int, steps: int, grow_at: int = 0) -> dict[str, Any]:
    """Run-config sections of one run: ``depth`` blocks (grown to ``s["depth"]`` after ``grow_at`` steps)."""
    growth = {"grow_at": grow_at, "grow_to": s["depth"], "grow_mode": s["mode"], "grow_every": s["every"]}
    return {"model": {"arch": "decoder", "scheme": "preln", "vocab_size": VOCAB, "d_model": s["width"],
                      "n_layers": depth, "n_heads": s["heads"], "max_seq_len": s["seq"]},
            "data": {"source": "pydoc", "seq_len": s["seq"]},
            "optim": {"warmup_steps": max(1, steps // 10)},
            "train": {"steps": steps, "batch_size": s["batch"], "eval_every": s["eval_every"],
                      "eval_batches": s["eval_batches"], "diag_every": 0, **(growth if grow_at else {})}}


def models(s: Mapping[str, Any]) -> list[Model]:
    """Scratch (the deep model for ``steps``) and grown (equal FLOPs), each tuned on its own grid."""
    steps, grow_at = grown_schedule(s)
    deep, small = flops_per_token(s, s["depth"]), flops_per_token(s, s["small_depth"])
    return [Model("scratch", f"{s['depth']} blocks from scratch", run_config(s, s["depth"], s["steps"]), s["lrs"],
                  attrs={"steps": s["steps"], "grow_at": None, "flops_before": deep, "flops_after": deep}),
            Model("grown", f"{s['small_depth']} → {s['depth']} blocks at step {grow_at}",
                  run_config(s, s["small_depth"], steps, grow_at), s["lrs"],
                  attrs={"steps": steps, "grow_at": grow_at, "flops_before": small, "flops_after": deep})]


def compute_at(attrs: Mapping[str, Any], step: float) -> float:
    """Training FLOPs per token-of-a-step after ``step`` steps: F_before per step up to the growth, F_after after."""
    g = attrs["grow_at"] or 0
    return attrs["flops_before"] * min(step, g) + attrs["flops_after"] * max(step - g, 0)


def compute_to_reach(attrs: Mapping[str, Any], curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The compute at which ``curve`` (validation [[step, loss]]) first reaches ``target``, linear in compute
    between the evaluations around the crossing; None if it never does."""
    prev = None
    for step, loss in curve:
        c = compute_at(attrs, step)
        if loss <= target:
            return c if prev is None or prev[1] == loss else prev[0] + (c - prev[0]) * (prev[1] - target) / (
                prev[1] - loss)
        prev = (c, loss)
    return None


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per scored seed of both: the grown run's compute to scratch's final loss over scratch's compute (None: never
    reached); and both totals."""
    m = summary["models"]
    if not (m["scratch"]["scored"] and m["grown"]["scored"]):
        return {"fractions": [], "seeds": []}
    sc, gr, total = m["scratch"]["scored"][0], m["grown"]["scored"][0], _total(m["scratch"])
    seeds = [(s, f) for s, f in zip(sc["seeds"], sc["final_loss"]) if s in gr["seeds"]]
    reached = [compute_to_reach(m["grown"]["attrs"], gr["logged"]["val_curve"][gr["seeds"].index(s)], f)
               for s, f in seeds]
    return {"fractions": [None if c is None else c / total for c in reached], "seeds": [s for s, _ in seeds],
            "scratch_compute": total, "grown_compute": _total(m["grown"])}


def _total(e: Mapping[str, Any]) -> float:
    """A model entry's training compute over its whole run (`compute_at` its last step)."""
    return compute_at(e["attrs"], e["attrs"]["steps"])


CLAIM = Claim(
    name="growth", title="growing depth during training saves compute",
    claim=("(Staged Training, Shen et al. 2022; LLaMA Pro, Wu et al. 2024): a model grown in depth during training "
           "reaches the loss of the same deep model trained from scratch for less compute."),
    full=FULL, quick=QUICK, models=models, log=lambda r: {"val_curve": r["val_curve"]}, derive=derive,
    rule=lambda s: verdicts.growth(tuned(s["models"]["scratch"]), tuned(s["models"]["grown"]),
                                   s["results"]["fractions"]),
    setup=("Causal LM on the `pydoc` corpus, BPE vocab 512, seq {s[seq]}, batch {s[batch]}; Pre-LN decoders of width "
           "{s[width]}, {s[heads]} heads. Scratch: {s[depth]} blocks ({m[scratch][params]:,} parameters), {s[steps]} "
           "steps. Grown: {s[small_depth]} blocks ({m[grown][params]:,} parameters) for {m[grown][attrs][grow_at]} "
           "steps, then {s[depth]} blocks (mode `{s[mode]}`, ``every`` = {s[every]}) to step "
           "{m[grown][attrs][steps]}: equal training FLOPs ({m[grown][attrs][flops_before]:.3g} and "
           "{m[grown][attrs][flops_after]:.3g} FLOPs per token before and after the growth). AdamW, 10 % warmup then "
           "cosine decay over each run, grad clip 1; each model at its own lr from {s[lrs]} on tuning seed {t} (not "
           "scored); scored seeds {s[seeds]}."),
    table=[MODEL, LR, ("steps (grown at)", lambda e, b, s: f"{e['attrs']['steps']} ({e['attrs']['grow_at'] or '–'})"),
           ("compute / scratch's", lambda e, b, s: f"{_total(e) / s['results'].get('scratch_compute', 1):.3f}"),
           FINAL, UNIGRAM],
    notes=lambda s: ("Compute at which the grown run first reaches scratch's final loss on the same seed, as a "
                     "fraction of scratch's compute: " + ("; ".join(
                         f"seed {n}: " + ("never" if f is None else f"{f:.3f}")
                         for n, f in zip(s["results"]["seeds"], s["results"]["fractions"])) or "no scored pair") + "."),
    plot=[lr_panel, partial(val_panel, x=lambda e, t: compute_at(e["attrs"], t),
                           xlabel="training FLOPs per token, summed over the steps so far")])
