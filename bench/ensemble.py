"""Row-space (gaussian) vs full-weight ensembles of shaped Transformers built from sigprop's modules.

Shaped block (shaped attention + shaped-ReLU MLP), width 256, depth 256, m = 16 tokens, 1000 samples.
The full-weight sampler is timed on a subset of samples at full depth and scaled per sample (it draws
5 n×n matrices per layer and sample, the row-space sampler 5 n×m); the same-law check is a two-sample KS
test on the final correlation ρ^{01} and variance V^{00}. Wall and process CPU seconds are both given
(the CPU time is the steadier figure on a shared machine).

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


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


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
    for method, dtype in [("gaussian", torch.float64), ("gaussian", torch.float32), ("weights", torch.float64)]:
        ensemble.simulate(**(kw | dict(depth=2)), samples=2, method=method, dtype=dtype)  # warm-up

    runs = [("gaussian", torch.float64, S), ("gaussian", torch.float32, S), ("weights", torch.float64, Sw)]
    rows, finals = [], {}
    for method, dtype, samples in runs:
        V, wall, cpu = timed(functools.partial(ensemble.simulate, samples=samples, seed=len(rows), method=method,
                                               dtype=dtype, **kw))
        finals.setdefault(method, V[:, -1].double())
        rows.append((method, dtype, samples, wall, cpu))
    print(f"load average after: {os.getloadavg()}\n")

    print(f"shaped transformer, width {n}, depth {L}, m {m}")
    print(f"{'method':10s} {'dtype':14s} {'samples':>7s} {'wall s':>8s} {'cpu s':>8s} {'cpu s/sample':>12s} "
          f"{'speed-up':>9s}")
    per_w = rows[-1][4] / Sw
    for method, dtype, samples, wall, cpu in rows:
        print(f"{method:10s} {str(dtype):14s} {samples:7d} {wall:8.2f} {cpu:8.2f} {cpu / samples:12.4f} "
              f"{per_w / (cpu / samples):8.1f}x")
    print(f"\nweights sampler extrapolated to {S} samples: {per_w * S:.0f} CPU s (speed-up = per-sample CPU ratio)")

    def corr(V: torch.Tensor) -> torch.Tensor:
        return V[:, 0, 1] / (V[:, 0, 0] * V[:, 1, 1]).sqrt()

    g, w = finals["gaussian"], finals["weights"]
    print(f"same law as weights (KS, {S} vs {Sw} samples), gaussian: correlation p = "
          f"{ks_2samp(corr(g), corr(w)).pvalue:.3f}, variance p = {ks_2samp(g[:, 0, 0], w[:, 0, 0]).pvalue:.3f}")


if __name__ == "__main__":
    main()
