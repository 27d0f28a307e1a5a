"""DeepScaleLM's depth claim at CPU scale: 192-layer decoders, DSLM against the standard init and Admin, and a
1000-layer DSLM model (setup: the claim's template). A constant lr after the warmup (no decay that could rescue a run
late); subnormal floats flushed to zero (``train.flush_denormal``: a Post-LN stack whose gradients vanish through
depth otherwise spends most of its step on them); each block's gradient norm logged (``train.block_grads``). Rules:
`sigprop.experiments.verdicts.dslm_depth`, beside it `verdicts.admin_postln`."""
from __future__ import annotations

from functools import partial
from typing import Any, Mapping

from ..schemes import get_scheme
from ..train.levels import TRAIN_MARGIN, trains
from ..train.schedules import default_warmup
from . import verdicts
from .claim import FINAL, LR, MODEL, UNIGRAM, Claim, Model, grad_stats, lr_panel, scored, seeds_cell, tuned, val_panel

VOCAB = 512
NORMS = {"preln": "Pre-LN", "postln": "Post-LN"}
FULL = {"depth": 192, "deep_depth": 1000, "width": 64, "heads": 4, "seq": 32, "batch": 8, "steps": 300,
        "lrs": (3e-3, 1e-2, 3e-2), "seeds": (0, 1), "deep_seeds": (0, 1), "deep_norms": ("preln",),
        "eval_every": 50, "admin_modes": ("profile", "constant")}
QUICK = {"depth": 6, "deep_depth": 16, "width": 16, "heads": 2, "seq": 16, "batch": 4, "steps": 12,
         "lrs": (3e-3, 1e-2), "deep_seeds": (0,), "eval_every": 4}


def run_config(s: Mapping[str, Any], scheme: str, norm: str | None, depth: int) -> dict[str, Any]:
    """Run-config sections of one decoder (``depth`` × ``s["width"]``): constant lr after a 10 % warmup; ``norm``
    (a key of `NORMS`): the norm placement of that scheme (None: the scheme's own)."""
    placement = {"norm_placement": get_scheme(norm).norm_placements[0]} if norm else {}
    return {"model": {"arch": "decoder", "scheme": scheme, "vocab_size": VOCAB, "d_model": s["width"],
                      "n_layers": depth, "n_heads": s["heads"], "max_seq_len": s["seq"], **placement},
            "data": {"source": "pydoc", "seq_len": s["seq"]},
            "optim": {"warmup_steps": default_warmup(s["steps"]), "decay": "constant"},
            "train": {"steps": s["steps"], "batch_size": s["batch"], "eval_every": s["eval_every"], "eval_batches": 4,
                      "diag_every": 0, "block_grads": True, "flush_denormal": True}}


