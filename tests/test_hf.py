"""sigprop.hf on tiny, randomly initialized transformers models (no downloads)."""
import dataclasses
import importlib
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

import transformers

import sigprop.hf as hf
from helpers import HF_VOCAB as V
from helpers import MODELS, NO_SPECIAL, bert, cached_logits, gpt2, grads_as_found, llama, logits
from sigprop import ModelConfig, build_model
from sigprop.diagnostics import measure
from sigprop.hf.apply import family_of
from sigprop.models.predict import predict as sigprop_predict
from sigprop.schemes import dslm
from sigprop.theory import gated
from sigprop.theory.moments import Attention, GatedMLP, Moments, Smooth, pointwise
from sigprop.theory.moments.rope import RopeAttention

# --- the new moment rules, against Monte Carlo -------------------------------------------------

def test_gated_output_moment_matches_monte_carlo():
    """E[y²] of W_d(silu(W_g x) ⊙ W_u x): exact-at-any-width formula vs 24 weight draws (4 standard errors)."""
    torch.manual_seed(0)
    d, d_ff, q = 64, 256, 1.7
    var_g, var_u, var_d = 2.5 / d, 0.7 / d, 1.3 / d_ff
    x = torch.randn(64, d, dtype=torch.float64)
    x = x * math.sqrt(q * d) / x.norm(dim=-1, keepdim=True)                           # |x|²/d = q exactly
    draws = []
    for _ in range(24):
        a = x @ (torch.randn(d, d_ff, dtype=torch.float64) * math.sqrt(var_g))
        b = x @ (torch.randn(d, d_ff, dtype=torch.float64) * math.sqrt(var_u))
        y = (F.silu(a) * b) @ (torch.randn(d_ff, d, dtype=torch.float64) * math.sqrt(var_d))
        draws.append(y.square().mean().item())
    est = torch.tensor(draws)
    want = gated.gated_output_moment(F.silu, d, d_ff, var_g, var_u, var_d, q)
    assert abs(est.mean().item() - want) < 4 * est.std().item() / math.sqrt(len(draws))
    assert gated.gate_moment(F.silu) == pytest.approx(0.3557, abs=1e-4)


@pytest.mark.parametrize("rho", [0.2, 0.8])
def test_gated_kernel_matches_monte_carlo(rho):
    g = torch.Generator().manual_seed(1)
    n = 400_000
    u = torch.randn(n, 2, generator=g, dtype=torch.float64)                          # gate pre-activations
    w = torch.randn(n, 2, generator=g, dtype=torch.float64)                          # up pre-activations
    a = torch.stack([u[:, 0], rho * u[:, 0] + math.sqrt(1 - rho ** 2) * u[:, 1]], 1)
    b = torch.stack([w[:, 0], rho * w[:, 0] + math.sqrt(1 - rho ** 2) * w[:, 1]], 1)
    h = F.silu(a) * b
    prod = h[:, 0] * h[:, 1]
    mc = prod.mean().item() / h[:, 0].square().mean().item()
    assert gated.gated_kernel(F.silu)(rho) == pytest.approx(mc, abs=5 * prod.std().item() / math.sqrt(n) / 0.36)


# --- DSLM at branch level: each attention and MLP branch output, before the residual scaling ---------

BRANCHES = {"gpt2": r"transformer\.h\.\d+\.(attn|mlp)\.c_proj",
            "llama": r"model\.layers\.\d+\.(self_attn\.o_proj|mlp\.down_proj)",
            "bert": r"bert\.encoder\.layer\.\d+\.(attention\.output|output)\.dense",
            "sigprop": r"stack\.blocks\.\d+\.(attn|mlp)\.fn"}


