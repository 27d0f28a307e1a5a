"""Shaped Transformer vs a tuned Pre-LN baseline (Noci et al. 2023, App. D, Table 1) at CPU scale, and the
masked-LM encoder both Shaped-Transformer claims train (`run_config`; `entropy_collapse` trains it too).

The encoder: masked LM on the embedded ``pydoc`` corpus (BPE vocab 512, seq 64, 15 % masking), 4 heads, AdamW without
weight decay and betas (0.9, 0.999) as in the paper, linear warmup over the first 10 % of steps, cosine decay, clip 1.
The shaped model has no LayerNorm, τ₀ = 1, trained λ/γ, and the paper's training parametrization
``qk_scaling="weights"`` (τ = √n_k, W_Q, W_K ~ N(0, n^{-3/2}); equal at init to τ = √(n·n_k), ``"temperature"``,
but Adam moves its logits n^{1/4}× faster); "Recover" decays γ₁, γ₂, s₋ linearly to 0 over the warmup. Every model
gets its own lr on the tuning seed (Pre-LN's grid starts at the top of the paper's {1e-4, 5e-4, 1e-3, 5e-3}, the best
lr at this size). Rule: `sigprop.experiments.verdicts.shaped_vs_preln`.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..train.schedules import default_warmup
from . import verdicts
from .claim import FINAL, LR, MODEL, Claim, Model, lr_panel, tuned, val_panel

MODEL_TABLE = {"arch": "encoder", "vocab_size": 512, "n_heads": 4, "max_seq_len": 64}
DATA = {"source": "pydoc", "seq_len": 64, "mask_prob": 0.15}
OPTIM = {"weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999, "grad_clip": 1.0}   # the paper's Adam
BASELINE = "preln"
FF_MULT = 2                      # MLP width / model width (BERT uses 4; 2 fits the CPU budget)
FULL = {"steps": 450, "batch_size": 16, "n_layers": 8, "d_model": 64, "eval_batches": 8, "seeds": (0, 1, 2),
        "gammas": (0.05, 0.1, 0.2), "shapings": ("recover", "learn"), "qk_scaling": "weights",
        "preln_lrs": (2.5e-3, 5e-3, 1e-2, 2e-2), "shaped_lrs": (1.25e-3, 2.5e-3, 5e-3, 1e-2)}
QUICK = {"steps": 16, "batch_size": 8, "n_layers": 2, "d_model": 32, "eval_batches": 4, "gammas": (0.05,),
         "preln_lrs": (5e-3, 1e-2), "shaped_lrs": (2.5e-3, 5e-3)}


def shaped_model(shaping: str, gamma: float, qk_scaling: str = "weights") -> dict[str, Any]:
    """ModelConfig fields of the paper's trained shaped Transformer (``shaping``: "recover" | "learn")."""
    return {"scheme": "shaped", "shaping": shaping, "residual_gamma": gamma, "learn_residual": True, "tau0": 1.0,
            "qk_scaling": qk_scaling}


def run_config(size: Mapping[str, Any], overrides: Mapping[str, Any], ff_mult: int, diag_every: int = 0
               ) -> dict[str, Any]:
    """The run-config sections of one encoder at ``size`` (steps, batch_size, n_layers, d_model,
    eval_batches), MLP width ``ff_mult``·d, diagnostics every ``diag_every`` steps (0: none)."""
    n = size["steps"]
    extra = {"recover_steps": default_warmup(n)} if overrides.get("shaping") == "recover" else {}
    return {"model": {**MODEL_TABLE, "n_layers": size["n_layers"], "d_model": size["d_model"],
                      "d_ff": ff_mult * size["d_model"], **overrides},
            "data": DATA, "optim": {**OPTIM, "warmup_steps": default_warmup(n)},
            "train": {"steps": n, "batch_size": size["batch_size"], "eval_every": max(1, n // 10),
                      "eval_batches": size["eval_batches"], "diag_every": diag_every, **extra}}


def models(s: Mapping[str, Any]) -> list[Model]:
    """Pre-LN first, then shaped per training variant and γ, each tuned on its own grid."""
    out = [Model(BASELINE, "Pre-LN", run_config(s, {"scheme": "preln"}, FF_MULT), s["preln_lrs"])]
    out += [Model(f"shaped-{v}-{g:g}", f"shaped {v} γ={g:g}",
                  run_config(s, shaped_model(v, g, s["qk_scaling"]), FF_MULT), s["shaped_lrs"],
                  attrs={"shaping": v, "gamma": g}) for v in s["shapings"] for g in s["gammas"]]
    return out


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.shaped_vs_preln` on every model at its own lr (display labels name them in the reason)."""
    m = summary["models"]
    return verdicts.shaped_vs_preln({e["label"]: tuned(e) for e in m.values()}, m[BASELINE]["label"])


CLAIM = Claim(
    name="shaped-vs-preln", title="shaped Transformer without LayerNorm trains like tuned Pre-LN",
    claim=("(Shaped Transformer, App. D, Table 1): the shaped Transformer without LayerNorm, in both training "
           "variants (Recover, Learn) and for γ ∈ {0.05, 0.1, 0.2}, reaches train/test losses comparable to a "
           "Pre-LN Transformer whose learning rate is tuned."),
    full=FULL, quick=QUICK, models=models, rule=rule,
    derive=lambda s: {"unigram_val_loss": float(np.mean(s["models"][BASELINE]["scored"][0]["unigram"]))},
    setup=("Masked LM (15 % masking) on the `pydoc` corpus, BPE vocab 512, seq 64; encoder, {s[n_layers]} layers, "
           f"width " "{s[d_model]}, MLP width " f"{FF_MULT}·" "{s[d_model]}, 4 heads (Pre-LN {m[preln][params]:,} "
           "parameters); {s[steps]} steps, batch {s[batch_size]}, AdamW (no weight decay, betas 0.9/0.999), 10 % "
           "warmup then cosine decay, grad clip 1. Shaped: τ₀ = 1, λ and γ trained, qk_scaling {s[qk_scaling]}; "
           "Recover over the warmup. Every model has its own lr, chosen on tuning seed {t} (not scored). Scored seeds "
           "{s[seeds]}; validation on {s[eval_batches]} batches of {s[batch_size]} held-out examples. Unigram level "
           "(context-free predictor): {r[unigram_val_loss]:.3f} nats."),
    table=[MODEL, LR, FINAL, ("best val loss", lambda e, b, s: f"{b['best_val_loss']['mean']:.3f}"),
           ("diverged seeds", lambda e, b, s: sum(b["diverged"]))],
    plot=[lr_panel, val_panel])
