"""Attention entropy collapse at a large learning rate: Pre-LN vs shaped (Noci et al. 2023, App. D, Fig. 6).

Claim: at a large learning rate the attention entropy of the Pre-LN baseline collapses during
training (the softmax rows degenerate toward point masses; Zhai et al. 2023), while the shaped
Transformer's does not, neither with "Recover" (which ends as a LayerNorm-free softmax
Transformer) nor with "Learn".

Setup: masked LM on the embedded ``pydoc`` corpus (BPE vocab 512, seq 64, 15 % masking), encoder
of 4 layers, width 64, MLP width 256, 4 heads; 300 steps, batch 16, AdamW as in `shaped_vs_preln` (no weight
decay, betas 0.9/0.999), warmup and Recover over the first 10 % of steps. Shaped: γ = 0.1, τ₀ = 1,
λ and γ trained, the paper's training parametrization (``qk_scaling="init"``, see `shaped_vs_preln`);
the same two shaped models in the τ = √(n·n_k) parametrization (``qk_scaling="temperature"``, identical
at init, logits n^{1/4}× slower under Adam) are trained beside them and reported, not judged: the
calibration below was made with them, before the paper's parametrization was available. Every 15 steps the trainer's `Diagnostics` callback measures, on a fixed
validation batch, the softmax row entropy −Σ_j p_ij log p_ij averaged over rows, heads and batch
for each attention sublayer; we keep its mean and its minimum over the sublayers.

The large lr, 3e-2 for both models, was chosen by a seed-0 calibration at this size: at 1e-2 the
Pre-LN minimum entropy ended at 2.0 nats (no collapse), at 3e-2 at 0.26 nats.

Verdict rule (fixed before the full run): a run *collapses* if its final minimum-over-sublayers
attention entropy is below 10 % of log T (the entropy of uniform attention over T = 64 keys, the
largest possible): 0.42 nats; for a diverged run, its last measurement counts. *Reproduced* if every
Pre-LN seed collapses and no seed of a shaped model in the paper's parametrization does; *partly* if only the seed means say so (Pre-LN's mean final minimum entropy below the
threshold, every shaped model's above); else *not reproduced*.

    from sigprop.experiments import entropy_collapse
    summary = entropy_collapse.run("runs/claims")      # entropy-collapse.json / .png / .md
"""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .outputs import progress, write_outputs  # noqa: E402
from .report import Table  # noqa: E402
from .shaped_vs_preln import DATA, MODEL, OPTIM, shaped_model, warmup  # noqa: E402
from .training import finished, mean_curve, seed_stats, train_run  # noqa: E402

NAME = "entropy-collapse"
LARGE_LR = 3e-2
GAMMA = 0.1
COLLAPSE_FRACTION = 0.1
ALT = " (τ=√(n·n_k))"     # label suffix of the shaped models in the theory parametrization
MODELS = {"Pre-LN": {"scheme": "preln"}, "shaped recover": shaped_model("recover", GAMMA),
          "shaped learn": shaped_model("learn", GAMMA),
          "shaped recover" + ALT: shaped_model("recover", GAMMA, "temperature"),
          "shaped learn" + ALT: shaped_model("learn", GAMMA, "temperature")}
FULL = {"steps": 300, "batch_size": 16, "n_layers": 4, "d_model": 64}
QUICK = {"steps": 12, "batch_size": 8, "n_layers": 2, "d_model": 32}


def threshold(seq_len: int) -> float:
    """Collapse threshold: ``COLLAPSE_FRACTION`` · log T, T = keys per row (uniform attention's entropy)."""
    return COLLAPSE_FRACTION * math.log(seq_len)


