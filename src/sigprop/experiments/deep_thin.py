"""DeepScaleLM's depth claim at CPU scale: a deeper-thinner DSLM model beats a shallow-wide one with
equal (or fewer) parameters.

Claim (Kedia et al., ICML 2024, abstract): "our deep models with fewer parameters outperform shallow
models in Language Modeling, Speech Translation, and Image Classification, across encoder-only,
decoder-only and encoder-decoder variants, for both Pre-LN and Post-LN transformers".

Six settings, each a pair of scheme-"dslm" models trained with the same data, steps, batch and lr
schedule shape (`SETTINGS`): decoder causal LM (Pre-LN, Post-LN; 2000 steps), encoder masked LM
(Pre-LN, Post-LN) on the embedded "pydoc" corpus, a ViT on scikit-learn's 8×8 digits, and an
encoder-decoder on span denoising of "pydoc". Each shape of a pair gets its own peak lr, chosen on the
tuning seed from the setting's grid; scored on seeds 0, 1 at that lr.

Shapes (`SHAPES`): shallow-wide = 2 blocks × width 64, deep-thin = 8 blocks × width 32, d_ff = 4d, head
width 16: four times deeper and half as wide, which keeps the block weights (∝ L·d²) equal; the
non-embedding count differs only by the deeper stack's extra LayerNorm gains (+0.5 %), the total is lower
for deep-thin (its tied token/position tables are half as wide: 9 %, 4 % (encdec), 0.6 % (ViT) fewer at
vocab 288, i.e. ≤ and within 10 %, the constraint enforced and tested).

Verdict rule: `sigprop.experiments.verdicts.deep_thin` (per setting deep-thin *wins* if its seed-mean final
validation loss is lower than shallow-wide's by more than the combined standard error; reproduced if it
wins in all six, partly if in some).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..console import UserError
from ..train.schedules import default_warmup
from ..train.seed_stats import seed_stats
from . import verdicts
from .claim import Claim, Model, lr_text, stat_text, tuned
from .report import Table
from .training import mean_curve, meta_model, param_count, trainable
from .tuning import MAX_EXTEND, TUNING_SEED

VOCAB, SEQ_LEN = 288, 64                 # byte-level BPE needs ≥ 260 tokens; a small table keeps ≤ 10 % apart


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
    norm_placement: str                  # DSLM LayerNorm placement: pre | post
    lrs: tuple[float, ...]               # lr grid each shape is tuned on
    steps: int                           # optimizer steps of both models
    batch_size: int                      # examples per step


SHAPES = {"deep-thin": Shape(8, 32, 2), "shallow-wide": Shape(2, 64, 4)}
TEXT_LRS, VIT_LRS = (3e-3, 1e-2, 3e-2), (1e-3, 3e-3, 1e-2)
SETTINGS = {
    "decoder-preln": Setting("decoder", "pre", TEXT_LRS, 2000, 16),
    "decoder-postln": Setting("decoder", "post", TEXT_LRS, 2000, 16),
    "encoder-preln": Setting("encoder", "pre", TEXT_LRS, 600, 16),
    "encoder-postln": Setting("encoder", "post", TEXT_LRS, 600, 16),
    "vit": Setting("vit", "pre", VIT_LRS, 300, 64),
    "encdec": Setting("encdec", "pre", TEXT_LRS, 400, 16),
}
# steps 0: each setting's own; middle_lr: only the middle lr of each grid; evals: validation points per run
FULL = {"settings": tuple(SETTINGS), "steps": 0, "seeds": (0, 1), "tuning_seed": TUNING_SEED, "jobs": 2,
        "max_extend": MAX_EXTEND, "max_chars": 0, "eval_batches": 8, "evals": 20, "middle_lr": False}
QUICK = {**FULL, "steps": 8, "seeds": (0,), "jobs": 1, "max_extend": 0, "max_chars": 60_000, "eval_batches": 1,
         "evals": 1, "middle_lr": True}


def model_table(setting: Setting, shape: Shape) -> dict[str, Any]:
    """The ModelConfig fields of one model of a pair."""
    table = {"arch": setting.arch, "scheme": "dslm", "norm_placement": setting.norm_placement,
             "n_layers": shape.n_layers, "d_model": shape.d_model, "n_heads": shape.n_heads}
    if setting.arch != "vit":
        table.update(vocab_size=VOCAB, max_seq_len=SEQ_LEN)
    return table


def non_embedding_count(model: dict[str, Any]) -> int:
    """Trainable parameters outside the model's ``embed`` module (token/position tables, tied LM head;
    ViT patch projection, position table, class token)."""
    net = meta_model(model)
    return trainable(net) - trainable(net.embed)


def run_config(setting: Setting, shape: Shape, s: Mapping[str, Any]) -> dict[str, Any]:
    """Run-config sections of one model of a pair: 10 % warmup, cosine decay to 0.1·lr, clip 1; text is the
    first ``s["max_chars"]`` characters of "pydoc" (0: all), ViT the digits images."""
    steps = s["steps"] or setting.steps
    data = ({"source": "digits", "val_fraction": 0.2} if setting.arch == "vit" else
            {"source": "pydoc", "seq_len": SEQ_LEN, "max_chars": s["max_chars"]})
    return {"model": model_table(setting, shape), "data": data, "optim": {"warmup_steps": default_warmup(steps)},
            "train": {"steps": steps, "batch_size": setting.batch_size, "eval_every": max(1, steps // s["evals"]),
                      "eval_batches": s["eval_batches"], "diag_every": 0}}


def models(s: Mapping[str, Any]) -> list[Model]:
    """Both shapes of every chosen setting, grouped by setting, each tuned on the setting's grid."""
    unknown = sorted(set(s["settings"]) - set(SETTINGS))
    if unknown:
        raise UserError(f"unknown setting(s) {unknown}; valid: {sorted(SETTINGS)}")
    out = []
    for name in s["settings"]:
        st = SETTINGS[name]
        for kind, shape in SHAPES.items():
            mt = model_table(st, shape)
            out.append(Model(f"{name}/{kind}", f"{name} {kind} {shape.label}", run_config(st, shape, s),
                             st.lrs[1:2] if s["middle_lr"] else st.lrs, group=name, unigram=st.arch != "vit",
                             attrs={**mt, "setting": name, "kind": kind, "shape": shape.label,
                                    "steps": s["steps"] or st.steps, "batch_size": st.batch_size,
                                    "non_embedding_params": non_embedding_count(mt)}))
    return out


