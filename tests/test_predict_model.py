"""`predict` reads the model it predicts: init stds recorded on the weights, the modules' own residual weights,
logit scales and dropout mode; a module or option without an exact map is refused by name."""
from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch

from sigprop.diagnostics import measure
from sigprop.diagnostics.commands import predict_main
from sigprop.models import ARCHITECTURES, ModelConfig, build_model, predict
from sigprop.nn.roles import init_std_of
from sigprop.theory.moments import Embedding, Moments

SIZE = dict(arch="decoder", vocab_size=256, d_model=128, n_heads=4, n_layers=2, max_seq_len=32)
SEEDS = 16


def _measured_fwd(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error over SEEDS float64 networks of each point's forward variance (4 random sequences)."""
    runs = []
    for seed in range(SEEDS):
        torch.manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (4, cfg.max_seq_len))
        runs.append([r.fwd_var for r in measure(build_model(cfg).double(), ids, seed=seed, attention_stats=False)])
    fwd = np.array(runs)
    return fwd.mean(0), fwd.std(0, ddof=1) / math.sqrt(SEEDS)


def test_mup_prediction_uses_the_stds_the_weights_were_drawn_with() -> None:
    """μP draws the input tables at the base width's std (variance 1/32 per table at base width 32, not 1/128)
    and scales attention logits by 1/d_head: the embedding output and the first attention sublayer are
    predicted within 4 Monte-Carlo standard errors (and 3 %) of 16 measured networks."""
    cfg = ModelConfig(**SIZE, scheme="preln", parametrization="mup", base_width=32)
    mean, se = _measured_fwd(cfg)
    pred = predict(cfg, token_collision=1 / cfg.vocab_size)
    assert (pred[0].layer, pred[0].sublayer, pred[1].layer, pred[1].sublayer) == (0, "embed", 1, "attn")
    assert pred[0].fwd_var == pytest.approx(2 / 32, rel=1e-12)
    for i in (0, 1):
        assert abs(pred[i].fwd_var - mean[i]) < max(4 * se[i], 0.03 * mean[i]), (i, pred[i].fwd_var, mean[i], se[i])


def test_predict_of_a_config_is_predict_of_the_model_it_builds() -> None:
    cfg = ModelConfig(**SIZE, scheme="dslm", norm_placement="post", dropout=0.1)
    torch.manual_seed(0)
    assert predict(build_model(cfg), seq_len=16) == predict(cfg, seq_len=16)


@pytest.mark.parametrize("enabled", [True, False])
def test_build_and_predict_leave_the_garbage_collector_as_found(enabled: bool) -> None:
    """The collector is paused around the build and the maps (`gc_paused`) and restored, also when a map raises."""
    (gc.enable if enabled else gc.disable)()
    try:
        build_model(ModelConfig(**SIZE, scheme="preln"), device="meta")
        assert gc.isenabled() is enabled
        predict(ModelConfig(**SIZE, scheme="preln"), seq_len=16)
        assert gc.isenabled() is enabled
        with pytest.raises(NotImplementedError, match="qk_norm"):
            predict(ModelConfig(**{**SIZE, "arch": "encdec"}, scheme="preln", qk_norm=True))
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_predict_reads_the_models_own_residual_weights_and_dropout_mode() -> None:
    """Changing the model changes the prediction: a residual branch weighted 0 passes its input through;
    a model in eval mode has no dropout (as a dropout-free config)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**SIZE, scheme="preln"))
    model.stack.blocks[0].attn.residual.beta.fill_(0.0)
    emb, attn = predict(model, seq_len=16)[:2]
    assert (attn.fwd_var, attn.token_corr) == pytest.approx((emb.fwd_var, emb.token_corr), rel=1e-12)
    cfg = ModelConfig(**SIZE, scheme="preln", dropout=0.2)
    train_mode, eval_mode = predict(build_model(cfg), seq_len=16), predict(build_model(cfg).eval(), seq_len=16)
    no_dropout = predict(ModelConfig(**SIZE, scheme="preln"), seq_len=16)
    assert eval_mode == no_dropout and train_mode != eval_mode


@pytest.mark.parametrize("scheme", ["preln", pytest.param("dslm", marks=pytest.mark.slow)])   # dslm: its Gram init
def test_build_on_meta_records_every_weights_std_without_memory(scheme: str) -> None:
    cfg = ModelConfig(**{**SIZE, "n_layers": 1000, "d_model": 256}, scheme=scheme)
    model = build_model(cfg, device="meta")
    weights = [p for p in model.parameters() if p.ndim >= 2]
    assert all(p.is_meta for p in model.parameters()) and all(init_std_of(p) > 0 for p in weights)


@pytest.mark.parametrize("change, match", [
    (lambda cfg: ModelConfig(**{**cfg, "arch": "encdec", "qk_norm": True}), "cross-attention with qk_norm"),
    (lambda cfg: ARCHITECTURES["decoder"](ModelConfig(**cfg)), "no recorded init std"),
    (lambda cfg: torch.nn.Linear(4, 4), "no moment chain"),
])
def test_what_has_no_exact_map_is_refused_by_name(change, match: str) -> None:
    with pytest.raises(NotImplementedError, match=match):
        predict(change({**SIZE, "scheme": "preln"}), seq_len=16)


def test_predict_command_refuses_qk_norm_cross_attention_in_one_line(tmp_path, capsys) -> None:
    cfg = tmp_path / "qk.toml"
    cfg.write_text('[model]\narch = "encdec"\nd_model = 32\nn_heads = 2\nn_layers = 2\nmax_seq_len = 8\n'
                   'qk_norm = true\n')
    assert predict_main(["--config", str(cfg), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "qk_norm" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_embedding_tables_with_their_own_variances_against_monte_carlo() -> None:
    """Σ_t E_t[id]: variance Σσ_t², covariance Σσ_t²c_t, against 200k draws (token table with collision c)."""
    gen = np.random.default_rng(0)
    c, (v_tok, v_pos), n = 0.3, (0.3, 0.1), 200_000
    same = gen.random(n) < c                              # the two positions read one token row
    tok_a = gen.normal(0, math.sqrt(v_tok), n)
    tok_b = np.where(same, tok_a, gen.normal(0, math.sqrt(v_tok), n))
    x_a, x_b = tok_a + gen.normal(0, math.sqrt(v_pos), n), tok_b + gen.normal(0, math.sqrt(v_pos), n)
    out = Embedding((v_tok, v_pos), (c, 0.0)).fwd(Moments(0.0, 1.0, 0.0))
    var, cov = np.var(np.r_[x_a, x_b]), np.mean(x_a * x_b)
    assert out.var == pytest.approx(var, rel=4 * math.sqrt(2 / (2 * n)))
    assert out.corr * out.var == pytest.approx(cov, abs=4 * math.sqrt((v_tok + v_pos) ** 2 / n))
    with pytest.raises(ValueError, match="one per table"):
        Embedding((0.3,), (c, 0.0))
