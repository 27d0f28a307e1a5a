"""Standard Post-LN gradient: `sigprop.models.predict` against the mean of many networks (too slow for the tests).

The per-network gradient of a rank-collapsed Post-LN stack is heavy-tailed (log-std ≈ 1.2–1.4), so the
48 networks of tests/test_predict.py leave a 17% standard error on the mean; this measures hundreds.
Size as tests/test_predict.py (width 128, 4 heads, depth 48, seq 64, vocab 256, uniform random tokens,
float64, one sequence per network, network s seeded with s); prints the median relative error of the
per-sublayer gradient variance, its Monte-Carlo standard error, and the error every 10 sublayers.

    OMP_NUM_THREADS=1 python bench/postln_gradient.py [--arch decoder|encoder] [--networks 1000] [--start 0]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from sigprop.console import progress
from sigprop.diagnostics import measure
from sigprop.models import ModelConfig, build_model, predict


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=("decoder", "encoder"), default="decoder")
    p.add_argument("--networks", type=int, default=1000)
    p.add_argument("--start", type=int, default=0, help="first network seed")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = ModelConfig(arch=args.arch, scheme="postln", d_model=128, n_heads=4, n_layers=48, max_seq_len=64,
                      vocab_size=256)
    grads = []
    for seed in progress(range(args.start, args.start + args.networks), "networks"):
        torch.manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (1, cfg.max_seq_len))
        grads.append([r.grad_var for r in measure(build_model(cfg).double(), ids, seed=seed, attention_stats=False)])
    g = np.array(grads)
    mean, se = g.mean(0), g.std(0, ddof=1) / np.sqrt(len(g))
    err = np.array([r.grad_var for r in predict(cfg, token_collision=1 / cfg.vocab_size)]) / mean - 1
    print(f"{args.arch} Post-LN, {len(g)} networks (seeds {args.start}..{args.start + len(g) - 1}): median |error| "
          f"{np.median(np.abs(err)):.1%}, median Monte-Carlo s.e. {np.median(se / mean):.1%}, per-network log-std "
          f"{np.std(np.log(g[:, 0])):.2f}")
    print("error every 10 sublayers (embedding first):", " ".join(f"{e:+.0%}" for e in err[::10]))


if __name__ == "__main__":
    main()
