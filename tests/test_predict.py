"""`sigprop.models.predict`: the tabulated fast path against the exact quadrature, coverage of every scheme, and
whole models at init, predicted against `diagnostics.measure` (docs/moments.md §6).

Model-level bar: per-sublayer forward variance and gradient variance within 10% median
relative error, at width 128, depth 48, seq 64, random token ids (token_collision = 1/vocab), float64.
The measured side is a mean over SEEDS independently initialized networks (one random sequence each: the
noise is the network's, not the tokens'); the bar only tests the theory if that mean is well inside it, so
each config also asserts that the median relative standard error of the per-sublayer means is below a
third of the bar (48 seeds give 1–2.5%). The noise is mostly a per-network scale common to all layers
(e.g. the final Pre-LN norm's 1/σ²), so the median error itself moves by ±3% between seed sets.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import block_series_hyp2f1, shared_keys_on_every_pair
from sigprop.diagnostics import measure
from sigprop.diagnostics.commands import DiagnoseConfig, diagnose_main, predict_main, random_batch
from sigprop.models import ModelConfig, build_model
from sigprop.models.predict import encoder_chain, model_chain, predict
from sigprop.records import Record
from sigprop.theory import moments
from sigprop.theory.moments import Attention, Moments, blocks, causal_attention, norm, tables
from sigprop.theory.moments.tables import (
    BETA_MAX,
    PAIR_KEYS,
    ROW_KEYS,
    exact_pairs,
    exact_profiles,
    exact_rows,
    functional_table,
)

BAR, SEEDS, BATCH = 0.10, 48, 1
SIZE = {"d_model": 128, "n_heads": 4, "n_layers": 48, "max_seq_len": 64, "vocab_size": 256}
CONFIGS = {"preln": ("preln", None), "postln": ("postln", None), "dslm-preln": ("dslm", "pre"),
           "dslm-postln": ("dslm", "post")}


# ------------------------------------------------------------------------------------- fast path vs exact
@pytest.mark.parametrize("points", [7, 500])
def test_chebyshev_basis_is_the_cosine_definition(points: int) -> None:
    """The tables' Chebyshev basis T_j(x) = cos(j arccos x), by cosines at a few points and by the three-term
    recurrence at many (the per-row profiles), on [−1, 1] and clipped outside it."""
    x = np.concatenate([np.linspace(-1.0, 1.0, points - 2), [-1.5, 1.5]])
    expected = np.cos(np.arccos(np.clip(x, -1.0, 1.0))[:, None] * np.arange(20))
    np.testing.assert_allclose(tables._vander(x, 20), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("L, causal", [(16, True), (64, False)])
def test_tables_match_exact_functionals(L: int, causal: bool) -> None:
    """Chebyshev tables reproduce the exact row/pair functionals at random (β, ρ): ≤ 1e-3 relative
    (K2, which changes sign, relative to its largest magnitude on the sample)."""
    rng = np.random.default_rng(0)
    table = functional_table(L, causal)
    beta2, rho = rng.uniform(0, BETA_MAX, 8) ** 2, rng.uniform(-1, 1, 8)
    rows, pairs = table.rows(beta2), table.pairs(beta2, rho)
    exact = [(exact_rows(b, L, causal), exact_pairs(b, r, L, causal)) for b, r in zip(beta2, rho)]
    k2_scale = max(abs(p["K2"]) for _, p in exact)
    for i, (ex_r, ex_p) in enumerate(exact):
        for k in ROW_KEYS:
            assert rows[k][i] == pytest.approx(ex_r[k], rel=1e-3), k
        for k in PAIR_KEYS:
            assert pairs[k][i] == pytest.approx(ex_p[k], rel=1e-3, abs=1e-3 * k2_scale if k == "K2" else 0), k


def test_per_row_profiles_read_each_row_at_its_own_logit_scale() -> None:
    """`profiles_by_row`: row i of a causal table read at its own β_i² equals the exact F2 and B of a row with
    i + 1 keys at β_i² (`exact_profiles` with one β² per row) to 1e-3 relative, and at a β² shared by every row
    equals `profiles`."""
    L, rng = 16, np.random.default_rng(1)
    table = functional_table(L, True)
    beta2 = rng.uniform(0, BETA_MAX, (3, L)) ** 2
    by_row = table.profiles_by_row(beta2)
    for p in range(3):
        exact = exact_profiles(beta2[p], L)
        assert np.allclose(by_row[p, :, 1:], exact[:, 1:], rtol=1e-3, atol=1e-9)
        assert np.allclose(by_row[p, 0], exact[0], rtol=1e-3, atol=1e-9)
    shared = np.repeat(beta2[:, :1], L, axis=1)
    assert np.allclose(table.profiles_by_row(shared), table.profiles(beta2[:, 0]), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kw, m", [
    ({"L": 64, "causal": True}, Moments(0.0, 1.0, 0.05, 1.0, 0.1)),
    ({"L": 64, "causal": True, "q_var": 2.5 / 128}, Moments(0.0, 1.0, 0.6, 2.0, 0.0)),
    ({"L": 16, "p": 0.1}, Moments(0.3, 1.5, 0.3, 1.0, 0.3)),
    ({"L": 16, "causal": True, "shaped": True, "tau0": 0.2}, Moments(0.0, 1.0, 0.3, 1.0, 0.3)),
])
def test_fast_attention_matches_exact(kw: dict, m: Moments) -> None:
    """Attention moments from the tables agree with the exact quadrature to 1e-3 relative."""
    base = {"d": 128, "n_heads": 4, "q_var": 1 / 128, "k_var": 1 / 128, "v_var": 1 / 128, "o_var": 1 / 128, **kw}
    fast, exact = Attention(**base), Attention(**base, exact=True)
    for a, b in [(fast.fwd(m), exact.fwd(m)), (fast.bwd(m, m), exact.bwd(m, m))]:
        for field in ("var", "corr", "grad_var", "grad_corr"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-3), field


@pytest.mark.parametrize("arch, scheme, placement", [("decoder", "preln", None), ("decoder", "dslm", "pre"),
                                                      ("encoder", "preln", None)])
def test_predict_with_the_term_by_term_hypergeometric_is_the_block_series(monkeypatch: pytest.MonkeyPatch, arch: str,
                                                                          scheme: str, placement: str | None) -> None:
    """The norms' ₂F₁ (`norm.hyp2f1`, its first terms summed one by one) gives every record of the all-block series
    to 1e-10 relative, float64."""
    cfg = ModelConfig(arch=arch, scheme=scheme, norm_placement=placement, d_model=64, n_heads=4, n_layers=4,
                      max_seq_len=32, vocab_size=256)

    def records() -> list[tuple[float, ...]]:
        for cached in (norm.mean_cosine, norm._cross_factor, blocks._forward_states):
            cached.cache_clear()
        return [(r.fwd_mean, r.fwd_var, r.token_corr, r.grad_var) for r in predict(cfg)]

    fast = records()
    monkeypatch.setattr(norm, "hyp2f1", block_series_hyp2f1)
    reference = records()
    monkeypatch.undo()
    records()                                   # leave the caches holding the shipped path's values
    assert np.allclose(fast, reference, rtol=1e-10, atol=0)


@pytest.mark.slow
def test_a_thousand_layer_postln_prediction_stays_finite() -> None:
    """bench/predict.py's config: at depth 1000 the late positions' gradient of a collapsed causal Post-LN
    stack underflows to 0; the per-position upstream shares (0/0 there) and every record stay finite."""
    cfg = ModelConfig(scheme="postln", d_model=256, n_heads=4, n_layers=1000, max_seq_len=128, vocab_size=50257)
    records = predict(cfg)
    assert all(math.isfinite(r.grad_var) and math.isfinite(r.fwd_var) for r in records)


def test_logit_scale_beyond_the_table_uses_the_exact_path() -> None:
    """Fluctuation nodes up to β ≈ 3.6 (> the table's 3): exact quadrature (beyond β = 4, near hard-max:
    tests/test_moments_hardmax.py)."""
    wide = {"d": 16, "n_heads": 1, "L": 8, "q_var": 0.09, "k_var": 0.09, "v_var": 1 / 16, "o_var": 1 / 16}
    m = Moments(0.0, 1.0, 0.2)
    assert Attention(**wide).fwd(m) == Attention(**wide, exact=True).fwd(m)


# ------------------------------------------------------------------------------------------------ coverage
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encdec", "vit"])
@pytest.mark.parametrize("scheme, placement", [("preln", None), ("postln", None), ("vanilla", None), ("shaped", None),
                                               ("dslm", "pre"), ("dslm", "post"), ("deepnorm", None)])
def test_predict_covers_every_scheme_with_measure_labels(arch: str, scheme: str, placement: str | None) -> None:
    """One record per point `measure` reports, same labels and order, finite positive moments."""
    tokens = {} if arch == "vit" else {"max_seq_len": 8, "vocab_size": 50}
    cfg = ModelConfig(arch=arch, scheme=scheme, norm_placement=placement, d_model=32, n_heads=2, n_layers=3, **tokens)
    if arch == "vit" and (scheme, cfg.norm_placement) == ("preln", "pre"):      # a quieter class token: refused
        with pytest.raises(NotImplementedError, match="class token"):
            predict(cfg, seq_len=8)
        return
    torch.manual_seed(0)
    measured = measure(build_model(cfg).double(), random_batch(cfg, DiagnoseConfig(seq_len=8, batch=2)),
                       attention_stats=False)
    predicted = predict(cfg, seq_len=8)
    assert [(r.stack, r.layer, r.sublayer) for r in predicted] == [(r.stack, r.layer, r.sublayer) for r in measured]
    assert all(r.source == "predicted" and r.fwd_var > 0 and r.grad_var > 0 and -1 <= r.token_corr <= 1
               for r in predicted)


@pytest.mark.parametrize("arch", ["decoder", "encdec"])
def test_shaped_weights_form_predicts_like_the_temperature_form(arch: str) -> None:
    """qk_scaling "weights" (W_Q, W_K ~ N(0, n^-3/2), τ = τ₀√n_k) is the "temperature" form's function at init,
    so the predictions agree; the logit scale reaches the maps at the right size (not n× too small)."""
    base = dict(arch=arch, scheme="shaped", d_model=64, n_heads=2, n_layers=3, max_seq_len=16, vocab_size=50)
    weights, temp = (predict(ModelConfig(**base, qk_scaling=q), seq_len=16) for q in ("weights", "temperature"))
    for a, b in zip(weights, temp):
        for field in ("fwd_var", "token_corr", "grad_var"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-12), (a.layer, a.sublayer, field)


def test_encdec_chain_is_the_decoder_reading_a_given_memory() -> None:
    """`model_chain` of an encdec is its decoder, whose cross sublayers read the memory moments it is given
    (the encoder's output); without them it says so."""
    cfg = ModelConfig(arch="encdec", d_model=32, n_heads=2, n_layers=2, max_seq_len=8, vocab_size=50)
    with pytest.raises(ValueError, match="memory"):
        model_chain(cfg)
    memory = moments.serial(*encoder_chain(cfg)[1]).fwd(Moments(0.0, 1.0, 0.0))
    labels, _ = model_chain(cfg, memory=memory)
    assert [lab for lab in labels if lab] == [(layer, kind) for layer in (1, 2) for kind in ("attn", "cross", "mlp")]


def test_cli_functions_write_records_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text('[model]\nscheme = "dslm"\nd_model = 32\nn_heads = 2\nn_layers = 2\nmax_seq_len = 8\n'
                   '[diagnose]\nbatch = 2\nseed = 1\n')
    assert predict_main(["--config", str(cfg), "--out", str(tmp_path / "p")]) == 0
    assert "token_corr" in capsys.readouterr().out
    assert diagnose_main(["--config", str(cfg), "--out", str(tmp_path / "d")]) == 0
    for name in ("p/predicted.csv", "p/predicted.png", "d/measured.json", "d/predicted.json", "d/diagnose.png",
                 "d/config.json", "d/command.txt"):
        assert (tmp_path / name).stat().st_size > 0, name
    measured = json.loads((tmp_path / "d/measured.json").read_text())
    assert len(measured) == 1 + 2 * 2 and json.loads((tmp_path / "d/config.json").read_text())["diagnose"]["seed"] == 1
    cfg.write_text('[model]\nscheme = "dslm"\n[diagnose]\nbatches = 2\n')
    assert diagnose_main(["--config", str(cfg), "--out", str(tmp_path / "x")]) == 2
    assert "batches" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- model level
def token_batch(cfg: ModelConfig) -> torch.Tensor:
    """BATCH sequences of uniform random token ids."""
    return torch.randint(0, cfg.vocab_size, (BATCH, cfg.max_seq_len))


@pytest.fixture(scope="module")
def measured(measured_networks):
    """measured(name) -> (SEEDS, sublayers) arrays of measured forward and gradient variance, and the predicted
    records."""
    @lru_cache(maxsize=None)
    def get(name: str) -> tuple[np.ndarray, np.ndarray, list[Record]]:
        scheme, placement = CONFIGS[name]
        cfg = ModelConfig(scheme=scheme, norm_placement=placement, **SIZE)
        fwd, grad, _ = measured_networks(cfg, tuple(range(SEEDS)), token_batch)
        return fwd, grad, predict(cfg, token_collision=1 / cfg.vocab_size)
    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", ["preln", "dslm-preln", "dslm-postln",
                                  pytest.param("postln", marks=pytest.mark.xfail(strict=True, reason=(
                                      "too noisy to test with 48 networks (median error 20%, s.e. 17%: the "
                                      "per-network gradient of a collapsed Post-LN stack has log-std 1.2-1.6); "
                                      "measured on demand by tests/test_postln_gradient.py: 2.1% against seeds 0-999 "
                                      "(s.e. 5.0%) and 3.0% against seeds 1000-1999 (s.e. 4.5%), where even 1000 "
                                      "networks leave an s.e. above this test's bar/3")))])
