"""DeepScaleLM's signal-propagation figures at CPU scale: Pre-LN and Post-LN, standard init vs DSLM,
measured per sublayer at init and overlaid with `sigprop.models.predict`.

Claims checked (Kedia et al., ICML 2024, §3): standard Pre-LN forward variance grows
linearly with depth; standard Post-LN gradients grow geometrically toward the output; with DSLM the
forward variance and the stream-gradient variance (relative to the output) stay near 1.

    from sigprop.experiments import dslm_moments
    summary = dslm_moments.run("runs/dslm_moments")            # JSON + PNGs + a Markdown section
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from ..console.overrides import resolve_sizes
from ..diagnostics import measure
from ..diagnostics.plot import records_figure
from ..models import ModelConfig, build_model, predict
from ..records import Record, to_rows
from .outputs import progress, write_figure, write_json, write_text
from .registry import Figures
from .report import Table

CONFIGS = {"Pre-LN standard": ("preln", None), "Pre-LN DSLM": ("dslm", "pre"),
           "Post-LN standard": ("postln", None), "Post-LN DSLM": ("dslm", "post")}
VOCAB, HEADS, BATCH = 256, 4, 1
FULL = {"depth": 192, "width": 128, "seq": 64, "seeds": 32}     # seeds: how many (0, 1, ...)
QUICK = {"depth": 4, "width": 32, "seq": 8, "seeds": 2}


def measure_seeds(cfg: ModelConfig, seeds: Iterable[int], batch: int = BATCH) -> dict[str, np.ndarray]:
    """Per-seed measured fwd_var, grad_var, token_corr, shape (seeds, sublayers): a fresh float64 model per
    seed (``torch.manual_seed(seed)``), uniform random token ids, the random-projection loss."""
    rows = []
    for seed in seeds:
        torch.manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len))
        rows.append(measure(build_model(cfg).double(), ids, seed=seed, attention_stats=False))
    return {f: np.array([[getattr(r, f) for r in rs] for rs in rows])
            for f in ("fwd_mean", "fwd_var", "grad_var", "token_corr")}


def mean_records(template: list[Record], samples: dict[str, np.ndarray]) -> list[Record]:
    """``template``'s labels with the seed-mean of each sampled field."""
    means = {f: s.mean(0) for f, s in samples.items()}
    return [dataclasses.replace(r, source="measured", **{f: float(v[i]) for f, v in means.items()})
            for i, r in enumerate(template)]


def _range(v: np.ndarray) -> list[float]:
    """[min, max] over the sublayer outputs (the embedding, index 0, excluded)."""
    return [float(v[1:].min()), float(v[1:].max())]


