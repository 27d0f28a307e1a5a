"""Moment statistics of activations, in the conventions of `sigprop.records.Record`.

x: (B, T, d) — batch, tokens, features.
"""
from __future__ import annotations

import torch


def token_correlation(x: torch.Tensor) -> float:
    """Cov(x_i, x_j)/Var(x) averaged over token pairs i ≠ j, features and batch, with the global mean.

    With c = x − mean and S = Σ_i c_i per (batch, feature): Σ_{i≠j} c_i c_j = S² − Σ_i c_i².

    Args:
        x: activations (..., T, d), tokens on the second-last axis.

    Returns:
        The correlation; NaN for fewer than two tokens.
    """
    t = x.shape[-2]
    if t < 2:
        return float("nan")
    c = (x - x.mean()).double()
    pair_sum = c.sum(-2).square() - c.square().sum(-2)                     # (B, d)
    return (pair_sum.mean() / (t * (t - 1)) / c.square().mean()).item()


def stable_rank(x: torch.Tensor) -> float:
    """‖X‖_F²/‖X‖₂² of each (T, d) token matrix, averaged over the batch; in [1, min(T, d)].

    Args:
        x: activations (B, T, d) (or one (T, d) matrix).
    """
    s = torch.linalg.svdvals(x.double())                                    # (B, min(T, d))
    return (s.square().sum(-1) / s[..., 0].square()).mean().item()


def attention_entropy(p: torch.Tensor) -> float:
    """−Σ_j p_ij log p_ij per row of softmax probabilities (B, H, T, S), averaged over rows, heads, batch.

    Args:
        p: attention probabilities (B, H, T, S), each row summing to 1.
    """
    return (-(p * p.clamp_min(1e-30).log()).sum(-1)).mean().item()
