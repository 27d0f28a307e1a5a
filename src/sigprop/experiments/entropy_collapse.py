"""Attention entropy collapse at a large learning rate: Pre-LN vs shaped (Noci et al. 2023, App. D, Fig. 6).

Claim: at a large learning rate the attention entropy of the Pre-LN baseline collapses during
training (the softmax rows degenerate toward point masses; Zhai et al. 2023), while the shaped
Transformer's does not, neither with "Recover" (which ends as a LayerNorm-free softmax
Transformer) nor with "Learn".

Setup: masked LM on the embedded ``pydoc`` corpus (BPE vocab 512, seq 64, 15 % masking), encoder
of 4 layers, width 64, MLP width 256, 4 heads; 300 steps, batch 16, AdamW as in `shaped_vs_preln` (no weight
decay, betas 0.9/0.999), warmup and Recover over the first 10 % of steps. Shaped: γ = 0.1, τ₀ = 1,
λ and γ trained, in both parametrizations: the paper's training form (``qk_scaling="init"``: τ = √n_k,
W_Q, W_K ~ N(0, n^{-3/2})) and τ = √(n·n_k) (``qk_scaling="temperature"``; identical at init, logits
n^{1/4}× slower under Adam). Every model runs at every lr of a grid of large lrs (`LARGE_LRS`, ≥ 3 values)
for seeds 0, 1, 2: the claim is about a regime, so no lr is chosen and no seed is spent on tuning. If
Pre-LN's seed-mean entropy stays above the threshold at every lr, the grid is extended upward by one step
(the ratio of its two largest lrs), at most twice, and the extension recorded.

Measured every 15 steps by the trainer's `Diagnostics` callback on a fixed validation batch: per attention
sublayer the softmax row entropy −Σ_j p_ij log p_ij averaged over rows, heads and batch (the paper's
measure); its mean over layers is judged, its minimum over layers reported. Beside it, the quantities that
explain a collapse: the largest attention logit per layer and the residual-stream RMS √(var + mean²) after
every sublayer (`tuning.layer_stats`).

Verdict rule: `sigprop.experiments.verdicts.entropy_collapse` on the final layer-mean entropy, threshold
10 % of log T (uniform attention over T = 64 keys): 0.42 nats; for a diverged run its last measurement
counts. The verdict is on the paper's parametrization; the same rule on the τ = √(n·n_k) models is
reported beside (``verdict_temperature``).

Runs: 5 models × 3 lrs × 3 seeds = 45 training runs, up to 75 with both grid extensions.

    from sigprop.experiments import entropy_collapse
    summary = entropy_collapse.run("runs/claims")      # entropy-collapse.json / .png / .md
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..train.sweep_report import log_ticks
from . import verdicts
from .outputs import WallClock, progress, write_outputs
from .report import Table
from .shaped_vs_preln import DATA, MODEL, shaped_model, tables
from .training import finished, mean_curve, resolve_sizes
from .tuning import MAX_EXTEND, layer_stats, sweep_runs

NAME = "entropy-collapse"
BASELINE = "Pre-LN"
LARGE_LRS = (1e-2, 3e-2, 1e-1)
GAMMA = 0.1
COLLAPSE_FRACTION = 0.1
FF_MULT = 4
SEEDS = (0, 1, 2)
ALT = " (τ=√(n·n_k))"     # label suffix of the shaped models in the τ = √(n·n_k) parametrization
MODELS = {BASELINE: {"scheme": "preln"}, "shaped recover": shaped_model("recover", GAMMA),
          "shaped learn": shaped_model("learn", GAMMA),
          "shaped recover" + ALT: shaped_model("recover", GAMMA, "temperature"),
          "shaped learn" + ALT: shaped_model("learn", GAMMA, "temperature")}
FULL = {"steps": 300, "batch_size": 16, "n_layers": 4, "d_model": 64, "eval_batches": 4, "jobs": 2,
        "max_extend": MAX_EXTEND}
QUICK = {"steps": 12, "batch_size": 8, "n_layers": 2, "d_model": 32, "eval_batches": 2, "jobs": 1, "max_extend": 0}


def threshold(seq_len: int) -> float:
    """Collapse threshold: ``COLLAPSE_FRACTION`` · log T, T = keys per row (uniform attention's entropy)."""
    return COLLAPSE_FRACTION * math.log(seq_len)


def final_state(run: dict[str, Any]) -> dict[str, Any]:
    """The last diagnostics measurement of a run (its last before a divergence): layer-mean and minimum
    attention entropy, and per layer the entropy, largest logit and stream RMS (`tuning.layer_stats`)."""
    if not run["diag_layers"]:
        return {"entropy": math.nan, "min_entropy": math.nan, "attn_entropy": [], "max_logit": [], "stream_rms": []}
    stats = layer_stats(run["diag_layers"][-1][1])
    e = stats["attn_entropy"]
    return {"entropy": float(np.mean(e)), "min_entropy": float(np.min(e)), **stats}


def per_lr(runs: Sequence[dict[str, Any]], key: str) -> dict[str, list[Any]]:
    """{str(lr): [final_state(run)[key] per seed]} over one model's runs."""
    out: dict[str, list[Any]] = {}
    for r in runs:
        out.setdefault(f"{r['lr']:g}", []).append(final_state(r)[key])
    return out


def judge(summary: dict[str, Any], temperature: bool = False) -> tuple[str, str]:
    """(verdict, reason): `verdicts.entropy_collapse` on a summary's numbers (as saved in entropy-collapse.json),
    Pre-LN against the shaped models of the paper's parametrization (or, ``temperature``, of τ = √(n·n_k))."""
    models, limit = summary["models"], summary["threshold"]
    as_float = lambda d: {float(k): v for k, v in d.items()}
    shaped = {k: as_float(m["final_entropy"]) for k, m in models.items()
              if k != BASELINE and k.endswith(ALT) == temperature}
    return verdicts.entropy_collapse(as_float(models[BASELINE]["final_entropy"]), shaped, limit)


def diag_curves(runs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Seed-mean layer-mean and minimum attention entropy vs step (runs that did not diverge)."""
    diags = finished(runs, "diag")
    mean, low = mean_curve(diags, 1), mean_curve(diags, 2)
    return {"step": mean["step"], "mean_entropy": mean["mean"], "min_entropy": low["mean"]}


def plot(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """Left: final layer-mean entropy vs lr (seeds as dots, mean as a line); middle: layer-mean entropy vs
    step at the largest lr; right: final largest attention logit vs lr (mean over layers and seeds)."""
    limit, models = summary["threshold"], summary["models"]
    top = f"{max(summary['lr_grid']):g}"
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.5))
    for i, (label, m) in enumerate(models.items()):
        color, ls = f"C{i}", "--" if label.endswith(ALT) else "-"
        lrs = [float(k) for k in m["final_entropy"]]
        means = [np.nanmean(v) for v in m["final_entropy"].values()]
        a.plot(lrs, means, ls=ls, color=color, label=label)
        for lr, v in zip(lrs, m["final_entropy"].values()):
            a.scatter([lr] * len(v), v, s=8, color=color)
        curve = data[label]["entropy"][top]
        b.plot(curve["step"], curve["mean_entropy"], ls=ls, color=color, label=label)
        c.plot(lrs, [np.nanmean([np.mean(x) for x in v if x]) if any(v) else np.nan
                     for v in m["max_logit"].values()], ls=ls, color=color, marker="o", ms=3, label=label)
    for ax in (a, b):
        ax.axhline(limit, color="grey", ls=":", label="collapse threshold")
    log_ticks(a, summary["lr_grid"])
    log_ticks(c, summary["lr_grid"])
    a.set(xlabel="peak lr", ylabel="final attention entropy (layer mean, nats)",
          title="entropy at the end of training")
    b.set(xlabel="step", ylabel="attention entropy (layer mean, nats)", title=f"entropy vs step, lr {top}")
    c.set(yscale="log", xlabel="peak lr", ylabel="largest attention logit (layer mean)",
          title="the cause: attention logits")
    for ax in (a, b, c):
        ax.legend(fontsize=7)
    return fig


CLAIM = ("**Claim** (Shaped Transformer, App. D, Fig. 6): \"for the large learning rate regime … the entropy "
         "collapses for the baseline model, but not for the proposed shaped Transformer\", including the "
         "Recover variant, which ends as a softmax Transformer without LayerNorm. Judged on the paper's training "
         "parametrization (τ = √n_k, W_Q, W_K ~ N(0, n^-3/2)); the rows marked τ=√(n·n_k) are the same models "
         "with the whole temperature in the logit scale (identical at init), judged beside.")


def table(summary: dict[str, Any]) -> Table:
    """One row per model and lr: final layer-mean and minimum entropy, collapsed seeds, largest logit, stream
    RMS at the last sublayer, final loss."""
    ms = lambda v, f: f"{np.mean(v):{f}} ± {np.std(v, ddof=1) if len(v) > 1 else 0:{f}}"
    rows = []
    for k, m in summary["models"].items():
        for lr, e in m["final_entropy"].items():
            logits = [max(x) for x in m["max_logit"][lr] if x]
            rms = [x[-1] for x in m["stream_rms"][lr] if x]
            rows.append([k, lr, ms(e, ".2f"), ms(m["final_min_entropy"][lr], ".2f"),
                         f"{m['collapsed_seeds'][lr]}/{len(e)}", ms(logits, ".3g") if logits else "–",
                         ms(rms, ".3g") if rms else "–", ms(m["final_loss"][lr], ".3f")])
    return Table(["model", "lr", "final entropy (layer mean)", "final min entropy", "collapsed seeds",
                  "largest logit", "stream RMS (last)", "final val loss"], rows)


def markdown(summary: dict[str, Any]) -> str:
    """The results section: claim, setup (from ``summary["setup"]``), `table`, verdict."""
    s, cfg = summary, summary["setup"]
    ext = f" Grid extended: {'; '.join(s['extended'])}." if s["extended"] else ""
    return (
        f"## {NAME} — Pre-LN attention entropy collapses at a large lr, shaped does not\n\n{CLAIM}\n\n"
        f"**Setup.** Masked LM on the `pydoc` corpus (vocab {cfg['vocab_size']}, seq {cfg['seq_len']}); encoder, "
        f"{cfg['n_layers']} layers, width {cfg['d_model']}, MLP width {FF_MULT * cfg['d_model']}, {cfg['n_heads']} "
        f"heads; {cfg['steps']} steps, batch {cfg['batch_size']}, AdamW (no weight decay), every model at every lr "
        f"of {', '.join(f'{x:g}' for x in s['lr_grid'])}, warmup {cfg['warmup']} steps (= Recover length); shaped "
        f"γ = {GAMMA}, τ₀ = 1. Attention entropy (per layer averaged over rows, heads and batch; judged: its mean "
        f"over layers) every {cfg['diag_every']} steps on a fixed validation batch; collapse = final entropy "
        f"< {COLLAPSE_FRACTION:g}·log T = {s['threshold']:.2f} nats. Seeds {s['seeds']}.{ext}\n\n"
        f"{table(s).markdown()}\n"
        f"**Verdict: {s['verdict']}.** {s['verdict_reason']} τ = √(n·n_k) models under the same rule: "
        f"{s['verdict_temperature']} ({s['verdict_temperature_reason']})\n")


def measure(out_dir: str | Path, quick: bool = False, seeds: Sequence[int] = SEEDS,
            lrs: Sequence[float] = LARGE_LRS, show_progress: bool = True, **sizes: Any
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train each model at every lr for every seed (runs in ``out_dir/sweeps``), extending the grid upward
    while Pre-LN's seed-mean entropy stays above the threshold (at most ``max_extend`` times); return (data:
    entropy and loss curves per model and lr, summary: per-model numbers, the verdicts and the setup).
    ``quick``: 12 steps, 2 layers, width 32, batch 8, the first seed at the middle lr, no extension;
    ``sizes`` override the size's keys (steps, batch_size, n_layers, d_model, eval_batches, jobs, max_extend)."""
    clock = WallClock(out_dir, NAME)
    size = resolve_sizes(QUICK if quick else FULL, sizes)
    seeds, grid = (list(seeds[:1]), list(lrs[1:2])) if quick else (list(seeds), sorted(lrs))
    if size["max_extend"] and len(grid) < 2:
        raise ValueError(f"lrs needs at least 2 values to extend the grid, got {list(lrs)}")
    diag_every = max(1, size["steps"] // 20)
    limit = threshold(DATA["seq_len"])
    sweeps = Path(out_dir) / "sweeps"
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in MODELS}
    extended: list[str] = []
    todo = grid
    while todo:
        for label in progress(list(MODELS), f"{NAME} lr {', '.join(f'{x:g}' for x in todo)}", enabled=show_progress):
            runs[label] += sweep_runs(sweeps, tables(size, MODELS[label], FF_MULT, diag_every), todo, seeds,
                                      size["jobs"])
        pre = per_lr(runs[BASELINE], "entropy")
        todo = []
        if len(extended) < size["max_extend"] and all(np.nanmean(v) >= limit for v in pre.values()):
            new = grid[-1] * grid[-1] / grid[-2]
            extended.append(f"{BASELINE} did not collapse up to lr {grid[-1]:g}: added {new:g}")
            grid, todo = grid + [new], [new]
    per_model = {}
    for label, rs in runs.items():
        loss = {}
        for r in rs:
            loss.setdefault(f"{r['lr']:g}", []).append(r["final_val_loss"])
        best = min(loss, key=lambda k: np.mean(loss[k]) if np.isfinite(loss[k]).all() else math.inf)
        entropy = per_lr(rs, "entropy")
        per_model[label] = {"lr_grid": grid, "best_lr": float(best), "seeds": seeds, "final_loss": loss,
                            "final_entropy": entropy, "final_min_entropy": per_lr(rs, "min_entropy"),
                            "collapsed_seeds": {k: int(sum(not x >= limit for x in v)) for k, v in entropy.items()},
                            "attn_entropy": per_lr(rs, "attn_entropy"), "max_logit": per_lr(rs, "max_logit"),
                            "stream_rms": per_lr(rs, "stream_rms"),
                            "diverged": {k: sum(r["diverged"] for r in rs if f"{r['lr']:g}" == k) for k in loss}}
    summary = {"seeds": seeds, "lr_grid": grid, "extended": extended, "wall_s": clock.seconds(),
               "threshold": limit, "models": per_model,
               "setup": {**size, **MODEL, "seq_len": DATA["seq_len"], "warmup": max(1, size["steps"] // 10),
                         "diag_every": diag_every}}
    (name, reason), (alt, alt_reason) = judge(summary), judge(summary, temperature=True)
    summary = {"verdict": name, "verdict_reason": reason, "verdict_temperature": alt,
               "verdict_temperature_reason": alt_reason, **summary}
    data = {label: {"entropy": {f"{lr:g}": diag_curves([r for r in rs if r["lr"] == lr]) for lr in grid},
                    "val_curve": {f"{lr:g}": mean_curve(finished([r for r in rs if r["lr"] == lr], "val_curve"))
                                  for lr in grid},
                    "diag_layers_per_run": [{"lr": r["lr"], "seed": r["seed"], "diag_layers": r["diag_layers"]}
                                            for r in rs],
                    "errors": [r["error"] for r in rs]}
            for label, rs in runs.items()}
    return data, summary


def run(out_dir: str | Path, quick: bool = False, seeds: Sequence[int] = SEEDS, lrs: Sequence[float] = LARGE_LRS,
        show_progress: bool = True, **sizes: Any) -> dict[str, Any]:
    """`measure` → `markdown` (with `table`) + `plot`, written as ``entropy-collapse.{json,md,png}``; returns the
    summary. Arguments as for `measure`."""
    data, summary = measure(out_dir, quick, seeds, lrs, show_progress, **sizes)
    return write_outputs(out_dir, NAME, data, summary, markdown(summary), plot(data, summary))