def diag_curves(runs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Seed-mean mean and minimum attention entropy vs step (runs that did not diverge)."""
    diags = finished(runs, "diag")
    mean, low = mean_curve(diags, 1), mean_curve(diags, 2)
    return {"step": mean["step"], "mean_entropy": mean["mean"], "min_entropy": low["mean"]}


def verdict(final_min: dict[str, list[float]], limit: float) -> tuple[str, str]:
    """(verdict, reason) from each model's per-seed final minimum entropy under the module's rule; the
    verdict is on the paper's models (Pre-LN and the shaped models in the paper's training
    parametrization), the τ = √(n·n_k) models are reported in the reason."""
    pre = np.asarray(final_min["Pre-LN"])
    shaped = {k: np.asarray(v) for k, v in final_min.items() if k != "Pre-LN" and not k.endswith(ALT)}
    numbers = "; ".join(f"{k} {np.mean(v):.2f} (seeds {', '.join(f'{x:.2f}' for x in v)})"
                        for k, v in final_min.items())
    reason = f"final minimum attention entropy vs threshold {limit:.2f} nats: {numbers}"
    if (pre < limit).all() and all((v >= limit).all() for v in shaped.values()):
        return "reproduced", reason + "; Pre-LN collapses in every seed, shaped in none."
    if pre.mean() < limit and all(v.mean() >= limit for v in shaped.values()):
        return "partly", reason + "; the collapse separates the models in the seed mean only."
    return "not reproduced", reason + "."


def plot(data: dict[str, Any], limit: float) -> Any:
    """Left: mean (solid) and minimum (dashed) attention entropy vs step; right: validation loss."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (label, d) in enumerate(data.items()):
        c, color = d["entropy"], f"C{i}"
        a.plot(c["step"], c["mean_entropy"], color=color, label=f"{label} mean")
        a.plot(c["step"], c["min_entropy"], color=color, ls="--", label=f"{label} min")
        b.plot(d["val_curve"]["step"], d["val_curve"]["mean"], color=color, label=label)
    a.axhline(limit, color="grey", ls=":", label="collapse threshold")
    a.set(xlabel="step", ylabel="attention entropy (nats)", title="attention entropy (mean over seeds)")
    a.legend(fontsize=7)
    b.set(xlabel="step", ylabel="validation MLM loss (nats)", title="validation loss (mean over seeds)")
    b.legend(fontsize=7)
    return fig


CLAIM = ("**Claim** (Shaped Transformer, App. D, Fig. 6): \"for the large learning rate regime … the entropy "
         "collapses for the baseline model, but not for the proposed shaped Transformer\", including the "
         "Recover variant, which ends as a softmax Transformer without LayerNorm. Judged on the paper's training "
         "parametrization (τ = √n_k, W_Q, W_K ~ N(0, n^-3/2)); the rows marked τ=√(n·n_k) are the same models "
         "with the whole temperature in the logit scale (identical at init), reported beside.")


def table(summary: dict[str, Any]) -> Table:
    """One row per model: final minimum and mean attention entropy, collapsed seeds, final loss, diverged."""
    ms = lambda d, f: f"{d['mean']:{f}} ± {d['std']:{f}}"  # noqa: E731
    return Table(["model", "final min entropy", "final mean entropy", "collapsed seeds", "final val loss", "diverged"],
                 [[k, ms(v["final_min_entropy"], ".2f"), ms(v["final_mean_entropy"], ".2f"),
                   f"{v['collapsed_seeds']}/{len(summary['seeds'])}", ms(v["final_val_loss"], ".3f"), v["diverged"]]
                  for k, v in summary["models"].items()])


def markdown(summary: dict[str, Any]) -> str:
    """The results section: claim, setup (from ``summary["setup"]``), `table`, verdict."""
    s, cfg = summary, summary["setup"]
    return (
        f"## {NAME} — Pre-LN attention entropy collapses at a large lr, shaped does not\n\n{CLAIM}\n\n"
        f"**Setup.** Masked LM on the `pydoc` corpus (vocab {cfg['vocab_size']}, seq {cfg['seq_len']}); encoder, "
        f"{cfg['n_layers']} layers, width {cfg['d_model']}, {cfg['n_heads']} heads; {cfg['steps']} steps, batch "
        f"{cfg['batch_size']}, AdamW (no weight decay) at lr {cfg['lr']:g} for every model, warmup "
        f"{cfg['warmup']} steps (= Recover length); shaped γ = {GAMMA}, τ₀ = 1. Attention entropy every "
        f"{cfg['diag_every']} steps on a fixed validation batch; collapse = final minimum-over-layers entropy "
        f"< {COLLAPSE_FRACTION:g}·log T = {s['threshold']:.2f} nats. Seeds {s['seeds']}.\n\n"
        f"{table(s).markdown()}\n"
        f"**Verdict: {s['verdict']}.** {s['verdict_reason']}\n")


