"""`predict` on causal decoders with the forward traced per pair of positions, and without, against measurement.

    OMP_NUM_THREADS=1 python bench/pair_forward.py                  # both sizes, ~4 min
    OMP_NUM_THREADS=1 python bench/pair_forward.py --size knob      # width 64/128, 3 blocks, 16 tokens only

Causal rows give early positions more alike than late ones, so the next attention's row i averages a prefix
whose correlation exceeds the stack's mean (`sigprop.theory.moments.causal`, "Forward covariance per pair of
positions"). This prints, per config, the median over sublayers of |predicted/measured − 1| for the forward
and gradient variance and |predicted − measured| for the token correlation, with the forward traced per pair
(`pair_forward`, what `predict` does) and with the per-position variances alone (`position_fwd`, pairs=False).
Measured: `sigprop.diagnostics.measure`, float64, random token ids (token_collision = 1/vocab), the mean over
independently initialized networks, one batch each; "s.e." is the median relative standard error of the
measured variances' means.
"""
from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from sigprop.diagnostics import measure
from sigprop.diagnostics.commands import DiagnoseConfig, random_batch
from sigprop.models import ModelConfig, build_model
from sigprop.models.predict import _records, model_chain
from sigprop.theory.moments import Moments, serial
from sigprop.theory.moments.causal import position_trace

KNOB = dict(arch="decoder", vocab_size=64, d_model=64, n_heads=4, n_layers=3, max_seq_len=16)
DEEP = dict(arch="decoder", vocab_size=256, d_model=128, n_heads=4, n_layers=48, max_seq_len=64)
SIZES = {
    "knob": [(KNOB, dict(scheme="vanilla")), (KNOB, dict(scheme="preln")), (KNOB, dict(scheme="preln", d_model=128)),
             (KNOB, dict(scheme="gpt2")), (KNOB, dict(scheme="dslm"))],
    "deep": [(DEEP, dict(scheme="preln")), (DEEP, dict(scheme="dslm", norm_placement="pre")),
             (DEEP, dict(scheme="gpt2"))],
}
NETWORKS = {"knob": (128, 4), "deep": (96, 1)}                      # networks, sequences per batch


def predicted(cfg: ModelConfig, pairs: bool) -> np.ndarray:
    """(points, 3) predicted forward variance, gradient variance and token correlation, as `predict` traces a
    decoder, with the forward per pair of positions or not."""
    L, collision = cfg.max_seq_len, 1 / cfg.vocab_size
    labels, chain = model_chain(build_model(cfg, device="meta"), L, collision)
    m = Moments(0.0, 1.0, 0.0)
    states = position_trace(chain, serial(*chain).trace(m), m, L, pairs=pairs)
    return np.array([(r.fwd_var, r.grad_var, r.token_corr) for r in _records(labels, states, "dec")])


def measured(cfg: ModelConfig, networks: int, batch: int) -> np.ndarray:
    """(networks, points, 3) measured forward variance, gradient variance and token correlation."""
    rows = []
    for seed in range(networks):
        torch.manual_seed(seed)
        inputs = random_batch(cfg, DiagnoseConfig(seq_len=cfg.max_seq_len, batch=batch, seed=seed))
        records = measure(build_model(cfg).double(), inputs, seed=seed, attention_stats=False, stable_ranks=False)
        rows.append([(r.fwd_var, r.grad_var, r.token_corr) for r in records])
    return np.array(rows)


def errors(pred: np.ndarray, data: np.ndarray) -> tuple[float, float, float]:
    """Median over points of the relative error of the two variances and the absolute error of the correlation."""
    mean = data.mean(0)
    relative = np.median(np.abs(pred[:, :2] / mean[:, :2] - 1), axis=0)
    return float(relative[0]), float(relative[1]), float(np.median(np.abs(pred[:, 2] - mean[:, 2])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("knob", "deep", "both"), default="both")
    args = ap.parse_args()
    print("| config | networks | per pair: fwd / grad / corr | per position: fwd / grad / corr | s.e. fwd / grad |")
    print("|---|---|---|---|---|")
    for size in (("knob", "deep") if args.size == "both" else (args.size,)):
        networks, batch = NETWORKS[size]
        for base, change in SIZES[size]:
            cfg = ModelConfig(**{**base, **change})
            data = measured(cfg, networks, batch)
            se = np.median(data.std(0, ddof=1) / np.abs(data.mean(0)), axis=0) / math.sqrt(networks)
            new, old = (errors(predicted(cfg, pairs), data) for pairs in (True, False))
            name = f"{cfg.scheme} d{cfg.d_model} {cfg.n_layers}×{cfg.max_seq_len}"
            print(f"| {name} | {networks} | {new[0]:.1%} / {new[1]:.1%} / {new[2]:.3f} | "
                  f"{old[0]:.1%} / {old[1]:.1%} / {old[2]:.3f} | {se[0]:.1%} / {se[1]:.1%} |", flush=True)


if __name__ == "__main__":
    main()
