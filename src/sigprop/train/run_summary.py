"""What a finished (or diverged) run left in its ``metrics.jsonl``, read back as one record.

The record every consumer uses (`sigprop.train.sweep` writes its scalars to ``sweep.jsonl``, the
experiments add the curves): ``initial_val_loss`` (the step-0 evaluation), ``final_val_loss`` and
``final_val_acc`` (NaN if diverged), ``best_val_loss`` (lowest finite evaluation), ``diverged`` (a NaN/Inf
stop, no evaluation, or a non-finite last one), ``error``, ``steps_done``, ``max_attn_logit`` and
``min_attn_entropy`` (over every diagnostics measurement; None without attention diagnostics),
``grad_norm`` (first, median, max, last pre-clip gradient norm), and the curves ``val_curve`` [[step,
loss]], ``train_curve`` [[step, loss, grad norm]], ``diag`` [[step, mean attention entropy, min attention
entropy, token correlation]], ``diag_layers`` [[step, per-sublayer rows]], ``block_grads`` [[step, each
block's pre-clip gradient norm]] and ``shortcut_factors`` [[step, each post-norm sublayer's shortcut factor on
that step's batch (`sigprop.diagnostics.shortcut`)]] (the steps that evaluate, with ``train.block_grads``).
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from .logging import read_jsonl

CURVES = ("val_curve", "train_curve", "diag", "diag_layers")


def grad_summary(norms: Sequence[float]) -> dict[str, float]:
    """First, median, largest and last of a run's gradient norms (NaN for none)."""
    if not norms:
        return {"first": math.nan, "median": math.nan, "max": math.nan, "last": math.nan}
    return {"first": norms[0], "median": statistics.median(norms), "max": max(norms), "last": norms[-1]}


def ended_at(run: dict[str, Any]) -> float:
    """A run's final validation loss, or its initial one if it diverged: a diverged run ends no better than it
    started (the loss every lr comparison reads)."""
    return run["initial_val_loss"] if run["diverged"] else run["final_val_loss"]


def history(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the run's one history: a resume from the checkpoint of step s undoes what was logged past s
    before it (steps a stop or a kill cut off after that checkpoint), so those records are dropped."""
    out: list[dict[str, Any]] = []
    for r in records:
        if r["kind"] == "event" and r.get("event") == "resumed":
            out = [x for x in out if x["step"] <= r["step"]]
        out.append(r)
    return out


def read_run(run_dir: str | Path, error: str | None = None) -> dict[str, Any]:
    """The record above of the run in ``run_dir``; ``error``: its NaN/Inf message, if it stopped on one."""
    records = history(read_jsonl(Path(run_dir) / "metrics.jsonl"))
    evals = [r for r in records if r["kind"] == "eval"]
    val = [[r["step"], r["loss"]] for r in evals]
    steps = [[r["step"], r["loss"], r["grad_norm"]] for r in records if r["kind"] == "train"]
    diags = [r for r in records if r["kind"] == "diag"]
    finite = [v for _, v in val if math.isfinite(v)]
    diverged = error is not None or not finite or not math.isfinite(val[-1][1])
    logits = [row["max_logit"] for d in diags for row in d["layers"] if row.get("max_logit") is not None]
    entropies = [d["attn_entropy_min"] for d in diags if d.get("attn_entropy_min") is not None]
    return {"initial_val_loss": val[0][1] if val else math.nan,
            "final_val_loss": math.nan if diverged else val[-1][1],
            "final_val_acc": math.nan if diverged else evals[-1]["acc"],
            "best_val_loss": min(finite) if finite else math.nan, "diverged": diverged, "error": error,
            "steps_done": max((s for s, _, _ in steps), default=0),
            "max_attn_logit": max(logits) if logits else None,
            "min_attn_entropy": min(entropies) if entropies else None,
            "grad_norm": grad_summary([g for _, _, g in steps]),
            "val_curve": val, "train_curve": steps,
            "diag": [[r["step"], r.get("attn_entropy"), r.get("attn_entropy_min"), r["token_corr"]] for r in diags],
            "diag_layers": [[r["step"], r["layers"]] for r in diags],
            "block_grads": [[r["step"], r["block_grad_norms"]] for r in records
                            if r["kind"] == "train" and "block_grad_norms" in r],
            "shortcut_factors": [[r["step"], r["shortcut_factors"]] for r in records
                                 if r["kind"] == "train" and "shortcut_factors" in r]}