def zipf_ids(batch: int, seq: int, seed: int) -> torch.Tensor:
    """Token ids with P(k) ∝ 1/(k + 1) over the V ids (natural text's unigram law)."""
    w = 1.0 / torch.arange(1, V + 1, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(w / w.sum(), batch * seq, replacement=True, generator=g).view(batch, seq)


def dslm_model(family: str, d: int, seq: int | None, positions: int = 128) -> torch.nn.Module:
    """48 layers under DSLM for sequences of ``seq`` tokens (None: ``apply``'s default, the model's positions)."""
    if family.startswith("sigprop"):
        arch = "decoder" if family == "sigprop-dec" else "encoder"
        return build_model(ModelConfig(arch=arch, scheme="dslm", vocab_size=V, d_model=d, n_layers=48, n_heads=4,
                                       d_ff=4 * d, max_seq_len=seq or positions))
    size = {"gpt2": "n_positions", "bert": "max_position_embeddings", "llama": "max_position_embeddings"}[family]
    model = MODELS[family](48, d=d, **{size: positions})
    hf.apply(model, "dslm", seq_len=seq)
    return model


def branch_variances(family: str, d: int, seq: int | None, seeds: tuple[int, ...]) -> tuple[list[float], list[float]]:
    """(attention, MLP): each branch's output variance on 8 Zipf sequences, hooked on the branch's last linear map
    (before λx + βf(x)), averaged over one network per seed (a single network's branch fluctuates by ~2/√d)."""
    runs = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = dslm_model(family, d, seq).eval()
        records = measure(model, zipf_ids(8, seq or 128, seed + 1), blocks=BRANCHES[family.split("-")[0]])
        runs.append([r.fwd_var for r in records])
    mean = [sum(col) / len(col) for col in zip(*runs)]
    return mean[0::2], mean[1::2]


def assert_unit_branches(attn: list[float], mlp: list[float]) -> None:
    for kind, v in (("attention", attn), ("mlp", mlp)):
        assert 0.9 <= statistics.median(v) <= 1.1, (kind, statistics.median(v))
        assert 0.7 <= min(v) and max(v) <= 1.4, (kind, min(v), max(v))


@pytest.mark.parametrize("family", [pytest.param("gpt2", marks=pytest.mark.slow),
                                    pytest.param("llama", marks=pytest.mark.slow), "sigprop-dec"])
def test_dslm_branches_have_unit_variance_at_seq_len_32(family):
    """GPT-2, LLaMA (and sigprop's own decoder), width 64, 48 layers, 32 causal Zipf tokens: every branch near 1. A
    finite-length V/O correction applied on top of a std that already holds one gives GPT-2 a first attention
    branch of 0.19 and an attention median of 0.83 on these seeds; the mean-correlation recursion instead of the
    token Gram recursion leaves LLaMA's attention median at 1.12 (width 128, 16 networks: docs/hf.md's table)."""
    attn, mlp = branch_variances(family, 64, 32, (0, 1))
    assert 0.7 <= attn[0] <= 1.4, attn[0]
    assert_unit_branches(attn, mlp)


def test_dslm_vo_init_is_the_schemes_rule_at_the_given_length():
    """GPT-2 has sigprop's two tables and plain MLP, so its W_O is exactly the scheme's std for the mirror, which
    attends over ``seq_len`` keys (the std at 16 and at 128 keys differ by ~25%, 20 standard errors)."""
    torch.manual_seed(0)
    model = gpt2(2, d=64, n_positions=128)
    cfg = hf.apply(model, "dslm", seq_len=16)
    assert cfg.max_seq_len == 16
    w = model.transformer.h[1].attn.c_proj.weight
    for seq, close in ((16, True), (128, False)):
        want = dslm.vo_std(dataclasses.replace(cfg, max_seq_len=seq), dslm.block_correlations(
            dataclasses.replace(cfg, max_seq_len=seq), "dec")[1][1])
        assert (abs(w.std().item() / want - 1) < 5 / math.sqrt(2 * w.numel())) == close, (seq, w.std().item(), want)


@pytest.mark.slow
@pytest.mark.parametrize("seq", [16, 32, 128, None])
@pytest.mark.parametrize("family", ["gpt2", "sigprop-dec", "sigprop-enc", "llama", "bert"])
def test_dslm_branches_have_unit_variance_at_every_length(family, seq):
    """Width 128, 48 layers, 16 networks per case; ``seq=None``: apply's default length (128 positions), fed 128.

    16 networks, because one network's branches drift together: strongly correlated tokens (BERT's shared token-type
    row) share one stream direction, so a network's branch medians move by ~0.1 (BERT, T = 32: 0.87 averaged over
    seeds 0-3, 0.98 over seeds 4-11), and 4 networks cannot resolve a ±0.1 band."""
    assert_unit_branches(*branch_variances(family, 128, seq, tuple(range(16))))


# --- apply: DSLM keeps unit variance, generate() works -----------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
def test_dslm_forward_variance_stays_near_one_through_48_layers(family):
    torch.manual_seed(0)
    model = MODELS[family](48, d=64)
    cfg = hf.apply(model, "dslm", seq_len=32)
    assert cfg.scheme == "dslm" and cfg.norm_placement == ("post" if family == "bert" else "pre")
    records = hf.diagnose(model, torch.randint(0, V, (16, 32)), attention_stats=False)
    assert [(r.layer, r.sublayer) for r in records[:3]] == [(0, "embed"), (1, "attn"), (1, "mlp")]
    assert len(records) == 1 + 2 * 48
    variances = [r.fwd_var for r in records]
    assert 0.8 <= min(variances) and max(variances) <= 1.25, variances


def test_dslm_residual_weights_and_beta():
    model = gpt2(6)
    cfg = hf.apply(model, "dslm", k=3.0)
    for block in model.transformer.h:
        for res in (block.sigprop_attn_residual, block.sigprop_mlp_residual):
            assert res.beta.item() ** 2 == pytest.approx(3.0 / 12)
            assert res.alpha.item() ** 2 + res.beta.item() ** 2 == pytest.approx(1.0)
    assert model.sigprop_config is cfg


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("scheme", ["dslm", "shaped"])
def test_generate_matches_greedy_full_forward(family, scheme):
    torch.manual_seed(0)
    model = MODELS[family](3).eval()
    hf.apply(model, scheme)
    ids = torch.randint(0, V, (2, 5))
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    seq = ids
    for _ in range(6):                                     # no cache: the whole prefix every step
        seq = torch.cat([seq, logits(model, seq, use_cache=False)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


# --- shaped: the same math as sigprop's decoder, with and without the KV cache ----------------

def copy_sigprop_into_gpt2(sp: torch.nn.Module, model: torch.nn.Module) -> None:
    """sigprop DecoderLM (bias=True) → HF GPT-2. GPT-2's Conv1D stores W as (in, out), so every
    weight is transposed; c_attn is [W_Q; W_K; W_V] concatenated along the output dimension."""
    t = model.transformer
    with torch.no_grad():
        t.wte.weight.copy_(sp.embed.tok.weight)
        t.wpe.weight[: sp.embed.pos.num_embeddings].copy_(sp.embed.pos.weight)
        for block, ours in zip(t.h, sp.stack.blocks):
            a, m = ours.attn.fn, ours.mlp.fn
            block.attn.c_attn.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).T)
            block.attn.c_attn.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            for conv, lin in ((block.attn.c_proj, a.o_proj), (block.mlp.c_fc, m.fc1), (block.mlp.c_proj, m.fc2)):
                conv.weight.copy_(lin.weight.T)
                conv.bias.copy_(lin.bias)
            for norm, theirs in ((block.ln_1, ours.attn.norm), (block.ln_2, ours.mlp.norm)):
                if theirs is not None:
                    norm.load_state_dict(theirs.state_dict())
        if not isinstance(sp.stack.final_norm, torch.nn.Identity):
            t.ln_f.load_state_dict(sp.stack.final_norm.state_dict())


def twin_models(scheme: str, transfer: dict | None = None, **params) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A sigprop decoder and an HF GPT-2 after apply(scheme), same weights (biases and norm gains
    randomized too, so the mapping is tested), float64. ``transfer``: parametrization, base_width and
    base_depth, given to both."""
    transfer = transfer or {}
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", scheme=scheme, vocab_size=V, d_model=32, n_layers=3, n_heads=4,
                      max_seq_len=16, bias=True, activation="relu" if scheme == "shaped" else "gelu",
                      residual_gamma=params.get("gamma"), tau0=params.get("tau0", 1.0), **transfer)
    sp = build_model(cfg).double()
    with torch.no_grad():
        for p in sp.parameters():
            if p.ndim == 1:
                p.normal_(0.0, 0.5)
    model = gpt2(3, activation_function="gelu")          # exact-erf GeLU, as sigprop's nn.GELU
    hf.apply(model, scheme, **params, **transfer)
    model.double().eval()
    copy_sigprop_into_gpt2(sp, model)
    return sp, model


@pytest.mark.parametrize("scheme, params, transfer", [
    ("shaped", dict(gamma=0.3, tau0=0.7), None), ("dslm", dict(), None),
    # μP's attention (√d_head₀/d_head) and tied-logit scales and the α-family's branch multipliers (L₀/L)^α
    ("dslm", dict(), dict(parametrization="mup", base_width=16)),
    ("depth_mup", dict(), dict(parametrization="mup", base_width=16, base_depth=1)),
    ("completep", dict(), dict(base_depth=1))])
def test_gpt2_equals_sigprop_decoder_with_and_without_cache(scheme, params, transfer):
    sp, model = twin_models(scheme, transfer, **params)
    ids = torch.randint(0, V, (3, 16))
    want = sp(ids)
    for got in (logits(model, ids), cached_logits(model, ids)):
        assert (got - want).abs().max().item() <= 1e-8 * want.abs().max().item()


@pytest.mark.parametrize("scheme, params, transfer", [
    ("shaped", dict(gamma=0.3), None), ("depth_mup", dict(), dict(parametrization="mup", base_width=16, base_depth=1))])
def test_diagnose_equals_measure_on_twin_models(tmp_path, scheme, params, transfer):
    """Every Record field, the largest attention logit included (μP: QKᵀ·√d_head₀/d_head), to 1e-8."""
    pytest.importorskip("matplotlib")
    sp, model = twin_models(scheme, transfer, **params)
    ids = torch.randint(0, V, (4, 16))
    ours, theirs = hf.diagnose(model, ids, seed=3, plot=tmp_path / "hf.png"), measure(sp, ids, seed=3)
    assert (tmp_path / "hf.png").stat().st_size > 0
    assert [(r.layer, r.sublayer, r.stack) for r in ours] == [(r.layer, r.sublayer, r.stack) for r in theirs]
    for a, b in zip(ours, theirs):
        for field in ("fwd_mean", "fwd_var", "token_corr", "grad_var", "stable_rank", "attn_entropy", "max_logit"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None) == (y is None), field
            assert x is None or x == pytest.approx(y, rel=1e-8, abs=1e-12), (a.layer, a.sublayer, field)


# --- diagnose: .grad as found, eval or train mode, the prediction of that mode ----------------

@pytest.mark.parametrize("fill", ["zeros", "random"])
def test_diagnose_leaves_existing_grads_exactly_as_found(fill):
    torch.manual_seed(0)
    model = gpt2(2).double()
    ids = torch.randint(0, V, (2, 16))
    clean = hf.diagnose(model, ids)
    grads_as_found(model, fill, lambda: hf.diagnose(model, ids))
    assert hf.diagnose(model, ids) == clean


def dropout_gpt2(p: float, scheme: str | None = None, layers: int = 2, d: int = 32) -> torch.nn.Module:
    """A GPT-2 with dropout ``p`` on the embeddings, the residual branches and the attention probabilities, as
    built (train mode); after ``apply(scheme)`` when given."""
    model = gpt2(layers, d=d, resid_pdrop=p, embd_pdrop=p, attn_pdrop=p).double()
    if scheme is not None:
        hf.apply(model, scheme)
    return model


def test_diagnose_runs_in_eval_mode_by_default_and_restores_the_models_mode():
    torch.manual_seed(0)
    model = dropout_gpt2(0.1)
    assert model.training                                     # as transformers builds it
    ids = torch.randint(0, V, (4, 16))
    first = hf.diagnose(model, ids)
    assert hf.diagnose(model, ids) == first                   # dropout off: the same records
    assert all(m.training for m in model.modules())
    train = [hf.diagnose(model, ids, mode="train") for _ in range(2)]
    assert train[0] != train[1] and train[0] != first        # dropout on: new masks each call
    model.eval()
    model.transformer.h[0].train()                            # a mixed state comes back module by module
    state = {name: m.training for name, m in model.named_modules()}
    for mode in ("eval", "train"):
        hf.diagnose(model, ids, mode=mode)
        assert {name: m.training for name, m in model.named_modules()} == state
    with pytest.raises(ValueError, match=r"mode must be one of \['eval', 'train'\], got 'inference'"):
        hf.diagnose(model, ids, mode="inference")


def plotted(monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module, ids: torch.Tensor, mode: str, tmp_path
            ) -> tuple[dict, str]:
    """The curves and title `diagnose(..., plot=...)` hands to `plot_records` in ``mode``."""
    seen = {}
    module = importlib.import_module("sigprop.hf.diagnose")
    monkeypatch.setattr(module, "plot_records", lambda curves, path, title: seen.update(curves=curves, title=title))
    hf.diagnose(model, ids, plot=tmp_path / "p.png", mode=mode)
    return seen["curves"], seen["title"]


def test_the_overlaid_prediction_is_for_the_mode_measured(monkeypatch, tmp_path):
    """Shaped GPT-2 (its init does not read the dropout rate), p = 0.2: each mode's overlay is `hf.predict` in that
    mode, walked from the modules (train: dropout maps at p on the embeddings, the branches and the attention
    probabilities; eval: none); each follows the measurement of its own mode and misses the other's (the
    stream's variance grows by ~1/(1 − p) per branch in train mode)."""
    torch.manual_seed(0)
    model = dropout_gpt2(0.2, "shaped", layers=6, d=64)
    ids = torch.randint(0, V, (8, 32))
    curves = {mode: plotted(monkeypatch, model, ids, mode, tmp_path)[0] for mode in ("eval", "train")}
    for mode in ("eval", "train"):
        assert curves[mode]["predicted"] == hf.predict(model, ids, mode)

    def error(measured: list, predicted: list) -> float:      # mean relative error of the sublayer variances
        pairs = [(m.fwd_var, p.fwd_var) for m, p in zip(measured, predicted) if m.layer > 0]
        return statistics.mean(abs(m / p - 1) for m, p in pairs)

    for mode, other in (("eval", "train"), ("train", "eval")):
        assert error(curves[mode]["measured"], curves[mode]["predicted"]) < 0.05, mode
        assert error(curves[mode]["measured"], curves[other]["predicted"]) > 0.15, mode


def test_eval_mode_predicts_the_init_at_p_with_the_dropout_off(monkeypatch, tmp_path):
    """DSLM's init carries 1 − p: eval mode predicts the model initialized at p with its dropout maps off. Over
    8 networks (p = 0.1, 4 layers, width 64) it follows the eval measurement within 5 % on average, closer than
    the train-mode prediction or the p = 0 model's (both about 7 % off)."""
    measured, predicted = [], {}
    for seed in range(8):
        torch.manual_seed(seed)
        ids = torch.randint(0, V, (2, 32))
        model = dropout_gpt2(0.1, "dslm", layers=4, d=64)
        curves, title = plotted(monkeypatch, model, ids, "eval", tmp_path)
        assert title == "GPT2LMHeadModel, eval mode"
        measured.append([r.fwd_var for r in curves["measured"]])
        predicted["eval"] = curves["predicted"]
    predicted["train"] = plotted(monkeypatch, model, ids, "train", tmp_path)[0]["predicted"]
    predicted["p = 0"] = plotted(monkeypatch, dropout_gpt2(0.0, "dslm", layers=4, d=64), ids, "eval", tmp_path
                                 )[0]["predicted"]
    mean = [statistics.mean(column) for column in zip(*measured)]
    error = {k: statistics.mean(abs(m / r.fwd_var - 1) for m, r in zip(mean, records) if r.layer > 0)
             for k, records in predicted.items()}
    assert error["eval"] < 0.05 and error["eval"] < min(error["train"], error["p = 0"]), error


@pytest.mark.slow
def test_dslm_branches_aim_at_one_minus_p_before_their_dropout():
    """Dropout p = 0.2 (GPT-2, width 64, 12 layers, 32 tokens, 4 networks, train mode): DSLM aims each MLP branch's last
    linear map at 1 − p, so that the branch after its dropout (variance × 1/(1 − p)) is at 1."""
    before, after = [], []
    for seed in range(4):
        torch.manual_seed(seed)
        model = gpt2(12, d=64, resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.0).double()
        hf.apply(model, "dslm", seq_len=32)
        ids = zipf_ids(8, 32, seed + 1)
        before += [r.fwd_var for r in measure(model, ids, blocks=r"transformer\.h\.\d+\.mlp\.c_proj")]
        after += [r.fwd_var for r in measure(model, ids, blocks=r"transformer\.h\.\d+\.mlp\.dropout")]
    assert 0.72 <= statistics.median(before) <= 0.88, statistics.median(before)
    assert 0.9 <= statistics.median(after) <= 1.1, statistics.median(after)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_shaped_llama_cache_rope_gqa_and_left_padding(model_type):
    torch.manual_seed(0)
    model = llama(3, model_type=model_type)
    hf.apply(model, "shaped")
    model.double().eval()
    assert all(isinstance(b.input_layernorm, torch.nn.Identity) for b in model.model.layers)
    ids = torch.randint(0, V, (2, 10))
    assert (cached_logits(model, ids) - logits(model, ids)).abs().max().item() <= 1e-10
    short = ids[1:, 4:]                                     # row 1 without its first 4 tokens ...
    padded = torch.cat([torch.zeros(1, 4, dtype=ids.dtype), short], 1)   # ... left-padded in a batch
    mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 6)], 1).long()
    gen = model.generate(torch.cat([ids[:1], padded]), attention_mask=torch.cat([torch.ones(1, 10).long(), mask]),
                         max_new_tokens=4, do_sample=False)
    assert torch.equal(gen[1, 10:], model.generate(short, max_new_tokens=4, do_sample=False)[0, 6:])


