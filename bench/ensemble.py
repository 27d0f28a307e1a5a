"""Gaussian-equivalent and Gram samplers vs explicit-weight ensembles of shaped Transformers.

Shaped block (attention + shaped-ReLU MLP), width 256, depth 256, m = 16 tokens, 1000 samples.
The explicit-weight sampler is timed on a subset of samples at full depth and scaled per sample
(it draws 5 n×n matrices per layer and sample); the same-law check is a two-sample KS test on the
final correlation ρ^{01} and variance V^{00}. Achieved GFLOP/s counts the matmuls only
(gaussian: 8 products of 2m²n flops per layer and sample; weights: 5 projections of 2mn² plus
3 of 2m²n) against the measured torch.matmul peak of 2048² matrices.

    python bench/ensemble.py [--width 256] [--depth 256] [--tokens 16] [--samples 1000] [--weights-samples 16]
                             [--threads N]
"""
from __future__ import annotations

import argparse
import functools
import os
import time

import torch
from scipy.stats import ks_2samp

from sigprop.simulate import ensemble


def matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` GFLOP/s of a size×size matmul."""
    a = torch.randn(size, size, dtype=dtype)
    a @ a
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--weights-samples", type=int, default=16)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n, L, m, S, Sw = a.width, a.depth, a.tokens, a.samples, a.weights_samples
    V0 = 0.7 * torch.eye(m, dtype=torch.float64) + 0.3
    kw = dict(block="shaped", V0=V0, width=n, depth=L, gamma=0.3)
    print(f"threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    peak = {dt: matmul_peak(dt) for dt in (torch.float64, torch.float32)}
    for method, dtype in [("gaussian", torch.float64), ("gaussian", torch.float32), ("gram", torch.float64),
                          ("weights", torch.float64)]:
        ensemble.simulate(**(kw | dict(depth=2)), samples=2, method=method, dtype=dtype)  # warm-up

    # matmul flops per sample (not counted for gram, whose work is mostly O(m³) products)
    flops = {"gaussian": 16 * m * m * n * L, "weights": (10 * m * n * n + 6 * m * m * n) * L}
    runs = [("gaussian", torch.float64, S), ("gaussian", torch.float32, S), ("gram", torch.float64, S),
            ("gram", torch.float32, S), ("weights", torch.float64, Sw)]
    rows, finals = [], {}
    for method, dtype, samples in runs:
        V, t = timed(functools.partial(ensemble.simulate, samples=samples, seed=len(rows), method=method, dtype=dtype,
                                       **kw))
        finals.setdefault(method, V[:, -1].double())
        rows.append((method, dtype, samples, t, flops[method] * samples / t / 1e9 if method in flops else None))
    print(f"load average after: {os.getloadavg()}\n")

    print(f"shaped transformer, width {n}, depth {L}, m {m}")
    print(f"{'method':10s} {'dtype':14s} {'samples':>7s} {'seconds':>9s} {'s/sample':>9s} {'GFLOP/s':>8s} "
          f"{'% peak':>7s} {'speed-up':>9s}")
    per_w = rows[-1][3] / Sw
    for method, dtype, samples, t, gf in rows:
        rate = f"{gf:8.2f} {100 * gf / peak[dtype]:6.1f}%" if gf is not None else f"{'-':>8s} {'-':>7s}"
        speedup = per_w / (t / samples)
        print(f"{method:10s} {str(dtype):14s} {samples:7d} {t:9.2f} {t / samples:9.4f} {rate} {speedup:8.1f}x")
    print(f"\nweights sampler extrapolated to {S} samples: {per_w * S:.0f} s (speed-up = per-sample time ratio)")
    print(f"matmul peak: float64 {peak[torch.float64]:.1f} GFLOP/s, float32 {peak[torch.float32]:.1f} GFLOP/s")

    def corr(V: torch.Tensor) -> torch.Tensor:
        return V[:, 0, 1] / (V[:, 0, 0] * V[:, 1, 1]).sqrt()

    w = finals["weights"]
    for method in ("gaussian", "gram"):
        g = finals[method]
        print(f"same law as weights (KS, {S} vs {Sw} samples), {method}: correlation p = "
              f"{ks_2samp(corr(g), corr(w)).pvalue:.3f}, variance p = {ks_2samp(g[:, 0, 0], w[:, 0, 0]).pvalue:.3f}")


if __name__ == "__main__":
    main()
