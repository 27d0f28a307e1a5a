"""DeepScaleLM's depth claim at CPU scale: a deeper-thinner DSLM model beats a shallow-wide one with
equal (or fewer) parameters.

Claim (Kedia et al., ICML 2024, abstract): "our deep models with fewer parameters outperform shallow
models in Language Modeling, Speech Translation, and Image Classification, across encoder-only,
decoder-only and encoder-decoder variants, for both Pre-LN and Post-LN transformers".

Six settings, each a pair of scheme-"dslm" models trained with the same data, steps, batch and lr
schedule shape (`SETTINGS`): decoder causal LM (Pre-LN, Post-LN; 2000 steps), encoder masked LM
(Pre-LN, Post-LN) on the embedded "pydoc" corpus, a ViT on scikit-learn's 8×8 digits, and an
encoder-decoder on span denoising of "pydoc". Each shape of a pair gets its own peak lr
(`sigprop.experiments.tuning`): chosen on tuning seed `TUNING_SEED` (not scored) from the setting's grid,
extended past an edge that holds the optimum; scored on seeds 0, 1 at that lr.

Shapes (`SHAPES`): shallow-wide = 2 blocks × width 64, deep-thin = 8 blocks × width 32, d_ff = 4d,
head width 16: four times deeper and half as wide, which keeps the block weights (∝ L·d²) equal.
Parameter matching: the block weight matrices (12·L·d², 16·L·d² for encdec decoder blocks) are equal,
so the non-embedding count (everything outside the model's ``embed`` module) differs only by the extra
LayerNorm gains of the deeper stack (+0.5 %); the total count, which includes the tied token/position
tables, is lower for deep-thin because its tables are half as wide. With vocab 288 the tables are a
small share: deep-thin has 9 % (decoder, encoder), 4 % (encdec) and 0.6 % (ViT) fewer total
parameters, i.e. ≤ and within 10 % (the constraint we enforce and test); with a large vocab the tables
would dominate the total count. Both counts are reported.

Verdict rule: `sigprop.experiments.verdicts.deep_thin` (per setting, deep-thin *wins* if its seed-mean
final validation loss is lower than shallow-wide's by more than the combined standard error; reproduced if
it wins in all six, partly if in some; inconclusive if a chosen lr is still at its grid's edge). The
figure plots the gap Δ(step) = shallow − deep seed-mean validation loss over training.

    from sigprop.experiments import deep_thin
    summary = deep_thin.run("runs/deep-thin")                 # deep-thin.json / .png / .md
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from . import verdicts
from .outputs import WallClock, write_outputs
from .report import Table
from .training import finished, mean_curve, meta_model, param_count, seed_stats, trainable, unigram_by_seed
from .tuning import MAX_EXTEND, TUNING_SEED, lr_summary, numbers, tune_all

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
    lrs: tuple[float, ...]               # lr grid each shape is tuned on
    steps: int                           # optimizer steps of both models
    batch_size: int                      # examples per step


SHAPES = {"deep-thin": Shape(8, 32, 2), "shallow-wide": Shape(2, 64, 4)}
TEXT_LRS, VIT_LRS = (3e-3, 1e-2, 3e-2), (1e-3, 3e-3, 1e-2)
SETTINGS = {
    "decoder-preln": Setting("decoder", "preln", TEXT_LRS, 2000, 16),
    "decoder-postln": Setting("decoder", "postln", TEXT_LRS, 2000, 16),
    "encoder-preln": Setting("encoder", "preln", TEXT_LRS, 600, 16),
    "encoder-postln": Setting("encoder", "postln", TEXT_LRS, 600, 16),
    "vit": Setting("vit", "preln", VIT_LRS, 300, 64),
    "encdec": Setting("encdec", "preln", TEXT_LRS, 400, 16),
}
SEEDS = (0, 1)
EVALS = 20                               # validation points per run (besides step 0)
QUICK_STEPS, QUICK_CHARS = 8, 60_000     # quick: one seed, one lr, 8 steps, a slice of the corpus, one small eval


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


def _fmt(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def run_tables(setting: Setting, shape: Shape, steps: int, quick: bool) -> dict[str, Any]:
    """Run-config sections of one model of a pair: 10 % warmup, cosine decay to 0.1·lr, clip 1."""
    evals = 1 if quick else EVALS
    return {"model": model_table(setting, shape), "data": data_table(setting, QUICK_CHARS if quick else 0),
            "optim": {"warmup_steps": max(1, steps // 10)},
            "train": {"steps": steps, "batch_size": setting.batch_size, "eval_every": max(1, steps // evals),
                      "eval_batches": 1 if quick else EVAL_BATCHES, "diag_every": 0}}


def table(summary: dict[str, Any]) -> Table:
    """One row per model of each pair (its own lr); the pair's loss gap and winner on its first row."""
    rows = []
    for name, s in summary["settings"].items():
        unigram = s.get("unigram_val_loss")
        for i, (kind, m) in enumerate(s["models"].items()):
            first = [name, f"{unigram['mean']:.3f}" if unigram else "—"] if i == 0 else ["", ""]
            gap = ([f"{s['gap']:+.3f} ± {s['se']:.3f}", "yes" if s["deep_wins"] else "no"] if i == 0 else ["", ""])
            rows.append([*first, f"{kind} {m['shape']}", f"{s['steps']}, {s['batch_size']}",
                         lr_summary(m), f"{m['params']:,} / {m['non_embedding_params']:,}",
                         _fmt(m["final_val_loss"]), _fmt(m["final_val_acc"]), *gap])
    return Table(["setting", "unigram loss", "model", "steps, batch", "lr (tuning seed)", "params total / non-emb",
                  "final val loss", "val acc", "Δ ± s.e.", "deep wins"], rows)


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
             "the same steps and batch within a pair, each shape at its own lr, chosen on tuning seed "
             f"{summary['tuning_seed']} (not scored). Scored seeds {summary['seeds']}. Parameters: non-embedding "
             "block weights equal (deep-thin +0.5 % LayerNorm gains), total fewer for deep-thin (halved "
             "embedding tables). Δ = shallow − deep seed-mean final loss; wins if Δ > combined s.e. Unigram loss: "
             "the seed-mean validation loss of token frequencies without context (text settings).", "",
             table(summary).markdown()]
    lines += ["", f"**Verdict: {summary['verdict']}.** {summary['verdict_reason']}", ""]
    return "\n".join(lines)