def test_shaped_refuses_masks_it_cannot_center():
    """C must be the softmax of zero logits under the same mask: windows and static caches are refused."""
    model = llama(1, model_type="mistral", sliding_window=4)
    hf.apply(model, "shaped")
    with pytest.raises(NotImplementedError, match="sliding windows"):
        model(torch.randint(0, V, (1, 10)))
    model = llama(1)
    hf.apply(model, "shaped")
    with pytest.raises(NotImplementedError, match="DynamicCache"):
        model.generate(torch.randint(0, V, (1, 5)), max_new_tokens=2, cache_implementation="static")


def test_shaped_bert_ignores_padding():
    torch.manual_seed(0)
    model = bert(3)
    hf.apply(model, "shaped")
    model.double().eval()
    ids = torch.randint(0, V, (1, 12))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=ids.dtype)], 1)
    mask = torch.cat([torch.ones(1, 12), torch.zeros(1, 4)], 1).long()
    out = logits(model, padded, attention_mask=mask)[:, :12]
    assert (out - logits(model, ids)).abs().max().item() <= 1e-10


def test_post_ln_residual_is_exactly_ln_of_alpha_x_plus_beta_f():
    torch.manual_seed(0)
    model = bert(2).double()
    hf.apply(model, "deepnorm")
    layer = model.bert.encoder.layer[1]
    out, res = layer.output, layer.sigprop_mlp_residual
    assert res.alpha.item() == pytest.approx((2 * 2) ** 0.25) and res.beta.item() == 1.0
    h, x = torch.randn(2, 5, 128, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    want = F.layer_norm(res.alpha * x + res.beta * out.dense(h), (32,), out.LayerNorm.weight, out.LayerNorm.bias,
                        out.LayerNorm.eps)
    assert torch.allclose(out(h, x), want, rtol=0, atol=1e-12)


# --- training, round trips, errors --------------------------------------------------------------

@pytest.mark.parametrize("family, scheme", [("gpt2", "dslm"), ("gpt2", "shaped"), ("bert", "dslm"),
                                            ("bert", "deepnorm"), ("bert", "shaped"), ("llama", "dslm"),
                                            ("llama", "shaped")])
def test_adamw_steps_reduce_the_loss(family, scheme):
    torch.manual_seed(0)
    model = MODELS[family](4)
    hf.apply(model, scheme, **({"learn_residual": True} if scheme == "shaped" else {}))
    ids = torch.randint(0, V, (8, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("scheme", ["dslm", "shaped"])
def test_reinit_false_restores_a_saved_model(scheme):
    torch.manual_seed(0)
    model = gpt2(2)
    hf.apply(model, scheme, learn_residual=True)
    state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    fresh = gpt2(2)
    hf.apply(fresh, scheme, learn_residual=True, reinit=False)
    fresh.load_state_dict(state)
    ids = torch.randint(0, V, (2, 8))
    assert torch.equal(logits(model.eval(), ids), logits(fresh.eval(), ids))


def test_unsupported_models_and_schemes_raise_clear_errors():
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1,
                                                             ffn_dim=32, num_attention_heads=2, word_embed_proj_dim=16))
    with pytest.raises(ValueError, match=r"model_type in \('gpt2', 'bert', 'llama'.*got OPTForCausalLM.*'opt'"):
        hf.apply(opt, "dslm")
    with pytest.raises(ValueError, match="deepnorm.*Post-LN.*'bert'"):
        hf.apply(gpt2(1), "deepnorm")
    with pytest.raises(ValueError, match="scheme must be one of"):
        hf.apply(gpt2(1), "preln")
    with pytest.raises(ValueError, match="seq_len=16 is not used by scheme 'shaped'"):
        hf.apply(gpt2(1), "shaped", seq_len=16)
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        hf.apply(gpt2(1), "dslm", seq_len=0)
    with pytest.raises(ValueError, match="argument k must be a finite number, got nan"):
        hf.apply(gpt2(1), "dslm", k=float("nan"))
    with pytest.raises(ValueError, match="argument c_plus must be a finite number, got inf"):
        hf.apply(gpt2(1), "shaped", c_plus=float("inf"))
    with pytest.raises(ValueError, match="shaping='learn' is not used by scheme 'dslm'"):
        hf.apply(gpt2(1), "dslm", shaping="learn")
    with pytest.raises(ValueError, match="tau0=0.5 is not used by scheme 'deepnorm'"):
        hf.apply(bert(1), "deepnorm", tau0=0.5)
    with pytest.raises(ValueError, match="shaping='recover' needs its .* schedule"):
        hf.apply(gpt2(1), "shaped", shaping="recover")
    model = gpt2(1)
    hf.apply(model, "shaped", shaping="learn")                    # γ₁, γ₂ and s₋ train, from their shaped values
    learned = {n: p for n, p in model.named_parameters() if n.endswith(("gamma1", "gamma2", "s_minus"))}
    assert len(learned) == 3 and all(p.requires_grad for p in learned.values())
    assert learned["transformer.h.0.attn.sigprop_shape.gamma1"].eq(1.0).all()
    model = gpt2(1)
    hf.apply(model, "dslm")
    with pytest.raises(RuntimeError, match="already applied"):
        hf.apply(model, "dslm")


def test_every_parameter_is_initialized_by_its_role():
    torch.manual_seed(0)
    model = gpt2(4, d=64)
    hf.apply(model, "shaped")
    t = model.transformer
    assert t.h[0].attn.c_attn.weight[:, :64].std().item() == pytest.approx(1 / 8, rel=0.05)       # Q: 1/√d
    assert t.h[0].mlp.c_proj.weight.std().item() == pytest.approx(1 / 16, rel=0.05)             # FFN out: 1/√d_ff
    assert t.wte.weight.std().item() == pytest.approx(math.sqrt(0.5), rel=0.05)                 # 2 tables
    assert all(b.attn.c_attn.bias.abs().max() == 0 for b in t.h)
    model = llama(2, d=64)
    hf.apply(model, "dslm")
    down = model.model.layers[0].mlp.down_proj.weight
    assert down.var().item() == pytest.approx(1 / (192 * gated.gate_moment(F.silu)), rel=0.05)  # gated rule
    assert model.model.embed_tokens.weight.var().item() == pytest.approx(1.0, rel=0.05)         # 1 table
    model = gpt2(1)
    model.transformer.h[0].mlp.extra = torch.nn.Parameter(torch.ones(3, 3))
    with pytest.raises(RuntimeError, match=r"no init rule.*transformer\.h\.0\.mlp\.extra"):
        hf.apply(model, "dslm")


# --- predict: moments walked from the HF modules, against the measurement -----------------------


def rope_off(model: torch.nn.Module) -> torch.nn.Module:
    """A LLaMA whose rotary embedding is the identity (every frequency zero)."""
    model.model.rotary_emb.inv_freq.zero_()
    return model


@pytest.mark.parametrize("name", ["gelu_tanh", "silu"])
def test_smooth_activation_quadrature_is_converged_and_matches_monte_carlo(name):
    """128-node Gauss–Hermite against 170 nodes (≤ 1e-6 up to E x² = SMOOTH_SECOND_MAX, beyond it refused), and
    the five expectations against 10⁶ correlated Gaussian pairs (5 standard errors)."""
    fine_x, fine_w = np.polynomial.hermite_e.hermegauss(170)
    for mean, var, corr in ((0.0, 0.3, 0.2), (0.4, 1.0, 0.7), (0.0, 7.9, 0.95)):
        coarse = Smooth(name).expectations(Moments(mean, var, corr))
        s, r = math.sqrt(var), corr
        w = fine_w / fine_w.sum()
        f, df = pointwise.SMOOTH[name](mean + s * fine_x)
        fu, dfu = pointwise.SMOOTH[name](mean + s * fine_x[:, None])
        fv, dfv = pointwise.SMOOTH[name](mean + s * (r * fine_x[:, None] + math.sqrt(1 - r * r) * fine_x[None, :]))
        ww = w[:, None] * w[None, :]
        fine = (w @ f, w @ (f * f), (ww * fu * fv).sum(), w @ (df * df), (ww * dfu * dfv).sum())
        assert np.allclose(coarse, fine, rtol=1e-6, atol=0), (mean, var, corr)
    g = torch.Generator().manual_seed(0)
    u, e = torch.randn(2, 10 ** 6, generator=g, dtype=torch.float64)
    mean, var, r = 0.2, 1.5, 0.6
    a, b = mean + math.sqrt(var) * u, mean + math.sqrt(var) * (r * u + math.sqrt(1 - r * r) * e)
    fa, dfa = (torch.from_numpy(t) for t in pointwise.SMOOTH[name](a.numpy()))
    fb, dfb = (torch.from_numpy(t) for t in pointwise.SMOOTH[name](b.numpy()))
    act = F.gelu if name == "gelu_tanh" else F.silu
    assert torch.allclose(fa, act(a, approximate="tanh") if name == "gelu_tanh" else act(a), atol=1e-12)
    want = Smooth(name).expectations(Moments(mean, var, r))
    for got, sample in zip(want, (fa, fa * fa, fa * fb, dfa * dfa, dfa * dfb)):
        assert abs(got - sample.mean().item()) < 5 * sample.std().item() / 1e3
    with pytest.raises(NotImplementedError, match="beyond the range its quadrature resolves"):
        Smooth(name).fwd(Moments(0.0, 9.0, 0.0))


def test_gated_mlp_map_matches_monte_carlo():
    """W_d(silu(W_g x) ⊙ W_u x) on RMS-normalized tokens with correlation 0.4: output variance and correlation,
    and the input gradient's variance and correlation for an output gradient of correlation 0.3, against 200
    weight draws (4 standard errors)."""
    torch.manual_seed(0)
    d, d_ff, L, r, rg = 64, 192, 16, 0.4, 0.3
    vg, vu, vd = 1.5 / d, 0.8 / d, 1.2 / d_ff
    fwd, corr, gvar, gcorr = [], [], [], []
    for _ in range(200):
        x = (math.sqrt(r) * torch.randn(1, d, dtype=torch.float64)
             + math.sqrt(1 - r) * torch.randn(L, d, dtype=torch.float64))
        x = (x * math.sqrt(d) / x.norm(dim=-1, keepdim=True)).requires_grad_()
        wg, wu = (torch.randn(d, d_ff, dtype=torch.float64) * math.sqrt(v) for v in (vg, vu))
        wd = torch.randn(d_ff, d, dtype=torch.float64) * math.sqrt(vd)
        y = (F.silu(x @ wg) * (x @ wu)) @ wd
        g = (math.sqrt(rg) * torch.randn(1, d, dtype=torch.float64)
             + math.sqrt(1 - rg) * torch.randn(L, d, dtype=torch.float64))
        (y * g).sum().backward()
        off = ~torch.eye(L, dtype=torch.bool)
        fwd.append(y.square().mean().item())
        corr.append((y @ y.T)[off].mean().item() / d)
        gvar.append(x.grad.square().mean().item())
        gcorr.append((x.grad @ x.grad.T)[off].mean().item() / d)
    mlp = GatedMLP(d, d_ff, vg, vu, vd, Smooth("silu"))
    m_in = Moments(0.0, 1.0, r)
    out = mlp.fwd(m_in)
    back = mlp.bwd(m_in, Moments(0.0, 1.0, 0.0, grad_var=1.0, grad_corr=rg))
    for samples, want in ((fwd, out.var), (corr, out.cov), (gvar, back.grad_var), (gcorr, back.grad_cov)):
        t = torch.tensor(samples)
        assert abs(t.mean().item() - want) < 4 * t.std().item() / math.sqrt(len(t)) + 0.01 * abs(want), (t.mean(), want)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_hf_init_rule_matches_the_realized_weights(family):
    """The family's `hf_init_std` (read from transformers' `_init_weights`) against the empirical variance of
    every backbone weight of a plain model, width 128, 4 layers (5 standard errors); GPT-2's c_proj is re-drawn at
    0.02/√(2·n_layer), far from 0.02."""
    torch.manual_seed(0)
    model = MODELS[family](4, d=128)
    fam = family_of(model)
    seen = 0
    for piece in fam.pieces(model.base_model):
        if piece.role in ("bias", "norm"):
            continue
        w = piece.tensor.detach().double()
        want = fam.hf_init_std(model.config, piece.role) ** 2
        assert abs(w.square().mean().item() / want - 1) < 5 * math.sqrt(2 / w.numel()), (piece.role, piece.layer)
        seen += 1
    assert seen > 10
    if family == "gpt2":
        assert fam.hf_init_std(model.config, "o") == pytest.approx(0.02 / math.sqrt(8))


def relative_errors(family: str, scheme: str | None, seeds: int = 12, layers: int = 3, d: int = 64
                    ) -> tuple[list[float], list[float]]:
    """|measured / predicted − 1| of the forward variance (sublayers) and the gradient variance (every record):
    `diagnose` averaged over ``seeds`` networks on one batch of 8 × 32 uniform ids, against `hf.predict`."""
    ids = torch.randint(0, V, (8, 32), generator=torch.Generator().manual_seed(100))
    runs = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = MODELS[family](layers, d=d)
        if scheme is not None:
            hf.apply(model, scheme)
        runs.append(hf.diagnose(model, ids, attention_stats=False))
        predicted = hf.predict(model, ids)
    assert [(r.layer, r.sublayer, r.stack) for r in predicted] == [(r.layer, r.sublayer, r.stack) for r in runs[0]]
    assert all(r.source == "predicted" for r in predicted)
    mean = lambda field, i: statistics.mean(getattr(run[i], field) for run in runs)
    fwd = [abs(mean("fwd_var", i) / p.fwd_var - 1) for i, p in enumerate(predicted) if p.layer > 0]
    grad = [abs(mean("grad_var", i) / p.grad_var - 1) for i, p in enumerate(predicted)]
    return fwd, grad


@pytest.mark.parametrize("family, scheme", [
    pytest.param(family, scheme, id=f"{family}-{scheme}",
                 marks=[pytest.mark.slow] if family == "llama" and scheme else [])       # RoPE's sampled map: seconds
    for scheme in (None, "dslm", "shaped") for family in ("gpt2", "llama", "bert")])
def test_walked_prediction_matches_the_measurement(family, scheme):
    """Plain (HF's own init, read from the config), after apply("dslm") and after apply("shaped"): width 64, 3
    layers, 32 uniform tokens, 12 networks (per-point MC s.e. ~1–3 %). Median error of the sublayers' forward
    variance and of the gradient variance ≤ 10 % (measured: forward ≤ 4.5 %, LLaMA plain and DSLM largest, from
    causal position dependence, the same with RoPE off; gradient ≤ 7 %). GPT-2 plain runs its "gelu_new" through
    `Smooth`; LLaMA with its RoPE (`RopeAttention`), GQA 4 query / 2 key-value heads, SwiGLU, untied head; BERT
    Post-LN with its MLM head."""
    fwd, grad = relative_errors(family, scheme)
    assert statistics.median(fwd) <= 0.10, fwd
    assert statistics.median(grad) <= 0.10, grad


@pytest.mark.parametrize("scheme, transfer", [("dslm", {}), ("shaped", {}),
                                              ("depth_mup", dict(parametrization="mup", base_width=16, base_depth=1))])
def test_gpt2_walk_after_apply_equals_the_mirrored_sigprop_model(scheme, transfer):
    """GPT-2 with exact GeLU after apply is sigprop's decoder: the walk over the HF modules gives the prediction of
    the mirrored `ModelConfig` built by sigprop (eval mode, dropout 0.1 in the config, so DSLM's init carries it)."""
    torch.manual_seed(0)
    model = gpt2(3, d=64, activation_function="gelu", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    cfg = hf.apply(model, scheme, **transfer)
    ids = torch.randint(0, V, (4, 32))
    ours = hf.predict(model, ids)
    mirror = build_model(cfg, device="meta").eval()
    theirs = sigprop_predict(mirror, seq_len=32, token_collision=hf.walk.collision(ids))
    assert [(r.layer, r.sublayer, r.stack) for r in ours] == [(r.layer, r.sublayer, r.stack) for r in theirs]
    for a, b in zip(ours, theirs):
        for field in ("fwd_mean", "fwd_var", "token_corr", "grad_var"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-9, abs=1e-12), (a.layer, field)


@pytest.mark.parametrize("scheme", [None, "dslm", "shaped"])
def test_llama_with_rope_walked_prediction_is_within_monte_carlo_error(monkeypatch, tmp_path, scheme):
    """A one-block LLaMA with its RoPE (width 64, GQA, 32 causal uniform ids), plain and after apply: `diagnose`
    overlays the walked prediction, and its forward variance per sublayer, against the mean over 16 networks,
    has a median relative error within 4 of those means' median relative standard errors (the map's own
    sampling error, ≲ 0.3 %, is far below them). Deeper LLaMA records carry the exchangeable chain's causal
    position error, RoPE on or off (`test_walked_prediction_matches_the_measurement`)."""
    ids = torch.randint(0, V, (8, 32), generator=torch.Generator().manual_seed(100))
    runs = []
    for seed in range(16):
        torch.manual_seed(seed)
        model = llama(1, d=64)
        if scheme is not None:
            hf.apply(model, scheme)
        runs.append(hf.diagnose(model, ids, attention_stats=False))
    curves, title = plotted(monkeypatch, model, ids, "eval", tmp_path)
    assert "predicted" in curves and not title.endswith("(measured only)")
    errors, ses = [], []
    for i, p in enumerate(curves["predicted"]):
        if p.layer == 0:
            continue
        t = torch.tensor([run[i].fwd_var for run in runs], dtype=torch.float64)
        errors.append(abs(t.mean().item() / p.fwd_var - 1))
        ses.append(t.std().item() / t.mean().item() / math.sqrt(len(t)))
    assert statistics.median(errors) <= 4 * statistics.median(ses), (errors, ses)


def test_rope_is_walked_from_the_rotary_module_and_run_time_rules_are_refused(monkeypatch, tmp_path):
    """LLaMA's attention walks as `RopeAttention` with the rotary module's own frequencies (every frequency
    zero: the closed-form `Attention`); a rotary rule whose frequencies change with the sequence length at run
    time is refused by name, and `diagnose` then plots the measurement only."""
    model = llama(2)
    ids = torch.randint(0, V, (2, 16))
    walk = hf.walk.Walk(model, ids)
    block = model.model.layers[0]
    (mix,) = walk.family.branch_maps(walk, block, "attn", 16)
    assert isinstance(mix, RopeAttention)
    assert mix.frequencies == tuple(model.model.rotary_emb.inv_freq.double().tolist())
    (mix,) = walk.family.branch_maps(walk, rope_off(model).model.layers[0], "attn", 16)
    assert isinstance(mix, Attention)
    dynamic = llama(2, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(NotImplementedError, match="RoPE type 'dynamic' has no moment map"):
        hf.predict(dynamic, ids)
    with pytest.warns(UserWarning, match="RoPE type 'dynamic' has no moment map"):
        curves, title = plotted(monkeypatch, dynamic, ids, "eval", tmp_path)
    assert "predicted" not in curves and title.endswith("(measured only)")


def test_predict_refuses_what_it_cannot_map():
    torch.manual_seed(0)
    ids = torch.randint(0, V, (2, 16))
    with pytest.raises(NotImplementedError, match="padding attention_mask"):
        hf.predict(gpt2(1), {"input_ids": ids, "attention_mask": torch.ones(2, 16).tril()})
    trained = gpt2(1)
    with torch.no_grad():
        trained.transformer.h[0].mlp.c_fc.bias.fill_(0.1)
    with pytest.raises(NotImplementedError, match="MLP c_fc has a non-zero bias"):
        hf.predict(trained, ids)
    loaded = gpt2(1)
    hf.apply(loaded, "dslm", reinit=False)
    with pytest.raises(NotImplementedError, match="no std recorded by sigprop.hf.apply"):
        hf.predict(loaded, ids)
    classifier = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, **NO_SPECIAL))
    with pytest.raises(NotImplementedError, match="BertForSequenceClassification: its head has no moment map"):
        hf.predict(classifier, ids)
    padded = bert(1, pad_token_id=0)
    with pytest.raises(NotImplementedError, match="padding id 0"):
        hf.predict(padded, torch.zeros(1, 8, dtype=torch.long))


@pytest.mark.slow
def test_a_meta_build_first_leaves_the_next_models_initialized_by_their_family():
    """In a fresh process whose first `transformers` model is built on the meta device, the next one built for real
    still gets its family's init (embedding std 0.02), not torch's defaults (std 1): the meta build must not patch
    the initializers that library keeps from its first import."""
    code = ("import torch; from sigprop import ModelConfig, build_model; "
            "cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=1, n_heads=4, max_seq_len=16, hf_family='qwen3'); "
            "build_model(cfg, 'meta'); torch.manual_seed(0); "
            "print(float(build_model(cfg).model.embed_tokens.weight.detach().std()))")
    std = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                .stdout.split()[-1])
    assert abs(std - 0.02) < 0.002
