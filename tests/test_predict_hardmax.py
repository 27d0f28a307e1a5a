"""A norm-free ("vanilla") decoder deep enough for its attention logits to reach hard-max, predicted and measured.

Without LayerNorm the residual stream's variance grows about threefold per layer and the mean logit scale with
it (β ≈ 0.05, 0.08, 0.16, 0.38, 1.0, 3.1, 9.6, 28, … at width 64, 16 tokens), so from the seventh layer on
every attention sublayer reads its softmax near hard-max (`sigprop.theory.moments.hardmax`). `predict` against
`measure` (the mean over seeds, as tests/test_predict_knobs.py does it, with its bars and its Monte-Carlo noise
check): the token correlation is within the bar at 8 and 24 layers. The forward variance is not: it falls
behind the measurement in the layers where β ≈ 0.2–3 (functionals exact there, quadrature of `softmax`): each
attention sublayer there 3–7 % low, to 24 % below measurement at layer 8 (median over the 8-layer stack's
sublayers 8.3 %, 2048 networks, s.e. 0.8 %); the hard-max layers above add about 2 % over 16 layers (26 % at
layer 24, 512 networks). That gap is a strict xfail with its number. The gradient's per-network spread in these
stacks (s.e. 7 % of the mean over 2048 networks at 8 layers, 70 % over 512 at 24) is beyond a 5 % check.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest

from sigprop.models import ModelConfig, predict
from test_predict_knobs import BAR, CORR_BAR, _measured

SEEDS = {8: 1024, 24: 256}       # networks measured per depth


def _cfg(n_layers: int) -> ModelConfig:
    return ModelConfig(arch="decoder", scheme="vanilla", vocab_size=64, d_model=64, n_heads=4, n_layers=n_layers,
                       max_seq_len=16)


@lru_cache(maxsize=4)
def _compared(n_layers: int) -> tuple[list, np.ndarray, np.ndarray]:
    cfg = _cfg(n_layers)
    pred = predict(cfg, seq_len=cfg.max_seq_len, token_collision=1 / cfg.vocab_size)
    fwd, _, corr = _measured(cfg, SEEDS[n_layers])
    return pred, fwd, corr


@pytest.mark.slow
@pytest.mark.parametrize("n_layers", [8, 24])
def test_vanilla_decoder_token_correlation_near_hard_max(n_layers: int) -> None:
    pred, _, corr = _compared(n_layers)
    assert all(math.isfinite(r.fwd_var) and math.isfinite(r.token_corr) for r in pred)
    se = float(np.median(corr.std(0, ddof=1))) / math.sqrt(SEEDS[n_layers])
    assert se < CORR_BAR / 2, f"token_corr: Monte-Carlo s.e. {se:.3f} too large for the bar"
    err = float(np.median(np.abs(np.array([r.token_corr for r in pred]) - corr.mean(0))))
    assert err < CORR_BAR, f"token_corr: median absolute error {err:.3f}"


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="forward variance 8.3 % low (median) at 8 layers: the attention sublayers at "
                   "β ≈ 0.2–3 each 3–7 % low (module docstring); the hard-max layers above add about 2 % over 16")
def test_vanilla_decoder_forward_variance_near_hard_max() -> None:
    pred, fwd, _ = _compared(8)
    mean = fwd.mean(0)
    se = float(np.median(fwd.std(0, ddof=1) / mean)) / math.sqrt(SEEDS[8])
    assert se < BAR / 2, f"fwd_var: Monte-Carlo s.e. {se:.1%} too large for a {BAR:.0%} bar"
    err = float(np.median(np.abs(np.array([r.fwd_var for r in pred]) / mean - 1)))
    assert err < BAR, f"fwd_var: median relative error {err:.1%}"