def test_predicted_matches_measured(name: str, measured, median_error) -> None:
    fwd, grad, pred = measured(name)
    for field, samples in (("fwd_var", fwd), ("grad_var", grad)):
        err, se = median_error(np.array([getattr(r, field) for r in pred]), samples)
        assert se < BAR / 3, f"{name} {field}: Monte-Carlo s.e. {se:.1%} too large to test a {BAR:.0%} bar"
        assert err < BAR, f"{name} {field}: median relative error {err:.1%}"


@pytest.mark.slow
def test_preln_bottom_gradient_matches_measured(measured, monkeypatch: pytest.MonkeyPatch) -> None:
    """The median over the stack's points hides its bottom, where the standard Pre-LN norms multiply the gradient
    by ~d/2 (the embedding's variance is 2/d): the embedding's and the first three blocks' gradient within 4 s.e. +
    5 %. With two causal rows' same-key weight covariance put on every pair of keys they read (instead of the
    row-sum compensation on different shared keys, `causal_attention._shared_keys`) the embedding's and the first
    block's are 42–72 % high, beyond it (docs/findings.md: 81 % at the embedding against 64 other networks)."""
    _, grad, pred = measured("preln")
    mean, se = grad.mean(0)[:7], grad.std(0, ddof=1)[:7] / math.sqrt(len(grad))
    bar = 4 * se + 0.05 * mean
    predicted = np.array([r.grad_var for r in pred[:7]])
    assert np.all(np.abs(predicted - mean) < bar), (predicted / mean - 1, se / mean)
    monkeypatch.setattr(causal_attention, "_shared_keys", shared_keys_on_every_pair)
    every_pair = np.array([r.grad_var for r in predict(ModelConfig(scheme="preln", **SIZE), token_collision=1 / 256)])
    assert np.all(every_pair[:3] - mean[:3] > bar[:3]), every_pair[:3] / mean[:3] - 1


