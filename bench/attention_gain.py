"""DeepScaleLM's finite-length attention gain: three closed forms against Monte Carlo of a real layer.

G = E[o²]/(d²σ_v²σ_o²σ²) for o = Softmax(x W_q (x W_k)ᵀ/√d_k) x W_v W_o (multi-head, Q, K, V, O ~ N(0, 1/d)),
tokens x_j of unit variance with token correlation r. DSLM's V/O init divides by G, so its error is the
attention branch's variance error. Models compared:

  lognormal   r + (1−r)·mean_i min(1, e^{1−r}/n_i)             (log-normal Σ_j a_ij²)
  ratio       r + (1−r)·mean_i e^{v}/(e^{v} + n_i − 1), v = 1−r (ratio of expectations)
  exact       `sigprop.theory.moments.Attention` forward map (Gaussian-logit softmax functionals,
              finite width d, d_k); `sigprop.theory.moments.attention.attention_gain` is its row part

    python bench/attention_gain.py [--draws 300] [--d 64] [--heads 4]
"""
from __future__ import annotations

import argparse
import math

import torch

from sigprop.theory.moments import Attention, Moments

LENGTHS = (16, 32, 128)
CORRS = (0.0, 0.1, 0.3, 0.6)


def lognormal(r: float, n: list[int]) -> float:
    return r + (1 - r) * sum(min(1.0, math.exp(1 - r) / m) for m in n) / len(n)


def ratio(r: float, n: list[int]) -> float:
    v = 1 - r
    return r + (1 - r) * sum(math.exp(v) / (math.exp(v) + m - 1) for m in n) / len(n)


def exact(r: float, L: int, causal: bool, d: int, heads: int) -> float:
    return Attention(d, heads, L, 1 / d, 1 / d, 1 / d, 1 / d, causal=causal).fwd(Moments(0.0, 1.0, r)).var


@torch.no_grad()
def monte_carlo(r: float, L: int, causal: bool, d: int, heads: int, draws: int, seed: int = 0) -> tuple[float, float]:
    """(mean, standard error) of the output variance over ``draws`` networks, 8 sequences each (float64)."""
    g = torch.Generator().manual_seed(seed)
    dk, b = d // heads, 8
    mask = torch.ones(L, L, dtype=torch.bool).tril() if causal else None
    per = []
    for _ in range(draws):
        shared = torch.randn(b, 1, d, generator=g, dtype=torch.float64)
        x = math.sqrt(r) * shared + math.sqrt(1 - r) * torch.randn(b, L, d, generator=g, dtype=torch.float64)
        wq, wk, wv, wo = (torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d) for _ in range(4))
        q, k, v = ((x @ w).view(b, L, heads, dk).transpose(1, 2) for w in (wq, wk, wv))   # (b, H, L, dk)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        o = y.transpose(1, 2).reshape(b, L, d) @ wo
        per.append(o.pow(2).mean().item())
    t = torch.tensor(per)
    return t.mean().item(), t.std().item() / math.sqrt(draws)


def rows(draws: int, d: int, heads: int) -> list[dict]:
    out = []
    for causal in (True, False):
        for L in LENGTHS:
            n = list(range(1, L + 1)) if causal else [L]
            for r in CORRS:
                mc, se = monte_carlo(r, L, causal, d, heads, draws)
                out.append(dict(causal=causal, L=L, r=r, mc=mc, se=se, lognormal=lognormal(r, n), ratio=ratio(r, n),
                                exact=exact(r, L, causal, d, heads)))
    return out


def table(rs: list[dict]) -> str:
    lines = ["| causal | L | r | Monte Carlo (± s.e.) | lognormal | ratio | exact |", "|---|---|---|---|---|---|---|"]
    worst = {k: 0.0 for k in ("lognormal", "ratio", "exact")}
    for row in rs:
        cells = []
        for k in worst:
            err = row[k] / row["mc"] - 1
            worst[k] = max(worst[k], abs(err))
            cells.append(f"{row[k]:.4f} ({100 * err:+.1f}%)")
        lines.append(f"| {row['causal']} | {row['L']} | {row['r']} | {row['mc']:.4f} ± {row['se']:.4f} | "
                     + " | ".join(cells) + " |")
    lines.append("| | | | worst relative error | " + " | ".join(f"{100 * w:.1f}%" for w in worst.values()) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    a = parser.parse_args()
    print(f"d = {a.d}, {a.heads} heads, {a.draws} networks × 8 sequences per row, float64")
    print(table(rows(a.draws, a.d, a.heads)))