def _fit(y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope and R² of y against 1..len(y)."""
    x = np.arange(1, len(y) + 1)
    slope, icpt = np.polyfit(x, y, 1)
    return float(slope), float(1 - np.sum((y - slope * x - icpt) ** 2) / np.sum((y - y.mean()) ** 2))


def summarize(pred: list[Record], samples: dict[str, np.ndarray]) -> dict[str, Any]:
    """Ranges, median relative errors (and their Monte-Carlo standard error), and the papers' depth laws."""
    n = len(samples["fwd_var"])
    out: dict[str, Any] = {"seeds": n}
    for field in ("fwd_var", "grad_var"):
        m, p = samples[field].mean(0), np.array([getattr(r, field) for r in pred])
        rel = field == "grad_var"                             # gradients relative to the model output
        out[field] = {"measured_range": _range(m / m[-1] if rel else m),
                      "predicted_range": _range(p / p[-1] if rel else p),
                      "median_rel_error": float(np.median(np.abs(p / m - 1))),
                      "mc_rel_se": (float(np.median(samples[field].std(0, ddof=1) / m)) / math.sqrt(n)
                                    if n > 1 else None)}
    blocks = samples["fwd_var"].mean(0)[2::2]                 # end of each block (MLP outputs), layers 1..N
    out["fwd_linear_fit"] = dict(zip(("slope", "r2"), _fit(blocks)))
    top = samples["grad_var"].mean(0)[2::2][-3:]
    out["grad_growth_per_layer_top3"] = float(math.exp(np.polyfit(np.arange(3), np.log(top), 1)[0]))
    out["token_corr_last"] = {"measured": float(samples["token_corr"].mean(0)[-1]), "predicted": pred[-1].token_corr}
    return out


def _relative_grad(records: list[Record]) -> list[Record]:
    return [dataclasses.replace(r, grad_var=r.grad_var / records[-1].grad_var) for r in records]


def table(summary: dict[str, Any], meta: dict[str, Any]) -> Table:
    """One row per configuration: ranges measured (predicted), median errors, the depth laws."""
    rng = lambda d: (f"{d['measured_range'][0]:.3g}–{d['measured_range'][1]:.3g} "
                     f"({d['predicted_range'][0]:.3g}–{d['predicted_range'][1]:.3g})")
    rows = []
    for name, s in summary.items():
        f, g = s["fwd_var"], s["grad_var"]
        rows.append([name, rng(f), rng(g), f"{f['median_rel_error']:.1%} / {g['median_rel_error']:.1%} "
                     f"({f['mc_rel_se'] or 0:.1%} / {g['mc_rel_se'] or 0:.1%})",
                     f"{s['fwd_linear_fit']['slope']:.3g}, {s['fwd_linear_fit']['r2']:.3f}",
                     f"{s['grad_growth_per_layer_top3']:.2f}",
                     f"{s['token_corr_last']['measured']:.3f} ({s['token_corr_last']['predicted']:.3f})"])
    return Table(["config", "fwd var range", "grad/output range", "median err fwd / grad (MC s.e.)",
                  "Pre-LN fit slope, R²", "top-3 grad growth /layer", "token corr at top"], rows,
                 caption=f"Decoder, width {meta['width']}, depth {meta['depth']}, seq {meta['seq']}, {meta['seeds']} "
                         f"seeds × batch {BATCH}, uniform random tokens (vocab {VOCAB}), float64; gradient = "
                         "stream-gradient variance at each sublayer output relative to the model output. "
                         "Ranges: measured (predicted).")


def plot(curves: dict[str, tuple[list[Record], list[Record]]], meta: dict[str, Any]) -> dict[str, Any]:
    """One figure per LayerNorm placement ("preln", "postln"), measured and predicted curves of its configurations
    overlaid (gradients relative to the output)."""
    return {placement.lower().replace("-", ""): records_figure(
        {f"{name.split()[1]} {kind}": _relative_grad(recs) for name, (meas, pred) in curves.items()
         if name.startswith(placement) for kind, recs in (("measured", meas), ("predicted", pred))},
        title=f"{placement}, depth {meta['depth']}, width {meta['width']}: gradient relative to the output")
        for placement in ("Pre-LN", "Post-LN")}


def measure_all(depth: int, width: int, seq: int, seeds: list[int], show_progress: bool = True
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[list[Record], list[Record]]]]:
    """Measure and predict every configuration of `CONFIGS`: (summary per configuration, records as rows,
    curves as (measured seed-mean, predicted) Records)."""
    summary, records, curves = {}, {}, {}
    for name, (scheme, placement) in CONFIGS.items():
        cfg = ModelConfig(scheme=scheme, norm_placement=placement, d_model=width, n_heads=HEADS, n_layers=depth,
                          max_seq_len=seq, vocab_size=VOCAB)
        pred = predict(cfg, token_collision=1 / VOCAB)
        samples = measure_seeds(cfg, progress(seeds, f"dslm-moments: {name}", total=len(seeds), enabled=show_progress))
        meas = mean_records(pred, samples)
        summary[name] = summarize(pred, samples)
        records[name] = {"measured": to_rows(meas), "predicted": to_rows(pred)}
        curves[name] = (meas, pred)
    return summary, records, curves


def run(out_dir: str | Path, quick: bool = False, show_progress: bool = True, **sizes: Any) -> dict[str, Any]:
    """`measure_all` at the `FULL` sizes (``quick``: `QUICK`) with ``sizes`` laid over them → `table` + `plot`;
    writes results.json, the two PNGs and section.md into ``out_dir``; returns {"meta", "summary"}."""
    s, out, start = resolve_sizes(QUICK if quick else FULL, sizes), Path(out_dir), time.time()
    summary, records, curves = measure_all(s["depth"], s["width"], s["seq"], list(range(s["seeds"])), show_progress)
    meta = {**s, "batch": BATCH, "vocab": VOCAB, "arch": "decoder", "wall_s": round(time.time() - start, 1)}
    for key, fig in plot(curves, meta).items():
        write_figure(out / f"dslm_moments_{key}.png", fig)
    write_json(out / "results.json", {"meta": meta, "summary": summary, "records": records})
    write_text(out / "section.md", table(summary, meta).markdown())
    return {"meta": meta, "summary": summary}


FIGURES = Figures("dslm-moments", FULL, QUICK, lambda out, s, show: run(out, show_progress=show, **s))