def admin_run_config(s: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """An Admin Post-LN decoder (`sigprop.schemes.admin`, ``admin_mode`` ``mode``) of ``s["depth"]`` blocks."""
    t = run_config(s, "admin", None, s["depth"])
    return {**t, "model": {**t["model"], "admin_mode": mode}}


def models(s: Mapping[str, Any]) -> list[Model]:
    """DSLM per norm (tuned), the standard init per norm (tuned, scored at DSLM's lr), Admin Post-LN per mode
    (tuned, scored at its own lr), the deep DSLM models (scored at DSLM's lr)."""
    at = lambda scheme, n, depth=s["depth"], **more: {"scheme": scheme, "norm": n, "depth": depth, **more}
    return [*(Model(f"dslm-{n}", f"{label} DSLM", run_config(s, "dslm", n, s["depth"]), s["lrs"], attrs=at("dslm", n))
              for n, label in NORMS.items()),
            *(Model(f"standard-{n}", f"{label} standard", run_config(s, n, None, s["depth"]), s["lrs"],
                    score_at=f"dslm-{n}", attrs=at(n, n)) for n, label in NORMS.items()),
            *(Model(f"admin-{mode}", f"Post-LN Admin ({mode})", admin_run_config(s, mode), s["lrs"],
                    attrs=at("admin", "postln", admin_mode=mode)) for mode in s["admin_modes"]),
            *(Model(f"dslm-{n}-deep", f"{NORMS[n]} DSLM depth {s['deep_depth']}",
                    run_config(s, "dslm", n, s["deep_depth"]), (), tune=False, score_at=f"dslm-{n}",
                    seeds=s["deep_seeds"], attrs=at("dslm", n, s["deep_depth"])) for n in s["deep_norms"])]


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.dslm_depth` on the 192-layer DSLM and standard models and the deep DSLM models."""
    m, s = summary["models"], summary["sizes"]
    at = lambda *schemes: {e["attrs"]["norm"]: tuned(e) for e in m.values()
                           if e["attrs"]["scheme"] in schemes and e["attrs"]["depth"] == s["depth"]}
    deep = {e["label"]: scored(e) for e in m.values() if e["attrs"]["depth"] == s["deep_depth"]}
    return verdicts.dslm_depth(at("dslm"), at("preln", "postln"), deep, s["steps"])


def admin_rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.admin_postln`: Admin's Post-LN models at their own lr, beside the other Post-LN runs at depth."""
    m, s = summary["models"], summary["sizes"]
    admin = {e["label"]: tuned(e) for e in m.values() if e["attrs"]["scheme"] == "admin" and e["tuning"]}
    others = {e["label"]: scored(e) for e in m.values() if e["attrs"]["scheme"] != "admin"
              and e["attrs"]["norm"] == "postln" and e["attrs"]["depth"] == s["depth"]}
    return verdicts.admin_postln(admin, others, s["steps"])


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per model: whether each scored run trains; per tuned model its largest stable lr and which tuning runs train."""
    out = {}
    for key, e in summary["models"].items():
        r: dict[str, Any] = {"trains": [trains(x, u) for x, u in zip(scored(e)["final_loss"], scored(e)["unigram"])]}
        if e["tuning"]:
            t = tuned(e)
            r["largest_stable_lr"], r["largest_stable_at_top"] = verdicts.largest_stable_lr(t)
            r["tuning_trains"] = [trains(x, t["tuning_unigram"]) for x in t["tuning_loss"]]
        out[key] = r
    return out


def _stable(e: Mapping[str, Any], b: Any, summary: Mapping[str, Any]) -> str:
    """The cell of a model's largest stable lr ("–": not tuned)."""
    r = summary["results"][e["key"]]
    return ("–" if "largest_stable_lr" not in r else "none" if r["largest_stable_lr"] is None else
            f"{r['largest_stable_lr']:g}" + (" (grid top)" if r["largest_stable_at_top"] else ""))


CLAIM = Claim(
    name="dslm-depth", title="192- and 1000-layer models train with DSLM",
    claim=("(DeepScaleLM, Kedia et al. 2024): with the DSLM initialization and residual scaling a 192-layer model "
           "trains stably where the standard Pre-LN / Post-LN initialization diverges or stalls, and models of 1000 "
           "layers train."),
    full=FULL, quick=QUICK, models=models, rule=rule, log=grad_stats, derive=derive, rules={"admin-postln": admin_rule},
    setup=("decoder, causal LM on `pydoc` (BPE vocabulary 512), width {s[width]}, {s[heads]} heads, seq {s[seq]}, "
           "batch {s[batch]}, {s[steps]} steps, AdamW, 10 % warmup then a constant lr, clip 1.0. Every {s[depth]}-"
           "layer model at every lr of its grid on tuning seed {t} (not scored). Scored seeds {s[seeds]}: each DSLM "
           "model at its lr and the standard model of the same norm at that lr, each Admin Post-LN model (admin_mode "
           "{s[admin_modes]}) at its own lr; depth {s[deep_depth]} (seeds {s[deep_seeds]}) at DSLM's lr. A run "
           "*trains* if it ends ≥ " + f"{TRAIN_MARGIN} nats below its unigram loss (token frequencies of its training "
           "split)."),
    table=[MODEL, ("depth", lambda e, b, s: e["attrs"]["depth"]), LR, ("largest stable lr", _stable),
           ("scored lr", lambda e, b, s: f"{b['lr']:g}" if b else "–"),
           ("params", lambda e, b, s: f"{e['params'] / 1e6:.2f} M"),
           ("initial val loss", seeds_cell("initial_val_loss")), FINAL,
           UNIGRAM, ("scored runs", lambda e, b, s: ", ".join(("fails", "trains")[t]
                                                            for t in s["results"][e["key"]]["trains"])),
           ("grad norm first → last (max)", seeds_cell(
               "grad_norm", lambda x: f"{x['first']:.3g} → {x['last']:.3g} ({x['max']:.3g})"))],
    plot=[lr_panel, val_panel, partial(val_panel, curve="train_curve", column=2, yscale="log",
                                       ylabel="gradient norm (before clip 1.0)", title="gradient norms")])
