"""DeepScaleLM's depth claim at CPU scale: very deep decoders train with DSLM, the standard init fails.

Claims (Kedia et al., ICML 2024): (a) at 192 layers DSLM trains stably where the standard Pre-LN /
Post-LN init diverges or stalls; (b) a 1000-layer thin model trains with DSLM (loss falls, no NaN).

Setup: causal LM on the embedded corpus (data.source "pydoc", BPE vocabulary 512), one width, lr, batch
and step count for every 192-layer run: scheme "preln" and "postln" (standard init), "dslm" with norm
"preln" and "postln"; AdamW, linear warmup over 10 % of the steps, cosine decay to 0.1·lr, global
gradient-norm clip 1.0 (the trainer's default, kept for every run). The lr is one calibrated for DSLM;
the standard inits also run at a 10× smaller lr (``low_lr``, first seed only), so that a "stall" is not
just a too-large lr. The 1000-layer run uses DSLM with Pre-LN (``deep_norms``; Post-LN too if the budget
allows) at the same width and lr. Calibration (DSLM Pre-LN, 192 × 64, batch 8 × 32 tokens, 100 steps,
seed 0): final validation loss 5.669 / 5.341 / 5.231 at lr 1e-3 / 3e-3 / 1e-2 (U = 5.234), hence lr 1e-2.

Rule (fixed before the full run). Per run: U = cross-entropy on the run's own evaluation tokens of the
add-one-smoothed unigram distribution of its training split (the loss of a model that learned only token
frequencies); Δ = initial − final validation loss; progress P = Δ / (initial − U), the share of the way
from the initial loss to U that the run covered (at this budget the best runs end near U).
  * diverged: NaN/Inf (``train_run`` reports ``diverged``) or final ≥ initial validation loss.
  * trains:   not diverged and P ≥ ``MIN_PROGRESS`` (0.5).
  * stalled:  not diverged and P < ``MIN_PROGRESS``; a standard run also stalls when its Δ is under
              ``STALL_FRACTION`` (0.5) of the mean Δ of the DSLM runs with the same norm at depth 192.
Verdict: "reproduced" if every DSLM run (192 and 1000 layers) trains and every standard 192-layer run at
the main lr diverges or stalls; "partly" if every DSLM run trains but only some of those standard runs
fail; "not reproduced" if any DSLM run does not train, or if no standard run fails. The low-lr standard
runs are reported beside, not counted.

    from sigprop.experiments import dslm_depth
    summary = dslm_depth.run("runs/dslm-depth")            # dslm-depth.{json,png,md}
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .dslm_moments import CONFIGS  # noqa: E402
from .outputs import progress, write_outputs  # noqa: E402
from .report import Table  # noqa: E402
from .training import seed_stats, train_run, unigram_loss  # noqa: E402

NAME = "dslm-depth"
VOCAB, HEADS = 512, 4
MIN_PROGRESS = 0.5       # a run trains if it covers this share of the way from its initial loss to unigram
STALL_FRACTION = 0.5     # a standard run stalls if it falls by less than this share of DSLM's drop
FULL = {"depth": 192, "deep_depth": 1000, "width": 64, "seq": 32, "batch": 8, "steps": 80, "deep_steps": 50,
        "lr": 1e-2, "low_lr": 1e-3, "seeds": (0, 1), "deep_seeds": (0,), "deep_norms": ("preln",), "eval_every": 20}
QUICK = {**FULL, "depth": 6, "deep_depth": 16, "width": 16, "seq": 16, "batch": 4, "steps": 12, "deep_steps": 12,
         "seeds": (0,), "eval_every": 4}


def one_run(run_dir: Path, scheme: str, norm: str | None, depth: int, lr: float, seed: int,
            s: dict[str, Any]) -> dict[str, Any]:
    """Train one decoder (``depth`` × ``s["width"]``) and return its `train_run` record (without the
    attention diagnostics) plus ``grad_curve`` and the run's settings."""
    model = {"arch": "decoder", "scheme": scheme, "vocab_size": VOCAB, "d_model": s["width"], "n_layers": depth,
             "n_heads": HEADS, "max_seq_len": s["seq"], **({"norm": norm} if norm else {})}
    steps = s["steps"] if depth == s["depth"] else s["deep_steps"]
    r = train_run(run_dir, model, data={"source": "pydoc", "seq_len": s["seq"]},
                  optim={"lr": lr, "warmup_steps": max(1, steps // 10)},
                  train_cfg={"steps": steps, "batch_size": s["batch"], "eval_every": s["eval_every"]}, seed=seed)
    r.pop("diag")
    grads = [[step, g] for step, _, g in r["train_curve"]]               # pre-clip global gradient norm
    return {**r, "scheme": scheme, "norm": norm, "depth": depth, "lr": lr, "grad_curve": grads}


def drop(r: dict[str, Any]) -> float:
    """Δ = initial − final validation loss (NaN when diverged)."""
    return r["initial_val_loss"] - r["final_val_loss"]


def progress_to_unigram(r: dict[str, Any]) -> float:
    """P = Δ / (initial − U): 0 at the initial loss, 1 at the unigram loss (NaN when diverged)."""
    return drop(r) / (r["initial_val_loss"] - r["unigram_loss"])


def status(r: dict[str, Any], dslm_drop: float | None = None) -> str:
    """"diverged" | "stalled" | "trains" by the module's rule; ``dslm_drop``: the reference DSLM Δ."""
    if r["diverged"] or not r["final_val_loss"] < r["initial_val_loss"]:
        return "diverged"
    if progress_to_unigram(r) < MIN_PROGRESS:
        return "stalled"
    if dslm_drop is not None and drop(r) < STALL_FRACTION * dslm_drop:
        return "stalled"
    return "trains"


def _grad_stats(curve: list[list[float]]) -> dict[str, float]:
    """Median pre-clip gradient norm over the first and the last tenth of the steps, and the maximum."""
    g = np.array([v for _, v in curve], dtype=float)
    if not len(g):                                      # diverged at the first step
        return {"first": math.nan, "last": math.nan, "max": math.nan}
    k = max(1, len(g) // 10)
    return {"first": float(np.median(g[:k])), "last": float(np.median(g[-k:])), "max": float(np.nanmax(g))}


def summarize(runs: dict[str, list[dict[str, Any]]], s: dict[str, Any]) -> dict[str, Any]:
    """Per-configuration numbers, each run's status, and the verdict by the module's rule."""
    dslm_drop = {norm: float(np.mean([drop(r) for r in runs[f"{label} depth {s['depth']}"]]))
                 for label, (scheme, norm) in CONFIGS.items() if scheme == "dslm"}   # norm -> mean Δ
    configs: dict[str, Any] = {}
    for key, rs in runs.items():
        norm = rs[0]["norm"] or rs[0]["scheme"]                 # standard "preln"/"postln" name their norm
        st = [status(r, None if rs[0]["scheme"] == "dslm" else dslm_drop[norm]) for r in rs]
        configs[key] = {"scheme": rs[0]["scheme"], "norm": norm, "depth": rs[0]["depth"],
                        "lr": rs[0]["lr"], "params": rs[0]["params"], "seeds": [r["seed"] for r in rs],
                        "status": st, "diverged": [r["diverged"] for r in rs],
                        "initial_val_loss": seed_stats(r["initial_val_loss"] for r in rs),
                        "final_val_loss": seed_stats(r["final_val_loss"] for r in rs),
                        "best_val_loss": seed_stats(r["best_val_loss"] for r in rs),
                        "unigram_loss": seed_stats(r["unigram_loss"] for r in rs),
                        "drop": seed_stats(drop(r) for r in rs),
                        "progress_to_unigram": seed_stats(progress_to_unigram(r) for r in rs),
                        "grad_norm": [_grad_stats(r["grad_curve"]) for r in rs],
                        "wall_s": round(sum(r["wall_s"] for r in rs), 1)}
    dslm_ok = all(x == "trains" for c in configs.values() if c["scheme"] == "dslm" for x in c["status"])
    std_main = [x for c in configs.values() if c["scheme"] != "dslm" and c["lr"] == s["lr"] for x in c["status"]]
    failed = sum(x != "trains" for x in std_main)
    verdict = ("not reproduced" if not dslm_ok or failed == 0 else
               "reproduced" if failed == len(std_main) else "partly")
    dslm = [f"{k}: {'/'.join(c['status'])}, P {c['progress_to_unigram']['mean']:.2f}"
            for k, c in configs.items() if c["scheme"] == "dslm"]
    std = [f"{k}: {'/'.join(c['status'])}, P {c['progress_to_unigram']['mean']:.2f}, "
           f"drop {c['drop']['mean']:.3f} vs DSLM {dslm_drop[c['norm']]:.3f}"
           for k, c in configs.items() if c["scheme"] != "dslm" and c["lr"] == s["lr"]]
    reason = (f"DSLM ({'; '.join(dslm)}); standard {s['depth']}-layer runs at lr {s['lr']:g} that diverged or "
              f"stalled: {failed}/{len(std_main)} ({'; '.join(std)}).")
    return {"verdict": verdict, "verdict_reason": reason, "configs": configs}


def plot(runs: dict[str, list[dict[str, Any]]], s: dict[str, Any]) -> Any:
    """Validation loss vs step at depth ``s["depth"]`` and at ``s["deep_depth"]`` (own panel), and the
    pre-clip gradient norm vs step of the main-lr runs; dashed: the unigram loss."""
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = dict(zip(CONFIGS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for key, rs in runs.items():
        label = key.split(" depth")[0]
        low = rs[0]["lr"] != s["lr"]
        ax = a if rs[0]["depth"] == s["depth"] else b
        for i, r in enumerate(rs):
            if r["val_curve"]:
                x, y = zip(*r["val_curve"])
                ax.plot(x, y, ":" if low else "-", marker="o", ms=2, color=colors[label],
                        label=f"{label}, lr {rs[0]['lr']:g}" if i == 0 else None)
            if not low and rs[0]["depth"] == s["depth"]:
                gx, gy = zip(*r["grad_curve"])
                c.plot(gx, gy, color=colors[label], lw=0.8, label=label if i == 0 else None)
    for ax, depth in ((a, s["depth"]), (b, s["deep_depth"])):
        u = np.mean([r["unigram_loss"] for rs in runs.values() for r in rs if r["depth"] == depth])
        ax.axhline(u, color="k", ls="--", lw=0.8, label="unigram loss")
        ax.set(xlabel="step", ylabel="validation loss (nats/token)",
               title=f"decoder, {depth} layers × width {s['width']}")
        ax.legend(fontsize=7)
    c.set(xlabel="step", ylabel="gradient norm (before clip 1.0)", yscale="log",
          title=f"{s['depth']} layers, lr {s['lr']:g}")
    c.legend(fontsize=7)
    return fig


def table(summary: dict[str, Any]) -> Table:
    """One row per configuration (mean ± std over seeds): losses, progress P, status, gradient norms."""
    rows = []
    for key, c in summary["configs"].items():
        ms = lambda d: f"{d['mean']:.3f}" + (f" ± {d['std']:.3f}" if len(c["seeds"]) > 1 else "")  # noqa: E731
        g = " · ".join(f"{x['first']:.3g} → {x['last']:.3g} ({x['max']:.3g})" for x in c["grad_norm"])
        rows.append([key.split(" depth")[0], c["depth"], f"{c['lr']:g}", f"{c['params'] / 1e6:.2f} M",
                     ms(c["initial_val_loss"]), ms(c["final_val_loss"]), ms(c["unigram_loss"]),
                     ms(c["progress_to_unigram"]), ", ".join(c["status"]), g])
    return Table(["config", "depth", "lr", "params", "initial loss", "final loss", "unigram", "P", "status",
                  "grad norm first → last (max)"], rows)


def markdown(summary: dict[str, Any], s: dict[str, Any]) -> str:
    """The section: claim, setup, table (mean ± std over seeds), verdict."""
    lines = [f"## {NAME} — 192- and 1000-layer models train with DSLM", "",
             "**Claim** (DeepScaleLM, Kedia et al. 2024): with the DSLM initialization and residual scaling a "
             "192-layer model trains stably where the standard Pre-LN / Post-LN initialization diverges or stalls, "
             "and models of 1000 layers train.", "",
             f"**Setup:** decoder, causal LM on the embedded corpus (`pydoc`, BPE vocabulary {VOCAB}), width "
             f"{s['width']}, {HEADS} heads, seq {s['seq']}, batch {s['batch']}; depth {s['depth']} for "
             f"{s['steps']} steps (seeds {list(s['seeds'])}), depth {s['deep_depth']} for {s['deep_steps']} steps "
             f"(seeds {list(s['deep_seeds'])}); AdamW lr {s['lr']:g} (calibrated for DSLM), 10 % warmup, cosine "
             f"decay, gradient clip 1.0; standard inits also at lr {s['low_lr']:g} (first seed). Unigram = loss "
             f"of the training split's token frequencies on the same evaluation tokens. Rule: *diverged* = NaN or "
             f"final ≥ initial loss; progress P = (initial − final)/(initial − unigram); *trains* = P ≥ "
             f"{MIN_PROGRESS}; *stalled* = P < {MIN_PROGRESS}, or a standard run whose drop is under "
             f"{STALL_FRACTION:.0%} of the DSLM drop (same norm).", "",
             table(summary).markdown()]
    lines += ["", f"**Verdict: {summary['verdict']}.** {summary['verdict_reason']}", ""]
    return "\n".join(lines)


def plan(s: dict[str, Any]) -> list[tuple[str, str, str | None, int, float, tuple[int, ...]]]:
    """(key, scheme, norm, depth, lr, seeds) of every configuration the experiment trains."""
    out = [(f"{label} depth {s['depth']}", scheme, norm, s["depth"], s["lr"], tuple(s["seeds"]))
           for label, (scheme, norm) in CONFIGS.items()]
    out += [(f"{label} depth {s['depth']} low lr", scheme, norm, s["depth"], s["low_lr"], tuple(s["seeds"])[:1])
            for label, (scheme, norm) in CONFIGS.items() if scheme != "dslm"]
    out += [(f"{label} depth {s['deep_depth']}", scheme, norm, s["deep_depth"], s["lr"], tuple(s["deep_seeds"]))
            for label, (scheme, norm) in CONFIGS.items() if scheme == "dslm" and norm in s["deep_norms"]]
    return out


def measure(out_dir: str | Path, quick: bool = False, show_progress: bool = True, **sizes: Any
            ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any], dict[str, Any]]:
    """Train every configuration of `plan` into ``out_dir/runs``; return (runs per configuration, summary with
    the verdict, the resolved sizes).

    ``sizes`` override `FULL` (or `QUICK` when ``quick``): depth, deep_depth, width, seq, batch, steps,
    deep_steps, lr, low_lr, seeds, deep_seeds, deep_norms (DSLM norms at deep_depth), eval_every.
    """
    base = QUICK if quick else FULL
    unknown = sorted(set(sizes) - set(base))
    if unknown:
        raise ValueError(f"unknown size(s) {unknown}; valid: {sorted(base)}")
    s = {**base, **sizes}
    out, start = Path(out_dir), time.perf_counter()
    jobs = [(key, scheme, norm, depth, lr, seed) for key, scheme, norm, depth, lr, seeds in plan(s) for seed in seeds]
    runs: dict[str, list[dict[str, Any]]] = {}
    unigram: dict[int, float] = {}     # the split and the (deterministic) BPE tokenizer depend on the seed only
    for key, scheme, norm, depth, lr, seed in progress(jobs, NAME, total=len(jobs), enabled=show_progress):
        folder = out / "runs" / f"{key.lower().replace(' ', '-')}-s{seed}"
        r = one_run(folder, scheme, norm, depth, lr, seed, s)
        if seed not in unigram:
            unigram[seed] = unigram_loss(folder)
        runs.setdefault(key, []).append({**r, "unigram_loss": unigram[seed]})
    summary = {**summarize(runs, s), "seeds": list(s["seeds"]), "deep_seeds": list(s["deep_seeds"]),
               "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in s.items()},
               "wall_s": round(time.perf_counter() - start, 1)}
    return runs, summary, s


def run(out_dir: str | Path, quick: bool = False, show_progress: bool = True, **sizes: Any) -> dict[str, Any]:
    """`measure` → `markdown` (with `table`) + `plot`, written as dslm-depth.{json,png,md}; returns the summary
    (verdict included). Arguments as for `measure`."""
    runs, summary, s = measure(out_dir, quick, show_progress, **sizes)
    return write_outputs(out_dir, NAME, {"runs": runs}, summary, markdown(summary, s), plot(runs, s))
