"""DeepScaleLM's depth claim at CPU scale: a deeper-thinner DSLM model beats a shallow-wide one with
equal (or fewer) parameters.

Claim (Kedia et al., ICML 2024, abstract): "our deep models with fewer parameters outperform shallow
models in Language Modeling, Speech Translation, and Image Classification, across encoder-only,
decoder-only and encoder-decoder variants, for both Pre-LN and Post-LN transformers".

Six settings, each a pair of scheme-"dslm" models trained with the same data, steps, batch and lr
schedule (one peak lr per setting: of {1e-3, 3e-3, 1e-2}, the one with the lowest pair-mean final
validation loss in a 300-step seed-0 calibration; see `SETTINGS`): decoder causal LM
(Pre-LN, Post-LN), encoder masked LM (Pre-LN, Post-LN) on the embedded "pydoc" corpus, a ViT on
scikit-learn's 8×8 digits, and an encoder-decoder on span denoising of "pydoc".

Shapes (`SHAPES`): shallow-wide = 2 blocks × width 64, deep-thin = 8 blocks × width 32, d_ff = 4d,
head width 16: four times deeper and half as wide, which keeps the block weights (∝ L·d²) equal.
Parameter matching: the block weight matrices (12·L·d², 16·L·d² for encdec decoder blocks) are equal,
so the non-embedding count (everything outside the model's ``embed`` module) differs only by the extra
LayerNorm gains of the deeper stack (+0.5 %); the total count, which includes the tied token/position
tables, is lower for deep-thin because its tables are half as wide. With vocab 288 the tables are a
small share: deep-thin has 9 % (decoder, encoder), 4 % (encdec) and 0.6 % (ViT) fewer total
parameters, i.e. ≤ and within 10 % (the constraint we enforce and test); with a large vocab the tables
would dominate the total count. Both counts are reported.

Verdict rule (fixed before the full run): per setting, deep-thin *wins* if its seed-mean final
validation loss is lower than shallow-wide's by more than the combined standard error
√(s_deep²/n + s_shallow²/n) (s = sample std over the n seeds); a diverged run makes its mean NaN (no
win). "reproduced" if deep-thin wins in all six settings, "partly" if in some, "not reproduced" if
in none.

    from sigprop.experiments import deep_thin
    summary = deep_thin.run("runs/deep-thin")                 # deep-thin.json / .png / .md
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .outputs import progress, write_outputs  # noqa: E402
from .report import Table  # noqa: E402
from .training import finished, mean_curve, meta_model, param_count, seed_stats, trainable, train_run  # noqa: E402

NAME = "deep-thin"
VOCAB, SEQ_LEN = 288, 64                 # byte-level BPE needs ≥ 260 tokens; a small table keeps ≤ 10 % apart
EVAL_BATCHES = 8                         # text: 128 validation sequences; ViT: the whole 360-image split


@dataclass(frozen=True)
class Shape:
    n_layers: int
    d_model: int
    n_heads: int                         # head width 16 in both shapes

    @property
    def label(self) -> str:
        return f"{self.n_layers}L×{self.d_model}d"


@dataclass(frozen=True)
class Setting:
    arch: str                            # decoder | encoder | encdec | vit
    norm: str                            # DSLM LayerNorm placement: preln | postln
    lr: float                            # peak lr of both models (short calibration, see module docstring)
    steps: int                           # optimizer steps of both models
    batch_size: int                      # examples per step


SHAPES = {"deep-thin": Shape(8, 32, 2), "shallow-wide": Shape(2, 64, 4)}
# lr: calibration winners (pair-mean loss at 300 steps, seed 0); 1e-2 is the top of the grid for text
SETTINGS = {
    "decoder-preln": Setting("decoder", "preln", 1e-2, 600, 16),
    "decoder-postln": Setting("decoder", "postln", 1e-2, 600, 16),
    "encoder-preln": Setting("encoder", "preln", 1e-2, 600, 16),
    "encoder-postln": Setting("encoder", "postln", 1e-2, 600, 16),
    "vit": Setting("vit", "preln", 3e-3, 300, 64),
    "encdec": Setting("encdec", "preln", 1e-2, 400, 16),
}
EVALS = 10                               # validation points per run (besides step 0)
QUICK_STEPS, QUICK_CHARS = 8, 60_000     # quick: one seed, 8 steps, a slice of the corpus, one small eval


def model_table(setting: Setting, shape: Shape) -> dict[str, Any]:
    """The ModelConfig fields of one model of a pair."""
    table = {"arch": setting.arch, "scheme": "dslm", "norm": setting.norm, "n_layers": shape.n_layers,
             "d_model": shape.d_model, "n_heads": shape.n_heads}
    if setting.arch != "vit":
        table.update(vocab_size=VOCAB, max_seq_len=SEQ_LEN)
    return table


def data_table(setting: Setting, max_chars: int = 0) -> dict[str, Any]:
    """DataConfig fields: the digits images for ViT, else the embedded "pydoc" text (its first
    ``max_chars`` characters; 0 = all)."""
    if setting.arch == "vit":
        return {"source": "digits", "val_fraction": 0.2}
    return {"source": "pydoc", "seq_len": SEQ_LEN, "max_chars": max_chars}


def non_embedding_count(model: dict[str, Any]) -> int:
    """Trainable parameters outside the model's ``embed`` module (token/position tables, tied LM head;
    ViT patch projection, position table, class token)."""
    net = meta_model(model)
    return trainable(net) - trainable(net.embed)


def compare(pair: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Deep-thin vs shallow-wide on final validation loss: difference, combined s.e., win flag."""
    deep, wide = pair["deep-thin"]["final_val_loss"], pair["shallow-wide"]["final_val_loss"]
    gap = wide["mean"] - deep["mean"]
    se = math.hypot(deep["se"], wide["se"])
    return {"loss_gap_shallow_minus_deep": gap, "combined_se": se, "deep_wins": bool(gap > se)}


