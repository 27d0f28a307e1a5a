"""A DSLM ViT's first attention branch against its map as the patch fan-in C·p² shrinks below the width.

    OMP_NUM_THREADS=1 python bench/vit_fan_in.py              # 4 configs × 256 networks, ~1 min

The knob test's DSLM ViT (Pre-LN, width 64, 4 heads, 3 blocks, 8×8 images, patch 2, 1 channel; 4 N(0, 1) images
per network, network s seeded with s; tests/test_predict_knobs.py) at patch fan-in C·p² = 4, then 3 channels (12),
patch 4 (16) and 3 channels with patch 4 (48). The patch tokens W_p·patch lie in a C·p²-dimensional subspace, so two
tokens' cosine spreads as in C·p² dimensions rather than d: the mean squared cosine of two different input tokens,
against 1/d for isotropic tokens of the same correlation (0); then the first attention branch's output (after its
output projection, before the residual weight): its variance and token correlation (ensemble covariance over
ensemble variance) measured and as the maps give them (`sigprop.theory.moments.attention`, which takes isotropic
tokens), and the token correlation at the last record, measured and predicted.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from sigprop.console import progress
from sigprop.diagnostics import measure
from sigprop.diagnostics.commands import DiagnoseConfig, random_batch
from sigprop.models import ModelConfig, build_model, predict
from sigprop.models.predict import model_chain
from sigprop.theory.moments import Moments, serial

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_predict_knobs import BASE, VIT_DSLM  # noqa: E402

NETWORKS = 256
CASES = {"fan-in 4": {}, "fan-in 12": dict(in_channels=3), "fan-in 16": dict(patch_size=4),
         "fan-in 48": dict(in_channels=3, patch_size=4)}


def config(change: dict) -> ModelConfig:
    fields = {k: v for k, v in {**BASE, **VIT_DSLM, **change}.items() if k not in ("vocab_size", "max_seq_len")}
    return ModelConfig(**fields)


def row(name: str, cfg: ModelConfig) -> str:
    labels, chain = model_chain(cfg)
    states = serial(*chain).trace(Moments(0.0, 1.0, 0.0))
    i = labels.index((1, "attn"))
    branch = chain[i].branch.trace(states[i])[-1]
    last_pred = predict(cfg)[-1].token_corr
    cos2, f_var, f_cov, last = [], [], [], []
    for seed in progress(range(NETWORKS), name):
        torch.manual_seed(seed)
        model = build_model(cfg).double()
        keep: dict[str, torch.Tensor] = {}
        site = model.stack.blocks[0].attn
        site.register_forward_pre_hook(lambda module, args, keep=keep: keep.update(x=args[0].detach()))
        site.fn.register_forward_hook(lambda module, args, out, keep=keep: keep.update(f=out.detach()))
        batch = random_batch(cfg, DiagnoseConfig(seq_len=16, batch=4, seed=seed))
        last.append(measure(model, batch, seed=seed, attention_stats=False)[-1].token_corr)
        x = keep["x"] / keep["x"].norm(dim=-1, keepdim=True)
        cos = x @ x.transpose(-1, -2)
        off = ~torch.eye(cos.shape[-1], dtype=torch.bool)
        cos2.append(float((cos[:, off] ** 2).mean()))
        f = keep["f"]
        gram = f @ f.transpose(-1, -2) / f.shape[-1]
        f_var.append(float(gram.diagonal(dim1=-2, dim2=-1).mean()))
        f_cov.append(float(gram[:, off].mean()))
    v, c = np.mean(f_var), np.mean(f_cov)
    return (f"| {name} | {np.mean(cos2):.4f} | {1 / cfg.d_model:.4f} | {v:.3f} | {branch.var:.3f} "
            f"({branch.var / v - 1:+.1%}) | {c / v:.3f} | {branch.corr:.3f} | {np.mean(last):.3f} | {last_pred:.3f} |")


def main() -> None:
    torch.set_num_threads(1)
    print("| DSLM ViT | input tokens' mean cos² | 1/d | first attention branch: variance | map | token corr | map "
          "| last record's token corr | predicted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, change in CASES.items():
        print(row(name, config(change)), flush=True)


if __name__ == "__main__":
    main()