def gap_curve(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Δ(step) = shallow − deep seed-mean validation loss, with its min/max band from the seeds' extremes."""
    deep, wide = (mean_curve(finished(runs[k], "val_curve")) for k in ("deep-thin", "shallow-wide"))
    n = min(len(deep["step"]), len(wide["step"]))
    return {"step": deep["step"][:n], "gap": [w - d for w, d in zip(wide["mean"][:n], deep["mean"][:n])],
            "low": [w - d for w, d in zip(wide["min"][:n], deep["max"][:n])],
            "high": [w - d for w, d in zip(wide["max"][:n], deep["min"][:n])]}


def plot(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """One panel per setting: the loss gap Δ(step) = shallow − deep seed-mean validation loss (band: seed
    extremes; above 0 deep-thin is ahead), and a chart of the final losses (mean ± std over seeds)."""
    names = list(data)
    fig = plt.figure(figsize=(16, 7))
    grid = fig.add_gridspec(2, 4)
    colors = {"deep-thin": "C0", "shallow-wide": "C3"}
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid[i // 4, i % 4])
        c = gap_curve(data[name])
        if c["step"]:
            ax.plot(c["step"], c["gap"], color="k")
            ax.fill_between(c["step"], c["low"], c["high"], color="grey", alpha=0.25)
        ax.axhline(0, color="grey", lw=0.8, ls=":")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("Δ val loss (shallow − deep)")
    ax = fig.add_subplot(grid[1, 2:])
    x = np.arange(len(names))
    for j, kind in enumerate(SHAPES):
        stats = [summary["settings"][n]["models"][kind]["final_val_loss"] for n in names]
        ax.bar(x + (j - 0.5) * 0.38, [s["mean"] for s in stats], 0.38, yerr=[s["std"] for s in stats],
               color=colors[kind], label=kind, capsize=3)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("final val loss (mean ± std)")
    ax.legend(fontsize=7)
    fig.suptitle(f"DSLM deep-thin vs shallow-wide, each at its own lr: verdict {summary['verdict']}")
    return fig


def measure(out_dir: str | Path, quick: bool = False, seeds: Iterable[int] = SEEDS,
            settings: Iterable[str] | None = None, steps: int | None = None, jobs: int = 2,
            max_extend: int = MAX_EXTEND, show_progress: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tune and score both shapes of every setting (runs in ``out_dir/sweeps``); return (data: every scored run
    per setting and shape, summary: per-setting numbers and the verdict).

    ``settings``: a subset of `SETTINGS` names; ``steps`` overrides every setting's step count;
    ``quick``: one seed, the middle lr of each grid, no extension, `QUICK_STEPS` steps, `QUICK_CHARS` of
    text, in this process (a smoke run).
    """
    clock = WallClock(out_dir, NAME)
    seeds = [0] if quick else list(seeds)
    unknown = sorted(set(settings or ()) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; valid: {sorted(SETTINGS)}")
    chosen = {n: SETTINGS[n] for n in (settings or SETTINGS)}
    jobs, max_extend = (1, 0) if quick else (jobs, max_extend)
    n_steps = {n: QUICK_STEPS if quick else steps or st.steps for n, st in chosen.items()}
    grids = {n: st.lrs[1:2] if quick else st.lrs for n, st in chosen.items()}
    tuned = tune_all(Path(out_dir) / "sweeps",
                     {f"{n}/{k}": (run_tables(st, shape, n_steps[n], quick), grids[n])
                      for n, st in chosen.items() for k, shape in SHAPES.items()},
                     seeds, jobs, max_extend, desc=NAME, show_progress=show_progress)
    data = {n: {k: [{key: v for key, v in r.items() if key in RUN_KEYS} for r in tuned[f"{n}/{k}"]["runs"]]
                for k in SHAPES} for n in chosen}
    out: dict[str, Any] = {}
    for name, setting in chosen.items():
        models = {}
        for kind, shape in SHAPES.items():
            mt, t = model_table(setting, shape), tuned[f"{name}/{kind}"]
            models[kind] = {"shape": shape.label, **mt, "params": param_count(mt),
                            "non_embedding_params": non_embedding_count(mt), **numbers(t),
                            "final_val_loss": seed_stats(t["final_loss"]),
                            "final_val_acc": seed_stats(r["final_val_acc"] for r in t["runs"]),
                            "diverged": sum(r["diverged"] for r in t["runs"]),
                            "wall_s": round(sum(r["wall_s"] for r in t["tuning_runs"] + t["runs"]), 1)}
        deep, wide = models["deep-thin"], models["shallow-wide"]
        unigram = unigram_by_seed(tuned[f"{name}/shallow-wide"]["runs"]) if setting.arch != "vit" else {}
        out[name] = {"steps": n_steps[name], "batch_size": setting.batch_size,
                     "unigram_val_loss": seed_stats(unigram[k] for k in sorted(unigram)) if unigram else None,
                     "params_ratio_total": deep["params"] / wide["params"],
                     "params_ratio_non_embedding": deep["non_embedding_params"] / wide["non_embedding_params"],
                     "models": models, **verdicts.deep_thin_gap(models),
                     "gap_curve": gap_curve(data[name])}
    summary = {"seeds": seeds, "tuning_seed": TUNING_SEED, "settings": out, "wall_s": clock.seconds()}
    name, reason = judge(summary)
    return data, {"verdict": name, "verdict_reason": reason, **summary}


RUN_KEYS = ("seed", "lr", "final_val_loss", "final_val_acc", "initial_val_loss", "best_val_loss", "val_curve",
            "diverged", "error", "steps_done", "wall_s")


def judge(summary: dict[str, Any]) -> tuple[str, str]:
    """(verdict, reason): `verdicts.deep_thin` on a summary's numbers (as saved in deep-thin.json)."""
    return verdicts.deep_thin({n: s["models"] for n, s in summary["settings"].items()})


def run(out_dir: str | Path, quick: bool = False, seeds: Iterable[int] = SEEDS,
        settings: Iterable[str] | None = None, steps: int | None = None, jobs: int = 2,
        max_extend: int = MAX_EXTEND, show_progress: bool = True) -> dict[str, Any]:
    """`measure` → `markdown` (with `table`) + `plot`, written as deep-thin.{json,png,md} into ``out_dir``;
    returns the summary. Arguments as for `measure`."""
    data, summary = measure(out_dir, quick, seeds, settings, steps, jobs, max_extend, show_progress)
    return write_outputs(out_dir, NAME, data, summary, markdown(summary), plot(data, summary))