def verdict(wins: dict[str, bool]) -> str:
    n = sum(wins.values())
    return "reproduced" if n == len(wins) else ("partly" if n else "not reproduced")


def _fmt(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def table(summary: dict[str, Any]) -> Table:
    """One row per model of each pair; the pair's loss gap and winner on its first row."""
    rows = []
    for name, s in summary["settings"].items():
        for i, (kind, m) in enumerate(s["models"].items()):
            gap = ([f"{s['loss_gap_shallow_minus_deep']:+.3f} ± {s['combined_se']:.3f}",
                    "yes" if s["deep_wins"] else "no"] if i == 0 else ["", ""])
            rows.append([name if i == 0 else "", f"{kind} {m['shape']}", f"{s['steps']}, {s['batch_size']}, {s['lr']:g}",
                         f"{m['params']:,} / {m['non_embedding_params']:,}", _fmt(m["final_val_loss"]),
                         _fmt(m["final_val_acc"]), *gap])
    return Table(["setting", "model", "steps, batch, lr", "params total / non-emb", "final val loss", "val acc",
                  "Δ ± s.e.", "deep wins"], rows)


def markdown(summary: dict[str, Any]) -> str:
    """The results section: claim, setup, `table`, verdict."""
    shapes = " vs ".join(f"{k} {s.label}" for k, s in SHAPES.items())
    lines = [f"## {NAME} — deeper-thinner beats shallow-wide at equal parameters", "",
             "**Claim** (DeepScaleLM, Kedia et al. 2024): deep models with fewer parameters outperform shallow "
             "ones across encoder-only, decoder-only and encoder-decoder models and image classification, for "
             "both Pre-LN and Post-LN.", "",
             f"**Setup.** Scheme DSLM in both models of a pair; {shapes} (d_ff = 4d, head width 16). Text: "
             f"embedded pydoc corpus, byte-level BPE vocab {VOCAB}, seq {SEQ_LEN}; ViT: sklearn 8×8 digits, "
             "patch 2, 20 % validation. AdamW, warmup 10 % of steps, cosine decay to 0.1·lr, grad clip 1; "
             f"the same steps, batch and lr within a pair. Seeds {summary['seeds']}. Parameters: non-embedding "
             "block weights equal (deep-thin +0.5 % LayerNorm gains), total fewer for deep-thin (halved "
             "embedding tables). Δ = shallow − deep seed-mean final loss; wins if Δ > combined s.e.", "",
             table(summary).markdown()]
    lines += ["", f"**Verdict: {summary['verdict']}.** {summary['verdict_reason']}", ""]
    return "\n".join(lines)


def plot(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """One panel per setting (seed-mean validation curves, band = min–max over seeds) and a chart of the
    final losses (mean ± std over seeds)."""
    names = list(data)
    fig = plt.figure(figsize=(16, 7))
    grid = fig.add_gridspec(2, 4)
    colors = {"deep-thin": "C0", "shallow-wide": "C3"}
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid[i // 4, i % 4])
        for kind, runs in data[name].items():
            c = mean_curve(finished(runs, "val_curve"))
            if not c["step"]:
                continue
            shape = summary["settings"][name]["models"][kind]["shape"]
            ax.plot(c["step"], c["mean"], color=colors[kind], label=f"{kind} {shape}")
            ax.fill_between(c["step"], c["min"], c["max"], color=colors[kind], alpha=0.2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("val loss")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    ax = fig.add_subplot(grid[1, 2:])
    x = np.arange(len(names))
    for j, kind in enumerate(SHAPES):
        stats = [summary["settings"][n]["models"][kind]["final_val_loss"] for n in names]
        ax.bar(x + (j - 0.5) * 0.38, [s["mean"] for s in stats], 0.38, yerr=[s["std"] for s in stats],
               color=colors[kind], label=kind, capsize=3)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("final val loss (mean ± std)")
    ax.legend(fontsize=7)
    fig.suptitle(f"DSLM deep-thin vs shallow-wide: verdict {summary['verdict']}")
    return fig


def measure(out_dir: str | Path, quick: bool = False, seeds: Iterable[int] = (0, 1, 2),
            settings: Iterable[str] | None = None, steps: int | None = None, show_progress: bool = True
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train every pair × seed into ``out_dir/runs``; return (data: every run per setting and model, summary:
    per-setting statistics and the verdict).

    ``settings``: a subset of `SETTINGS` names; ``steps`` overrides every setting's step count;
    ``quick``: one seed, `QUICK_STEPS` steps, `QUICK_CHARS` of text (a smoke run).
    """
    start = time.time()
    seeds = [0] if quick else list(seeds)
    chosen = {n: SETTINGS[n] for n in (settings or SETTINGS)}
    steps = QUICK_STEPS if quick else steps
    evals = 1 if quick else EVALS
    jobs = [(n, k, s) for n in chosen for k in SHAPES for s in seeds]
    data: dict[str, dict[str, list[dict[str, Any]]]] = {n: {k: [] for k in SHAPES} for n in chosen}
    for name, kind, seed in progress(jobs, NAME, total=len(jobs), enabled=show_progress):
        setting = chosen[name]
        n_steps = steps or setting.steps
        run_dir = Path(out_dir) / "runs" / name / f"{kind}-s{seed}"
        r = train_run(run_dir, model_table(setting, SHAPES[kind]),
                      data=data_table(setting, QUICK_CHARS if quick else 0),
                      optim={"lr": setting.lr, "warmup_steps": max(1, n_steps // 10)},
                      train_cfg={"steps": n_steps, "batch_size": setting.batch_size,
                                 "eval_every": max(1, n_steps // evals),
                                 "eval_batches": 1 if quick else EVAL_BATCHES},
                      seed=seed)
        data[name][kind].append({k: v for k, v in r.items() if k not in ("train_curve", "diag")})
    out: dict[str, Any] = {}
    for name, setting in chosen.items():
        models = {}
        for kind, shape in SHAPES.items():
            mt, runs = model_table(setting, shape), data[name][kind]
            models[kind] = {"shape": shape.label, **mt, "params": param_count(mt),
                            "non_embedding_params": non_embedding_count(mt),
                            "final_val_loss": seed_stats(r["final_val_loss"] for r in runs),
                            "final_val_acc": seed_stats(r["final_val_acc"] for r in runs),
                            "diverged": sum(r["diverged"] for r in runs),
                            "wall_s": round(sum(r["wall_s"] for r in runs), 1)}
        deep, wide = models["deep-thin"], models["shallow-wide"]
        out[name] = {"steps": steps or setting.steps, "batch_size": setting.batch_size, "lr": setting.lr,
                     "params_ratio_total": deep["params"] / wide["params"],
                     "params_ratio_non_embedding": deep["non_embedding_params"] / wide["non_embedding_params"],
                     "models": models, **compare(models)}
    wins = {n: s["deep_wins"] for n, s in out.items()}
    reason = (f"deep-thin wins (Δ = shallow − deep final val loss > combined s.e.) in {sum(wins.values())}/"
              f"{len(wins)} settings: " + "; ".join(f"{n} Δ = {s['loss_gap_shallow_minus_deep']:+.3f} ± "
                                                    f"{s['combined_se']:.3f}" for n, s in out.items()) + ".")
    summary = {"verdict": verdict(wins), "verdict_reason": reason, "seeds": seeds, "settings": out,
               "wall_s": round(time.time() - start, 1)}
    return data, summary


def run(out_dir: str | Path, quick: bool = False, seeds: Iterable[int] = (0, 1, 2),
        settings: Iterable[str] | None = None, steps: int | None = None, show_progress: bool = True
        ) -> dict[str, Any]:
    """`measure` → `markdown` (with `table`) + `plot`, written as deep-thin.{json,png,md} into ``out_dir``;
    returns the summary. Arguments as for `measure`."""
    data, summary = measure(out_dir, quick, seeds, settings, steps, show_progress)
    return write_outputs(out_dir, NAME, data, summary, markdown(summary), plot(data, summary))
