"""The masked-LM encoder both Shaped-Transformer claims train (Noci et al. 2023, App. D), at CPU scale.

Masked LM on the embedded ``pydoc`` corpus (BPE vocab 512, seq 64, 15 % masking), 4 heads, AdamW without
weight decay and betas (0.9, 0.999) as in the paper, linear warmup over the first 10 % of steps
(`sigprop.train.schedules.default_warmup`), cosine decay, grad clip 1. The shaped model has no LayerNorm,
τ₀ = 1, trained λ/γ, and the paper's training parametrization ``qk_scaling="weights"`` (τ = √n_k, W_Q, W_K ~
N(0, n^{-3/2}); equal at init to τ = √(n·n_k), ``"temperature"``, but Adam moves its logits n^{1/4}× faster);
"Recover" decays γ₁, γ₂, s₋ linearly to 0 over the warmup.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..train.schedules import default_warmup

MODEL = {"arch": "encoder", "vocab_size": 512, "n_heads": 4, "max_seq_len": 64}
DATA = {"source": "pydoc", "seq_len": 64, "mask_prob": 0.15}
OPTIM = {"weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999, "grad_clip": 1.0}   # the paper's Adam


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
    return {"model": {**MODEL, "n_layers": size["n_layers"], "d_model": size["d_model"],
                      "d_ff": ff_mult * size["d_model"], **overrides},
            "data": DATA, "optim": {**OPTIM, "warmup_steps": default_warmup(n)},
            "train": {"steps": n, "batch_size": size["batch_size"], "eval_every": max(1, n // 10),
                      "eval_batches": size["eval_batches"], "diag_every": diag_every, **extra}}
