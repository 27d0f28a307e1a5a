"""How far each Pre-LN norm's E[1/|u|²] sits above the χ² law the norm map takes, per position.

    OMP_NUM_THREADS=1 python bench/norm_dispersion.py                      # the knob test's decoder and encoder
    OMP_NUM_THREADS=1 python bench/norm_dispersion.py --d-model 128 --networks 64

A norm's backward gain is (k − 1)E[1/|u|²] (u the centred token it reads, k = d − 1), which
`sigprop.theory.moments.norm.LayerNorm` takes from i.i.d. Gaussian coordinates: E[1/|u|²]·E|u|² = k/(k − 2).
An attention output is Gaussian only given its row's weights and W_V W_O, a scale mixture whose per-token
squared norm spreads beyond the χ² law, so the norms that read it pass more gradient than their map says.
This prints, at the input of every sublayer (its norm's input) of a freshly initialized Pre-LN model, the
measured E[1/|u|²]·E|u|² over k/(k − 2), for the first and last positions and the mean over positions (the mean
over networks and sequences, float64, uniform random tokens), and what the maps carry for it, 1 + R − 2/k with
R = `sigprop.theory.moments.state.norm_dispersion` of the exchangeable state there (`state`, `norm` docstrings;
within a position: a causal position's own variance is carried apart, per position).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from sigprop.diagnostics.commands import DiagnoseConfig, random_batch
from sigprop.models import ModelConfig, build_model
from sigprop.models.predict import model_chain
from sigprop.nn.block import Sublayer
from sigprop.theory.moments import Moments, serial
from sigprop.theory.moments.residual import Residual
from sigprop.theory.moments.state import norm_dispersion


def dispersion(cfg: ModelConfig, networks: int, batch: int = 8) -> np.ndarray:
    """(sublayers, positions): E[1/|u|²]·E|u|² / (k/(k − 2)) at each sublayer's input, u the centred token."""
    inverse: dict[int, list[np.ndarray]] = {}
    square: dict[int, list[np.ndarray]] = {}
    for seed in range(networks):
        torch.manual_seed(seed)
        model = build_model(cfg).double()
        inputs = random_batch(cfg, DiagnoseConfig(seq_len=cfg.max_seq_len, batch=batch, seed=seed))
        for i, sub in enumerate(m for m in model.modules() if isinstance(m, Sublayer)):
            def hook(module: Sublayer, args: tuple, i: int = i) -> None:
                u = args[0] - args[0].mean(-1, keepdim=True)
                n2 = (u ** 2).sum(-1)                                                  # (B, T)
                inverse.setdefault(i, []).append((1 / n2).mean(0).numpy())
                square.setdefault(i, []).append(n2.mean(0).numpy())
            sub.register_forward_pre_hook(hook)
        with torch.no_grad():
            model(inputs)
    k = cfg.d_model - 1
    return np.array([np.mean(inverse[i], 0) * np.mean(square[i], 0) for i in sorted(inverse)]) / (k / (k - 2))


def predicted(cfg: ModelConfig) -> list[float]:
    """1 + R − 2/k at each sublayer's input, R the maps' norm dispersion there (uniform random tokens)."""
    _, chain = model_chain(build_model(cfg, device="meta"), cfg.max_seq_len, 1 / cfg.vocab_size)
    states = serial(*chain).trace(Moments(0.0, 1.0, 0.0))
    k = cfg.d_model - 1
    return [1 + norm_dispersion(m, cfg.d_model) - 2 / k for c, m in zip(chain, states) if isinstance(c, Residual)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--networks", type=int, default=64)
    args = ap.parse_args()
    print("| model | sublayer input | position 1 | last position | mean over positions | predicted |\n"
          "|---|---|---|---|---|---|")
    for arch in ("decoder", "encoder"):
        cfg = ModelConfig(arch=arch, scheme="preln", vocab_size=500, d_model=args.d_model, n_heads=4, n_layers=3,
                          max_seq_len=16)
        names = [f"block {b + 1} {s}" for b in range(cfg.n_layers) for s in ("attn", "mlp")]
        for name, row, pred in zip(names, dispersion(cfg, args.networks), predicted(cfg)):
            print(f"| {arch} d{cfg.d_model} | {name} | {row[0]:.3f} | {row[-1]:.3f} | {row.mean():.3f} | {pred:.3f} |")


if __name__ == "__main__":
    main()