def measure(quick: bool = False, seeds: Sequence[int] = (0, 1, 2), lr: float = LARGE_LR,
            steps: int | None = None, batch_size: int | None = None, n_layers: int | None = None,
            d_model: int | None = None, show_progress: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train each model at ``lr`` for every seed with attention diagnostics; return (data: entropy and loss
    curves per model, summary: per-model statistics, the verdict and the setup). ``quick``: 12 steps,
    2 layers, width 32, batch 8, seed 0 only; explicit sizes override either size."""
    start = time.time()
    size = dict(QUICK if quick else FULL)
    size.update({k: v for k, v in {"steps": steps, "batch_size": batch_size, "n_layers": n_layers,
                                    "d_model": d_model}.items() if v is not None})
    seeds = list(seeds[:1] if quick else seeds)
    n, model = size["steps"], {**MODEL, "n_layers": size["n_layers"], "d_model": size["d_model"]}
    train_cfg = {"steps": n, "batch_size": size["batch_size"], "eval_every": max(1, n // 10),
                 "diag_every": max(1, n // 20)}
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in MODELS}
    jobs = [(label, seed) for seed in seeds for label in MODELS]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, seed) in enumerate(progress(jobs, desc=NAME, enabled=show_progress)):
            extra = {"recover_steps": warmup(n)} if MODELS[label].get("shaping") == "recover" else {}
            results[label].append(train_run(Path(tmp) / f"run{i:03d}", {**model, **MODELS[label]}, data=DATA,
                                            optim={**OPTIM, "lr": lr, "warmup_steps": warmup(n)},
                                            train_cfg={**train_cfg, **extra}, seed=seed))

    last = {label: [r["diag"][-1] if r["diag"] else [0, math.nan, math.nan, math.nan] for r in rs]
            for label, rs in results.items()}
    limit = threshold(DATA["seq_len"])
    final_min = {label: [d[2] for d in ds] for label, ds in last.items()}
    name, reason = verdict(final_min, limit)
    per_model = {label: {"final_min_entropy": seed_stats(final_min[label]),
                         "final_mean_entropy": seed_stats(d[1] for d in last[label]),
                         "collapsed_seeds": int(sum(v < limit for v in final_min[label])),
                         "final_val_loss": seed_stats(r["final_val_loss"] for r in rs),
                         "initial_val_loss": seed_stats(r["initial_val_loss"] for r in rs),
                         "diverged": sum(r["diverged"] for r in rs)} for label, rs in results.items()}
    summary = {"verdict": name, "verdict_reason": reason, "seeds": seeds, "wall_s": round(time.time() - start, 1),
               "lr": lr, "threshold": limit, "models": per_model,
               "setup": {**size, **MODEL, "seq_len": DATA["seq_len"], "lr": lr, "warmup": warmup(n),
                         "diag_every": train_cfg["diag_every"]}}
    data = {label: {"entropy": diag_curves(rs), "val_curve": mean_curve(finished(rs, "val_curve")),
                    "train_curve": mean_curve(finished(rs, "train_curve")),
                    "diag_per_seed": [r["diag"] for r in rs], "errors": [r["error"] for r in rs]}
            for label, rs in results.items()}
    return data, summary


def run(out_dir: str | Path, quick: bool = False, seeds: Sequence[int] = (0, 1, 2), lr: float = LARGE_LR,
        steps: int | None = None, batch_size: int | None = None, n_layers: int | None = None,
        d_model: int | None = None, show_progress: bool = True) -> dict[str, Any]:
    """`measure` → `markdown` (with `table`) + `plot`, written as ``entropy-collapse.{json,md,png}``; returns the
    summary. Arguments as for `measure`."""
    data, summary = measure(quick, seeds, lr, steps, batch_size, n_layers, d_model, show_progress)
    return write_outputs(out_dir, NAME, data, summary, markdown(summary), plot(data, summary["threshold"]))
