"""DeepScaleLM's deep-thin claim at CPU scale: 4× deeper, ½ as wide (equal block weights ∝ L·d², totals within 10 %,
tested), six settings, each shape at its own lr. Rule: `sigprop.experiments.verdicts.deep_thin`."""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np

from ..models.build import non_embedding_count
from ..train.schedules import default_warmup
from ..train.seed_stats import mean_curve, seed_stats
from . import verdicts
from .claim import FINAL, LR, Claim, Model, by_group, group_cell, lr_panel, scored, stat_text, tuned

VOCAB, SEQ_LEN = 288, 64                 # byte-level BPE needs ≥ 260 tokens; a small table keeps ≤ 10 % apart


class Setting(NamedTuple):
    """One setting of a pair: its task and the training both shapes share."""
    arch: str                            # decoder | encoder | encdec | vit
    norm_placement: str                  # DSLM LayerNorm placement: pre | post
    lrs: tuple[float, ...]               # lr grid each shape is tuned on
    steps: int                           # optimizer steps of both models
    batch_size: int                      # examples per step


Shape = tuple[int, int, int]             # n_layers, d_model, n_heads: head width 16 in both shapes
SHAPES: dict[str, Shape] = {"deep-thin": (8, 32, 2), "shallow-wide": (2, 64, 4)}
TEXT_LRS, VIT_LRS = (3e-3, 1e-2, 3e-2), (1e-3, 3e-3, 1e-2)
SETTINGS = {**{f"{arch}-{norm}ln": Setting(arch, norm, TEXT_LRS, steps, 16)          # causal and masked LM on pydoc
               for arch, steps in (("decoder", 2000), ("encoder", 600)) for norm in ("pre", "post")},
            "vit": Setting("vit", "pre", VIT_LRS, 300, 64),                              # 8×8 digits
            "encdec": Setting("encdec", "pre", TEXT_LRS, 400, 16)}                       # span denoising of pydoc
# steps 0: each setting's own; middle_lr: only the middle lr of each grid; evals: validation points per run
FULL = {"settings": tuple(SETTINGS), "steps": 0, "seeds": (0, 1), "max_chars": 0, "eval_batches": 8, "evals": 20,
        "middle_lr": False}
QUICK = {"steps": 8, "max_chars": 60_000, "eval_batches": 1, "evals": 1, "middle_lr": True}


def model_table(setting: Setting, shape: Shape) -> dict[str, Any]:
    """The ModelConfig fields of one model of a pair."""
    return {"arch": setting.arch, "scheme": "dslm", "norm_placement": setting.norm_placement,
            **dict(zip(("n_layers", "d_model", "n_heads"), shape)),
            **({} if setting.arch == "vit" else {"vocab_size": VOCAB, "max_seq_len": SEQ_LEN})}


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
    return [Model(f"{name}/{kind}", f"{name} {kind} {label}", run_config(st, shape, s),
                  st.lrs[1:2] if s["middle_lr"] else st.lrs, group=name, unigram=st.arch != "vit",
                  attrs={**model_table(st, shape), "setting": name, "kind": kind, "shape": label,
                         "steps": s["steps"] or st.steps, "batch_size": st.batch_size,
                         "non_embedding_params": non_embedding_count(model_table(st, shape))})
            for name in s["settings"] for st in [SETTINGS[name]] for kind, shape in SHAPES.items()
            for label in [f"{shape[0]}L×{shape[1]}d"]]


def pairs(summary: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """setting → {"deep-thin": tuned model, "shallow-wide": tuned model}."""
    return {g: {e["attrs"]["kind"]: tuned(e) for e in es} for g, es in by_group(summary).items()}


def derive(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per setting: Δ, its s.e., the win (`verdicts.deep_thin_gap`), parameter ratios, shallow-wide's unigram level."""
    out = {}
    for name, pair in pairs(summary).items():
        deep, wide = (summary["models"][f"{name}/{k}"] for k in SHAPES)
        u, ne = scored(wide)["unigram"], "non_embedding_params"
        out[name] = {**verdicts.deep_thin_gap(pair), "params_ratio_total": deep["params"] / wide["params"],
                     "params_ratio_non_embedding": deep["attrs"][ne] / wide["attrs"][ne],
                     "unigram_val_loss": seed_stats(u) if u and None not in u else None}
    return out


def gap_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """Per setting Δ = shallow − deep seed-mean validation loss against the fraction of training done."""
    for i, name in enumerate(summary["results"]):
        deep, wide = (mean_curve([r["val_curve"] for r in data[f"{name}/{k}"] if r["role"] == "scored"
                                  and not r["diverged"]]) for k in SHAPES)
        n = min(len(deep["step"]), len(wide["step"]))
        ax.plot(np.divide(deep["step"][:n], max(deep["step"][:n], default=1)),
                np.subtract(wide["mean"][:n], deep["mean"][:n]), color=f"C{i}", label=name)
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="fraction of training", ylabel="Δ val loss (shallow − deep)", title="deep-thin ahead above 0")


CLAIM = Claim(
    name="deep-thin", title="deeper-thinner beats shallow-wide at equal parameters",
    claim=("(DeepScaleLM, Kedia et al. 2024): deep models with fewer parameters outperform shallow ones across "
           "encoder-only, decoder-only and encoder-decoder models and image classification, for both Pre-LN and "
           "Post-LN."),
    full=FULL, quick=QUICK, choices={"settings": SETTINGS}, models=models, derive=derive,
    rule=lambda s: verdicts.deep_thin(pairs(s)),
    setup=("Scheme DSLM in both models of a pair (d_ff = 4d, head width 16). Text: embedded pydoc corpus, byte-level "
           f"BPE vocab {VOCAB}, seq {SEQ_LEN}; ViT: sklearn 8×8 digits, patch 2, 20 % validation. AdamW, warmup 10 % "
           "of steps, cosine decay to 0.1·lr, grad clip 1; each shape at its own lr, chosen on tuning seed {t} (not "
           "scored). Scored seeds {s[seeds]}. Δ = shallow − deep seed-mean final loss; wins if Δ > combined s.e."),
    table=[("setting", group_cell(lambda n, g: n)), ("unigram loss (no context)", group_cell(
               lambda n, g: f"{g['unigram_val_loss']['mean']:.3f}" if g["unigram_val_loss"] else "—")),
           ("model, steps × batch", lambda e, b, s: "{kind} {shape}, {steps} × {batch_size}".format(**e["attrs"])), LR,
           ("params total / non-emb", lambda e, b, s: f"{e['params']:,} / {e['attrs']['non_embedding_params']:,}"),
           FINAL, ("val acc", lambda e, b, s: stat_text(b["final_val_acc"])),
           ("Δ ± s.e. (deep wins)", group_cell(lambda n, g: f"{g['gap']:+.3f} ± {g['se']:.3f} "
                                                       + ("(yes)" if g["deep_wins"] else "(no)")))],
    plot=[lr_panel, gap_panel])


__all__ = ["CLAIM", "SETTINGS", "SHAPES", "model_table", "run_config"]