def block_outputs(name: str, samples: np.ndarray) -> np.ndarray:
    """Mean over seeds at the end of each block (the MLP sublayer outputs), layers 1..N."""
    return samples.mean(0)[2::2]


@pytest.mark.slow
def test_preln_forward_variance_grows_linearly_with_depth(measured) -> None:
    var = block_outputs("preln", measured("preln")[0])
    layers = np.arange(1, len(var) + 1)
    slope, intercept = np.polyfit(layers, var, 1)
    r2 = 1 - np.sum((var - slope * layers - intercept) ** 2) / np.sum((var - var.mean()) ** 2)
    assert slope > 0 and r2 > 0.98, (slope, r2)


@pytest.mark.slow
def test_postln_gradient_grows_geometrically_toward_the_output(measured) -> None:
    """DeepScaleLM's Post-LN claim, as measured here: over the top blocks the stream-gradient variance
    grows ~2× per layer toward the output (log-linear fit). Below them the decoder's gradient does not
    keep falling: the collapsed stack routes it to the first token (see the xfail above)."""
    grad = block_outputs("postln", measured("postln")[1])[-3:]
    ratio = math.exp(np.polyfit(np.arange(3), np.log(grad), 1)[0])
    assert ratio > 1.5, ratio


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dslm-preln", "dslm-postln"])
def test_dslm_forward_variance_stays_in_band(name: str, measured) -> None:
    fwd = measured(name)[0].mean(0)
    assert 0.8 <= fwd.min() and fwd.max() <= 1.25, (fwd.min(), fwd.max())


