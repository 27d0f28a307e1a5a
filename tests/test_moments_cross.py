"""Cross-attention and patch-embedding moment maps against simulation (docs/moments.md §5).

Cross-attention: Monte Carlo of the real op (tests/moments_mc.py, family ``cross_attention``: float64, fixed
seeds, fresh weights per sample, T ≠ S, standard and shaped, attention dropout 0 and 0.1), forward moments
and the input gradients of both streams. Bar per row: median error < 2%, 99th percentile
< 10%, and a median Monte-Carlo standard error < 1% so that the bar tests the theory.
"""
from __future__ import annotations

import math

import pytest
import torch

from moment_errors import error_table
from moments_mc import cross_attention_rows
from sigprop.models import ModelConfig, build_model
from sigprop.theory.moments import CrossAttention, Moments, PatchEmbedding


@pytest.fixture(scope="module")
def table() -> dict:
    return error_table(cross_attention_rows())


@pytest.mark.slow
def test_cross_attention_rows_cover_output_and_both_gradients(table: dict) -> None:
    assert set(table) == {("cross_attention", q) for q in ("mean", "var", "cov")} | {
        (f"cross_attention → {side}", q) for side in ("query", "memory") for q in ("grad_var", "grad_cov")}


@pytest.mark.slow
@pytest.mark.parametrize("key", [("cross_attention", "mean"), ("cross_attention", "var"), ("cross_attention", "cov"),
                                 ("cross_attention → query", "grad_var"), ("cross_attention → query", "grad_cov"),
                                 ("cross_attention → memory", "grad_var"), ("cross_attention → memory", "grad_cov")])
def test_cross_attention_matches_monte_carlo(table: dict, key: tuple[str, str]) -> None:
    row = table[key]
    assert row["mc_se"] < 0.01, row
    assert row["p50"] < 0.02 and row["p99"] < 0.10, row


def test_cross_attention_with_equal_streams_is_self_attention_without_key_overlap() -> None:
    """Same moments on both sides, T = S: the forward equals non-causal self-attention's (the maps share
    the algebra), and the two backward outputs split self-attention's Q and V + K paths."""
    m = Moments(0.0, 1.0, 0.3, 1.0, 0.2)
    cross = CrossAttention(64, 4, 16, 16, 1 / 64, 1 / 64, 1 / 64, 1 / 64)
    attn = cross.keys
    assert cross.fwd(m, m) == attn.fwd(m)
    g = attn.out_proj.bwd(attn._mix_fwd(m), m)
    (v_var, _), (qk_var, _) = attn.mix_bwd_paths(m, g)
    g_q, g_kv = cross.bwd(m, m, m)
    assert g_q.grad_var + g_kv.grad_var == pytest.approx(v_var + qk_var, rel=1e-12)


@pytest.mark.parametrize("scheme, placement", [("preln", None), ("dslm", "pre"), ("shaped", None)])
def test_patch_embedding_matches_the_module(scheme: str, placement: str | None) -> None:
    """Token-averaged variance and token correlation of `sigprop.nn.PatchEmbedding` as the scheme
    initializes it, on N(0, 1) pixels, against the map the module provides (mean over 64 networks)."""
    cfg = ModelConfig(arch="vit", scheme=scheme, norm_placement=placement, d_model=64, n_heads=4, n_layers=1,
                      image_size=16, patch_size=4, in_channels=3)
    emb = build_model(cfg, device="meta").embed.moment_map()
    assert isinstance(emb, PatchEmbedding)
    pred = emb.fwd(Moments(0.0, 1.0, 0.0))
    var, cov = [], []
    for seed in range(64):
        torch.manual_seed(seed)
        x = build_model(cfg).double().embed(torch.randn(4, 3, 16, 16, dtype=torch.float64))   # (B, T, d)
        t = x.shape[1]
        var.append(x.square().mean().item())
        cov.append(((x.sum(1).square() - x.square().sum(1)).mean() / (t * (t - 1))).item())
    mean_var = sum(var) / len(var)
    se = (sum((v - mean_var) ** 2 for v in var) / (len(var) - 1) / len(var)) ** 0.5
    assert abs(pred.var - mean_var) < 4 * se + 1e-12, (pred.var, mean_var, se)
    assert pred.corr == 0.0 and abs(sum(cov) / len(cov)) < 4 * se
    cls, patch = emb.token_vars
    assert pred.var == pytest.approx((cls + (t - 1) * patch) / t)
    assert math.isfinite(cls) and cls > 0
