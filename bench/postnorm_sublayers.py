"""One Post-LN sublayer against Monte Carlo, beyond the tests: the radial constraint across widths, and the
weight of the coherent value-path correction across token correlations (`theory/moments/postnorm.py`).

    OMP_NUM_THREADS=2 python bench/postnorm_sublayers.py [--samples 12000]      # ~8 min on 2 cores

Part 1, y = LN(x + f(x)) on LayerNorm-ed tokens, f a ReLU FFN with the postln scheme's init (d_ff = 4d);
upstream gradient ⊥ {1, y}: measured E|g_x|²/d against `PostNormResidual.bwd` with and without the FFN's
corrections (radial factor and hidden |h|² fluctuation).
Part 2, bidirectional attention (d 64, 4 heads, 16 tokens) on tokens of correlation r, upstream gradient
correlation 0.5: gradient variance and covariance against `PostNormResidual.bwd` with the weighted coherent
correction and without it. float64, fresh weights per sample, fixed seeds; ± is one standard error.
"""
from __future__ import annotations

import argparse
import math

import torch

import sigprop.theory.moments.postnorm as postnorm
from sigprop.theory.moments import Attention, Dropout, Moments, PostNormResidual, ReLU, ffn_block, serial

DT = torch.float64


def ln(t: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(t, (t.shape[-1],))


def upstream(y: torch.Tensor, rg: float, gen: torch.Generator) -> torch.Tensor:
    """Unit per-feature gradient at y, token correlation ``rg``, projected ⊥ {1, y_i} per token."""
    n, L, d = y.shape
    g = (rg ** 0.5 * torch.randn(n, 1, d, generator=gen, dtype=DT)
         + (1 - rg) ** 0.5 * torch.randn(n, L, d, generator=gen, dtype=DT))
    yd = y.detach()
    g = g - g.mean(-1, keepdim=True)
    return (g - (g * yd).sum(-1, keepdim=True) * yd / (yd * yd).sum(-1, keepdim=True)) * math.sqrt(d / (d - 2))


def moments_of(gx: torch.Tensor) -> tuple[float, float, float, float]:
    """Per-feature gradient variance and covariance between tokens, and their standard errors (over samples)."""
    L = gx.shape[1]
    var = (gx ** 2).mean((1, 2))
    cov = (gx.sum(1) ** 2 - (gx ** 2).sum(1)).mean(-1) / max(L * (L - 1), 1)
    n = len(gx)
    return var.mean().item(), var.std().item() / math.sqrt(n), cov.mean().item(), cov.std().item() / math.sqrt(n)


def switched_off(names: dict, fn):
    """``fn()`` with the `postnorm` functions in ``names`` replaced (the uncorrected map)."""
    saved = {k: getattr(postnorm, k) for k in names}
    for k, v in names.items():
        setattr(postnorm, k, v)
    try:
        return fn()
    finally:
        for k, v in saved.items():
            setattr(postnorm, k, v)


def ffn_token(d: int, n: int, gen: torch.Generator) -> tuple[float, float, float, float]:
    """Part 1: (measured, s.e., predicted, predicted without the FFN corrections) gradient variance."""
    d_ff, w = 4 * d, 2 / (5 * d)
    x = ln(torch.randn(n, 1, d, generator=gen, dtype=DT)).requires_grad_(True)
    w1 = torch.randn(n, d, d_ff, generator=gen, dtype=DT) * w ** 0.5
    w2 = torch.randn(n, d_ff, d, generator=gen, dtype=DT) * w ** 0.5
    y = ln(x + torch.relu(x @ w1) @ w2)
    (y * upstream(y, 0.0, gen)).sum().backward()
    var, se, _, _ = moments_of(x.grad)
    post, unit = PostNormResidual(1.0, 1.0, ffn_block(d, d_ff, w, w, ReLU()), d), Moments(0.0, 1.0, 0.0, 1.0, 0.0)
    off = {"homogeneous_kurtosis": lambda branch: None, "hidden_fluctuation": lambda *a: (0.0, 0.0, 0.0)}
    return var, se, post.bwd(unit, unit).grad_var, switched_off(off, lambda: post.bwd(unit, unit).grad_var)


def collapsed_attention(r: float, n: int, gen: torch.Generator) -> tuple[tuple, Moments, Moments]:
    """Part 2: measured moments, and the prediction with and without the coherent correction."""
    d, h, L = 64, 4, 16
    dk, qv, ov = d // h, 2 / (d + d // h), 1 / d
    x = ln(r ** 0.5 * torch.randn(n, 1, d, generator=gen, dtype=DT)
           + (1 - r) ** 0.5 * torch.randn(n, L, d, generator=gen, dtype=DT)).requires_grad_(True)
    wq, wk, wv = (torch.randn(n, d, d, generator=gen, dtype=DT) * qv ** 0.5 for _ in range(3))
    wo = torch.randn(n, d, d, generator=gen, dtype=DT) * ov ** 0.5
    split = lambda t: t.view(n, L, h, dk).transpose(1, 2)
    a = torch.softmax(split(x @ wq) @ split(x @ wk).transpose(-1, -2) / dk ** 0.5, -1)
    y = ln(x + (a @ split(x @ wv)).transpose(1, 2).reshape(n, L, d) @ wo)
    (y * upstream(y, 0.5, gen)).sum().backward()
    xd = x.detach()
    m = Moments(0.0, 1.0, float(torch.nn.functional.cosine_similarity(xd[:, 0], xd[:, 1], -1).mean()))
    post = PostNormResidual(1.0, 1.0, serial(Attention(d, h, L, qv, qv, qv, ov), Dropout(0.0)), d)
    g = Moments(0.0, 1.0, 0.0, 1.0, 0.5)
    return moments_of(x.grad), post.bwd(m, g), switched_off({"coherent_attention": lambda b: None},
                                                             lambda: post.bwd(m, g))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=12000)
    n = p.parse_args().samples
    gen = torch.Generator().manual_seed(0)
    print("| FFN, d | with the corrections | without | MC s.e. |\n|---|---|---|---|")
    for d in (32, 64, 128):
        var, se, pred, plain = ffn_token(d, n // 4 if d == 128 else n // 2, gen)
        print(f"| {d} | {pred / var - 1:+.2%} | {plain / var - 1:+.2%} | {se / var:.2%} |")
    print("\n| token corr r | grad var: with / without | grad cov: with / without | MC s.e. var, cov |"
          "\n|---|---|---|---|")
    for r in (0.99, 0.95, 0.9):
        (var, vse, cov, cse), w, wo = collapsed_attention(r, n, gen)
        print(f"| {r} | {w.grad_var / var - 1:+.2%} / {wo.grad_var / var - 1:+.2%} | "
              f"{w.grad_cov / cov - 1:+.2%} / {wo.grad_cov / cov - 1:+.2%} | {vse / var:.2%}, {cse / cov:.2%} |")


if __name__ == "__main__":
    main()