def pairs(summary: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """setting → {"deep-thin": tuned model, "shallow-wide": tuned model}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for e in summary["models"].values():
        out.setdefault(e["group"], {})[e["attrs"]["kind"]] = tuned(e)
    return out


def rule(summary: Mapping[str, Any]) -> tuple[str, str]:
    """`verdicts.deep_thin` on every setting's pair."""
    return verdicts.deep_thin(pairs(summary))


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per setting: the loss gap Δ, its s.e. and the win flag (`verdicts.deep_thin_gap`), the parameter ratios,
    the unigram level over shallow-wide's scored splits (None for images)."""
    m = summary["models"]
    out = {}
    for name, pair in pairs(summary).items():
        deep, wide = m[f"{name}/deep-thin"], m[f"{name}/shallow-wide"]
        u = wide["scored"][0]["unigram"] if wide["scored"] else []
        out[name] = {**verdicts.deep_thin_gap(pair), "params_ratio_total": deep["params"] / wide["params"],
                     "unigram_val_loss": seed_stats(u) if u and None not in u else None,
                     "params_ratio_non_embedding": deep["attrs"]["non_embedding_params"]
                     / wide["attrs"]["non_embedding_params"]}
    return out


def table(summary: Mapping[str, Any]) -> Table:
    """One row per model of each pair (its own lr); the pair's unigram level, loss gap and winner on its first row."""
    rows = []
    for e in summary["models"].values():
        g, b, first = summary["results"][e["group"]], e["scored"][0], e["attrs"]["kind"] == "deep-thin"
        u = g["unigram_val_loss"]
        rows.append([e["group"] if first else "", (f"{u['mean']:.3f}" if u else "—") if first else "",
                     f"{e['attrs']['kind']} {e['attrs']['shape']}", lr_text(e),
                     f"{e['params']:,} / {e['attrs']['non_embedding_params']:,}", stat_text(b["final_val_loss"]),
                     stat_text(b["final_val_acc"]), f"{g['gap']:+.3f} ± {g['se']:.3f}" if first else "",
                     ("yes" if g["deep_wins"] else "no") if first else ""])
    return Table(["setting", "unigram loss", "model", "lr (tuning seed)", "params total / non-emb", "final val loss",
                  "val acc", "Δ ± s.e.", "deep wins"], rows)


def setup(summary: Mapping[str, Any]) -> str:
    shapes = " vs ".join(f"{k} {s.label}" for k, s in SHAPES.items())
    steps = ", ".join(f"{n} {summary['sizes']['steps'] or SETTINGS[n].steps} steps × batch {SETTINGS[n].batch_size}"
                      for n in summary["sizes"]["settings"])
    return (f"Scheme DSLM in both models of a pair; {shapes} (d_ff = 4d, head width 16). Text: embedded pydoc "
            f"corpus, byte-level BPE vocab {VOCAB}, seq {SEQ_LEN}; ViT: sklearn 8×8 digits, patch 2, 20 % "
            f"validation. AdamW, warmup 10 % of steps, cosine decay to 0.1·lr, grad clip 1; {steps}; each shape at "
            f"its own lr, chosen on tuning seed {summary['tuning_seed']} (not scored). Scored seeds "
            f"{summary['seeds']}. Δ = shallow − deep seed-mean final loss; wins if Δ > combined s.e. Unigram "
            "loss: validation loss of token frequencies without context (text settings).")


def plot(summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """One panel per setting: Δ(step) = shallow − deep seed-mean validation loss of the scored runs (above 0
    deep-thin is ahead), and a chart of the final losses (mean ± std over seeds)."""
    names = list(summary["results"])
    fig = plt.figure(figsize=(16, 7))
    grid = fig.add_gridspec(2, 4)
    for i, name in enumerate(names[:6]):
        ax = fig.add_subplot(grid[i // 4, i % 4])
        deep, wide = (mean_curve([r["val_curve"] for r in data[f"{name}/{k}"] if r["role"] == "scored"
                                  and not r["diverged"]]) for k in SHAPES)
        n = min(len(deep["step"]), len(wide["step"]))
        if n:
            ax.plot(deep["step"][:n], np.subtract(wide["mean"][:n], deep["mean"][:n]), color="k")
        ax.axhline(0, color="grey", lw=0.8, ls=":")
        ax.set(title=name, xlabel="step", ylabel="Δ val loss (shallow − deep)")
    ax = fig.add_subplot(grid[1, 2:])
    x = np.arange(len(names))
    for j, (kind, color) in enumerate(zip(SHAPES, ("C0", "C3"))):
        stats = [summary["models"][f"{n}/{kind}"]["scored"][0]["final_val_loss"] for n in names]
        ax.bar(x + (j - 0.5) * 0.38, [s["mean"] for s in stats], 0.38, yerr=[s["std"] for s in stats],
               color=color, label=kind, capsize=3)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("final val loss (mean ± std)")
    ax.legend(fontsize=7)
    fig.suptitle(f"DSLM deep-thin vs shallow-wide, each at its own lr: verdict {summary['verdict']}")
    return fig


CLAIM = Claim(
    name="deep-thin", title="deeper-thinner beats shallow-wide at equal parameters",
    claim=("(DeepScaleLM, Kedia et al. 2024): deep models with fewer parameters outperform shallow ones across "
           "encoder-only, decoder-only and encoder-decoder models and image classification, for both Pre-LN and "
           "Post-LN."),
    full=FULL, quick=QUICK, models=models, rule=rule, setup=setup, table=table, plot=plot, derive=derive)


__all__ = ["CLAIM", "SETTINGS", "SHAPES", "model_table", "non_embedding_count", "param_count", "run_config"]