def gradient_ratio(grad: np.ndarray) -> np.ndarray:
    """Stream-gradient variance at each sublayer output relative to the last one (the model output)."""
    return grad / grad[-1]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "known gap: DSLM keeps each block's forward gain at 1, but attention's backward gain is smaller "
    "(the gradient is uncorrelated across tokens while the activations are not: V path ∝ ΣS² instead of "
    "r + (1−r)ΣS²); with β² = k/N the log-drift is bounded, ≈ −(k/2)⟨1 − G_b⟩, not zero: measured min "
    "ratio 0.69 (Pre-LN), 0.73 (Post-LN) at k = 2 (predicted 0.65, 0.73; k = 1 would give 0.87, 0.91); the "
    "only free attention parameter (σ_v²σ_o²) scales both gains together, so no init choice fixes it without "
    "breaking the forward invariant (docs/RESULTS_dslm_moments.md)"))
@pytest.mark.parametrize("name", ["dslm-preln", "dslm-postln"])
def test_dslm_backward_gradient_stays_in_band(name: str, measured) -> None:
    ratio = gradient_ratio(measured(name)[1].mean(0))
    assert 0.8 <= ratio.min() and ratio.max() <= 1.25, (ratio.min(), ratio.max())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dslm-preln", "dslm-postln"])
def test_dslm_backward_dip_is_predicted_and_bounded_in_depth(name: str, measured) -> None:
    """The theory reproduces the measured dip (min ratio within 0.1), and predicts the same dip at
    depth 48, 192 and 1000 (β² = k/N bounds the accumulated drift)."""
    _, grad, pred = measured(name)
    measured_min = gradient_ratio(grad.mean(0)).min()
    predicted_min = gradient_ratio(np.array([r.grad_var for r in pred])).min()
    assert abs(measured_min - predicted_min) < 0.1, (measured_min, predicted_min)
    scheme, placement = CONFIGS[name]
    deep = [gradient_ratio(np.array([r.grad_var for r in predict(
        ModelConfig(scheme=scheme, norm_placement=placement, **{**SIZE, "n_layers": n}),
        token_collision=1 / 256)])).min() for n in (192, 1000)]
    assert deep == pytest.approx([predicted_min] * 2, abs=0.01)
