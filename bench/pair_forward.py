"""`predict` on causal decoders with the forward traced per pair of positions, and without, against measurement.

    OMP_NUM_THREADS=1 python bench/pair_forward.py                  # every size, ~7 min
    OMP_NUM_THREADS=1 python bench/pair_forward.py --size knob      # width 64/128, 3 blocks, 16 tokens only

Causal rows give early positions more alike than late ones, so the next attention's row i averages a prefix
whose correlation exceeds the stack's mean (`sigprop.theory.moments.causal`, "Forward covariance per pair of
positions"). This prints, per config, the median over sublayers of |predicted/measured − 1| for the forward
and gradient variance and |predicted − measured| for the token correlation, with the forward traced per pair
(`pair_forward`, what `predict` does) and with the per-position variances alone (`position_fwd`, pairs=False),
and "pos": the largest |predicted/measured − 1| of the per-position forward variance over the positions and
sublayers. Measured: `sigprop.diagnostics.measure` and hooks on the sublayers, float64, random token ids
(token_collision = 1/vocab), the mean over independently initialized networks, one batch each; "s.e." is the
median relative standard error of the measured variances' means. Size "length": DSLM decoders whose V/O gains
are made for 32 or 64 positions (``max_seq_len``), measured on 32.
"""
from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from sigprop.diagnostics import measure
from sigprop.diagnostics.commands import DiagnoseConfig, random_batch
from sigprop.models import ModelConfig, build_model
from sigprop.models.predict import model_chain, to_records
from sigprop.theory.moments import Moments, serial
from sigprop.theory.moments.causal import position_forward, position_trace

KNOB = dict(arch="decoder", vocab_size=64, d_model=64, n_heads=4, n_layers=3, max_seq_len=16)
DEEP = dict(arch="decoder", vocab_size=256, d_model=128, n_heads=4, n_layers=48, max_seq_len=64)
LENGTH = dict(KNOB, max_seq_len=32, scheme="dslm", activation="gelu")
SIZES = {                                                           # (base, change, tokens measured; None: max_seq_len)
    "knob": [(KNOB, dict(scheme="vanilla"), None), (KNOB, dict(scheme="preln"), None),
             (KNOB, dict(scheme="preln", d_model=128), None), (KNOB, dict(scheme="gpt2"), None),
             (KNOB, dict(scheme="dslm"), None), (KNOB, dict(scheme="postln"), None),
             (KNOB, dict(scheme="dslm", norm_placement="post"), None), (KNOB, dict(scheme="admin"), None)],
    "deep": [(DEEP, dict(scheme="preln"), None), (DEEP, dict(scheme="dslm", norm_placement="pre"), None),
             (DEEP, dict(scheme="gpt2"), None), (DEEP, dict(scheme="postln"), None),
             (DEEP, dict(scheme="dslm", norm_placement="post"), None)],
    "length": [(LENGTH, {}, 32), (LENGTH, dict(max_seq_len=64), 32)],
}
NETWORKS = {"knob": (128, 4), "deep": (96, 1), "length": (64, 8)}    # networks, sequences per batch


def predicted(cfg: ModelConfig, L: int, pairs: bool) -> tuple[np.ndarray, np.ndarray]:
    """((points, 3) predicted forward variance, gradient variance and token correlation, as `predict` traces a
    decoder over L tokens, with the forward per pair of positions or not; (sublayers, L) per-position forward
    variance at each sublayer output)."""
    labels, chain = model_chain(build_model(cfg, device="meta"), L, 1 / cfg.vocab_size)
    m = Moments(0.0, 1.0, 0.0)
    exchangeable = serial(*chain).trace(m)
    states = position_trace(chain, exchangeable, m, L, pairs=pairs)
    per = position_forward(chain, exchangeable, L, pairs)[1]
    sublayers = [per[i + 1] for i, lab in enumerate(labels) if lab is not None and lab[1] != "embed"]
    return (np.array([(r.fwd_var, r.grad_var, r.token_corr) for r in to_records(labels, states, "dec")]),
            np.array(sublayers))


def measured(cfg: ModelConfig, L: int, networks: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """((networks, points, 3) measured forward variance, gradient variance and token correlation; (networks,
    sublayers, L) per-position second moment of each sublayer output, averaged over features and sequences)."""
    rows, positions = [], []
    for seed in range(networks):
        torch.manual_seed(seed)
        inputs = random_batch(cfg, DiagnoseConfig(seq_len=L, batch=batch, seed=seed))
        model = build_model(cfg).double()
        outputs: list[torch.Tensor] = []
        for block in model.stack.blocks:
            for sub in (block.attn, block.mlp):
                sub.register_forward_hook(lambda mod, i, o, outputs=outputs: outputs.append(o.detach()))
        records = measure(model, inputs, seed=seed, attention_stats=False, stable_ranks=False)
        rows.append([(r.fwd_var, r.grad_var, r.token_corr) for r in records])
        positions.append([(o ** 2).mean((0, 2)).numpy() for o in outputs[:2 * cfg.n_layers]])
    return np.array(rows), np.array(positions)


def errors(pred: np.ndarray, data: np.ndarray) -> tuple[float, float, float]:
    """Median over points of the relative error of the two variances and the absolute error of the correlation."""
    mean = data.mean(0)
    relative = np.median(np.abs(pred[:, :2] / mean[:, :2] - 1), axis=0)
    return float(relative[0]), float(relative[1]), float(np.median(np.abs(pred[:, 2] - mean[:, 2])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=(*SIZES, "all"), default="all")
    args = ap.parse_args()
    print("| config | tokens | networks | per pair: fwd / grad / corr / pos | per position: fwd / grad / corr / pos "
          "| s.e. fwd / grad |")
    print("|---|---|---|---|---|---|")
    for size in (SIZES if args.size == "all" else (args.size,)):
        networks, batch = NETWORKS[size]
        for base, change, tokens in SIZES[size]:
            cfg = ModelConfig(**{**base, **change})
            L = tokens or cfg.max_seq_len
            data, positions = measured(cfg, L, networks, batch)
            se = np.median(data.std(0, ddof=1) / np.abs(data.mean(0)), axis=0) / math.sqrt(networks)
            cells = []
            for pairs in (True, False):
                pred, per = predicted(cfg, L, pairs)
                fwd, grad, corr = errors(pred, data)
                cells.append(f"{fwd:.1%} / {grad:.1%} / {corr:.3f} / {np.abs(per / positions.mean(0) - 1).max():.1%}")
            scheme = f"{cfg.scheme} {cfg.norm_placement}" if cfg.scheme == "dslm" else cfg.scheme
            name = f"{scheme} d{cfg.d_model} {cfg.n_layers} layers, made for {cfg.max_seq_len}"
            print(f"| {name} | {L} | {networks} | {cells[0]} | {cells[1]} | {se[0]:.1%} / {se[1]:.1%} |", flush=True)


if __name__ == "__main__":
    main()
