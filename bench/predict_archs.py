"""`predict` on the encoder–decoder and the ViT against measurement: the table of docs/moments.md.

    OMP_NUM_THREADS=1 python bench/predict_archs.py             # 5 configs × 256 networks, ~40 s

The configs, networks and inputs of tests/test_predict_archs.py (width 64, 4 (+4) layers, seq 16; ViT 16×16×3,
patch 4; float64; network s seeded with s, its input drawn after the seed as `sigprop diagnose` draws it): per
config the median over sublayers of |predicted/measured − 1| of the forward and the gradient variance, each with
the median relative Monte-Carlo standard error of the measured mean.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from sigprop.diagnostics import measure
from sigprop.models import build_model, predict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_predict_archs import SEEDS, config, model_input  # noqa: E402

CASES = [("encdec", "preln"), ("encdec", "postln"), ("encdec", "dslm-preln"), ("vit", "postln"), ("vit", "dslm-preln")]


def main() -> None:
    print("| arch | config | fwd: median error (s.e.) | grad: median error (s.e.) |\n|---|---|---|---|")
    for arch, name in CASES:
        cfg = config(arch, name)
        runs = []
        for seed in range(SEEDS[arch]):
            torch.manual_seed(seed)
            runs.append(measure(build_model(cfg).double(), model_input(cfg), seed=seed, attention_stats=False))
        pred = predict(cfg, token_collision=1 / cfg.vocab_size)
        cells = []
        for field in ("fwd_var", "grad_var"):
            samples = np.array([[getattr(r, field) for r in rs] for rs in runs])
            mean = samples.mean(0)
            err = np.median(np.abs(np.array([getattr(r, field) for r in pred]) / mean - 1))
            se = np.median(samples.std(0, ddof=1) / np.abs(mean)) / np.sqrt(len(samples))
            cells.append(f"{err:.1%} ({se:.1%})")
        print(f"| {arch} | {name} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
