"""The standard Post-LN gradient: `sigprop.models.predict` against the mean of many networks (docs/moments.md §6, the
standard depth-48 Post-LN row).

The per-network gradient of a rank-collapsed Post-LN stack is heavy-tailed (log-std ≈ 1.5), so the 48 networks of
tests/test_predict.py leave a 17% standard error on the mean. Size as tests/test_predict.py (width 128, 4 heads, depth
48, seq 64, vocab 256, uniform random tokens, float64, one sequence per network, network s seeded with s): the median
relative error of the per-sublayer gradient variance, its median Monte-Carlo standard error, the per-network log-std
at the embedding and the error every 10 sublayers. The test measures 200 networks (a few minutes); the 1000-network
rows of docs/moments.md (about 20 minutes each on two shared cores):

    cd tests && OMP_NUM_THREADS=1 python -c "from test_postln_gradient import table; print(table(1000, start=0))"
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sigprop.diagnostics import measure
from sigprop.models import ModelConfig, build_model, predict

pytestmark = pytest.mark.slow


def config(arch: str) -> ModelConfig:
    return ModelConfig(arch=arch, scheme="postln", d_model=128, n_heads=4, n_layers=48, max_seq_len=64,
                       vocab_size=256)


def errors(networks: int, start: int = 0, arch: str = "decoder") -> dict:
    """Over networks ``start`` … ``start + networks − 1``: the relative error of the prediction per sublayer
    (``err``, embedding first), the relative standard error of the measured means (``se``) and the per-network
    log-std of the embedding's gradient."""
    cfg = config(arch)
    grads = []
    for seed in range(start, start + networks):
        torch.manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (1, cfg.max_seq_len))
        grads.append([r.grad_var for r in measure(build_model(cfg).double(), ids, seed=seed, attention_stats=False)])
    g = np.array(grads)                                                                 # (networks, points)
    mean = g.mean(0)
    pred = np.array([r.grad_var for r in predict(cfg, token_collision=1 / cfg.vocab_size)])
    return {"err": pred / mean - 1, "se": g.std(0, ddof=1) / np.sqrt(len(g)) / mean,
            "log_std": float(np.std(np.log(g[:, 0])))}


def table(networks: int, start: int = 0, arch: str = "decoder") -> str:
    return row(networks, start, arch, errors(networks, start, arch))


def row(networks: int, start: int, arch: str, e: dict) -> str:
    """The table of `errors` ``e``, one row."""
    return ("| arch, networks (seeds) | median error | median MC s.e. | per-network log-std | error every 10 "
            "sublayers, embedding first |\n|---|---|---|---|---|\n"
            f"| {arch}, {networks} ({start}–{start + networks - 1}) | {np.median(np.abs(e['err'])):.1%} | "
            f"{np.median(e['se']):.1%} | {e['log_std']:.2f} | "
            + " ".join(f"{x:+.0%}" for x in e["err"][::10]) + " |")


def test_the_collapsed_postln_decoder_gradient_is_within_its_monte_carlo_error():
    """200 networks: the median error within 2 median standard errors (measured 13.5% at an s.e. of 9.5%). The
    mean of so heavy-tailed a gradient lies below its expectation in most draws of 200 networks, most at the bottom
    of the stack (the embedding +46% here), so the per-sublayer errors are not held to their s.e.; 1000 networks
    give 2.1% (seeds 0-999) and 3.0% (1000-1999), every tenth sublayer within 9%."""
    e = errors(200)
    print(row(200, 0, "decoder", e))
    assert np.median(np.abs(e["err"])) < 2 * np.median(e["se"]), e
