"""`sigprop.advice`: the exponents against finite networks, the refusals, the JSON schema, the range test."""
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from sigprop import ModelConfig, build_model
from sigprop.advice import advise, lr_range_test
from sigprop.advice.advise import write_json
from sigprop.advice.exponents import (
    angle_exponents_measured,
    angle_exponents_theory,
    gradient_exponents,
    main_stack,
    model_exponent,
)
from sigprop.advice.probe import Probe, lanczos_max
from sigprop.advice.rule import OUTCOMES, STALL_MARGIN, WINDOW, Rule, decide, limits, one_step_optimum, outcome
from sigprop.diagnostics import measure
from sigprop.models.predict import model_chain, predict
from sigprop.train.config import DataConfig, RunConfig, TrainConfig


def _exponents(cfg: ModelConfig, batch: int = 32, seed: int = 0) -> tuple[float, float, float, float]:
    torch.manual_seed(seed)
    model = build_model(cfg).double()
    ids = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len))
    predicted = predict(model)
    la = model_exponent(angle_exponents_theory(model_chain(model)))
    lam = model_exponent(angle_exponents_measured(model, ids, predicted[0].fwd_var, seed=seed))
    lg = model_exponent(gradient_exponents(main_stack(predicted)))
    lgm = model_exponent(gradient_exponents(main_stack(measure(model, ids, seed=seed))))
    return la, lam, lg, lgm


@pytest.mark.parametrize("scheme", ["preln", "postln", "dslm", "shaped"])
def test_exponents_from_maps_match_a_finite_encoder(scheme):
    """λ_a and λ_g of an 8-block, width-128 encoder: the maps' values against one network's measurement on
    32 sequences of 16 tokens (the estimates' spread over seeds is below 0.01 at these sizes)."""
    cfg = ModelConfig(arch="encoder", scheme=scheme, d_model=128, n_layers=8, n_heads=4, max_seq_len=16,
                      vocab_size=512)
    la, lam, lg, lgm = _exponents(cfg)
    assert abs(la - lam) <= 0.02 + 0.05 * abs(la)
    assert abs(lg - lgm) <= 0.02 + 0.05 * abs(lg)


@pytest.mark.parametrize("scheme", ["preln", "postln", "dslm"])
def test_gradient_exponent_from_maps_matches_a_finite_decoder(scheme):
    """λ_g of a causal decoder agrees as well; its λ_a is off by the causal rows' position dependence, which the
    exchangeable maps average (docs/advise.md), so only its sign is checked."""
    cfg = ModelConfig(arch="decoder", scheme=scheme, d_model=128, n_layers=8, n_heads=4, max_seq_len=16,
                      vocab_size=512)
    la, lam, lg, lgm = _exponents(cfg)
    assert abs(lg - lgm) <= 0.02 + 0.05 * abs(lg)
    assert la < 0 and lam < 0


def test_angle_exponent_needs_the_small_angle():
    """The exponent is the linearisation at ρ = 1: traced from an angle that is not small (ρ = 0.5) the same
    ratio misses the finite network's small-angle growth."""
    cfg = ModelConfig(arch="encoder", scheme="preln", d_model=128, n_layers=8, n_heads=4, max_seq_len=16,
                      vocab_size=512)
    torch.manual_seed(0)
    model = build_model(cfg).double()
    ids = torch.randint(0, 512, (32, 16))
    measured = model_exponent(angle_exponents_measured(model, ids, predict(model)[0].fwd_var))
    wide = model_exponent(angle_exponents_theory(model_chain(model), delta=0.5))
    assert abs(wide - measured) > 0.05


def test_lanczos_finds_the_top_eigenvalue():
    """The top Ritz value of a symmetric matrix with a separated top eigenvalue, from 6 steps."""
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(50, 50, generator=g, dtype=torch.float64))
    eig = torch.cat([torch.tensor([10.0, -3.0]), torch.rand(48, generator=g, dtype=torch.float64)])
    a = q @ torch.diag(eig) @ q.T
    top = lanczos_max(lambda v: a @ v, torch.randn(50, generator=g, dtype=torch.float64), 6)
    assert top == pytest.approx(10.0, rel=1e-3)


def _tiny(scheme: str = "preln", **kw) -> tuple[ModelConfig, list[torch.Tensor]]:
    cfg = ModelConfig(scheme=scheme, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, vocab_size=64, **kw)
    g = torch.Generator().manual_seed(0)
    return cfg, [torch.randint(0, 64, (4, 17), generator=g) for _ in range(2)]


def test_json_schema(tmp_path):
    """`--json` writes exactly the documented keys and types (plus the report)."""
    cfg, batches = _tiny()
    a = advise(cfg, lrs=[1e-3, 1e-1], batches=batches, steps=50)
    path = tmp_path / "advice.json"
    write_json(a, path)
    d = json.loads(path.read_text())
    assert {"recommended_lr", "lr_interval", "max_stable_lr", "predictions", "exponents", "cost_s"} <= set(d)
    assert isinstance(d["recommended_lr"], float) and isinstance(d["max_stable_lr"], float)
    lo, hi = d["lr_interval"]
    assert 0 < lo <= d["recommended_lr"] <= hi and d["recommended_lr"] <= d["max_stable_lr"]
    assert [p["lr"] for p in d["predictions"]] == [1e-3, 1e-1]
    assert all(p["outcome"] in OUTCOMES and isinstance(p["reason"], str) and p["reason"] for p in d["predictions"])
    assert set(d["exponents"]) == {"lambda_a", "lambda_g"} and all(math.isfinite(v) for v in d["exponents"].values())
    assert d["cost_s"] > 0
    assert "max stable lr" in a.table()


def test_an_lr_above_the_limit_diverges():
    cfg, batches = _tiny()
    a = advise(cfg, batches=batches, steps=50, lrs=[1.0])
    top = a.max_stable_lr * 4
    b = advise(cfg, batches=batches, steps=50, lrs=[top])
    assert b.predictions[0]["outcome"] == "diverges" and "max stable lr" in b.predictions[0]["reason"]


def _probe(line, slope=100.0, loss0=6.0, sharpness=1e3, corr=0.5):
    from sigprop.records import Record

    last = Record(layer=1, sublayer="mlp", fwd_mean=0.0, fwd_var=1.0, token_corr=corr, grad_var=1.0)
    return Probe(loss0=loss0, slope=slope, sharpness=sharpness, out_change=10.0, layer_change=20.0,
                 median_layer_change=5.0, logit_growth=0.0,
                 corr_growth=0.0, line=tuple(line), records=(last,), passes=1.0)


def test_one_step_optimum_is_the_vertex_in_log_lr():
    """Exact for a loss quadratic in log lr; an end point when the lowest loss is at an end of the profile."""
    grid = [2.0 ** k for k in range(-12, 2)]
    for centre in (1.3e-3, 0.02, 0.11):
        p = _probe([(x, 5.0 + (math.log(x / centre)) ** 2) for x in grid])
        assert one_step_optimum(p) == pytest.approx(centre, rel=1e-9)
    assert one_step_optimum(_probe([(x, 5.0 - x) for x in grid])) == grid[-1]
    assert limits(_probe([(x, 5.0 + 0.1 * x) for x in grid]), 0.9)["one-step loss"] == math.inf   # never above loss0


def test_decision_window_and_outcomes():
    """η_max = top · edge scale, η_min = κ·gap/(slope·A); outside [η_min, η_max] a run diverges or stalls, an
    empty window or a collapsed stack stalls at every lr, and the advice is clipped into the window."""
    grid = [2.0 ** k for k in range(-12, 2)]
    p = _probe([(x, 5.0 + (math.log(x / 0.01)) ** 2) for x in grid], slope=100.0, loss0=6.0)
    rule = Rule(basis="one-step optimum", best=2.0, lo=0.5, hi=8.0, edge_basis="one-step optimum", top=4.0, kappa=1.0)
    d = decide(p, 0.9, area=50.0, unigram=5.1, rule=rule)
    assert d.eta_max == pytest.approx(0.04) and d.eta_min == pytest.approx((6.0 - 5.0) / (100.0 * 50.0))
    assert d.recommended == pytest.approx(0.02) and d.interval == pytest.approx((0.005, 0.04))    # hi clipped
    assert [outcome(lr, d)[0] for lr in (1e-4, 1e-3, 0.03, 0.05)] == ["stalls", "trains", "trains", "diverges"]
    slow = decide(p, 0.9, area=0.01, unigram=5.1, rule=rule)                 # a run too short to leave the plateau
    assert slow.no_window and {outcome(lr, slow)[0] for lr in (1e-4, 0.01, 1.0)} == {"stalls"}
    assert slow.recommended <= slow.interval[1] <= slow.eta_max                    # never above the stability edge
    collapsed = decide(_probe(p.line, corr=0.995), 0.9, area=50.0, unigram=5.1, rule=rule)
    assert "rank collapse" in outcome(0.01, collapsed)[1]
    with pytest.raises(ValueError, match="already below the training level"):    # no stall bound: no window
        decide(p, 0.9, area=50.0, unigram=6.0 + STALL_MARGIN, rule=dataclasses.replace(rule, basis=WINDOW))


def test_refuses_what_it_cannot_judge():
    cfg, batches = _tiny()
    with pytest.raises(ValueError, match="lrs must be positive"):
        advise(cfg, batches=batches, lrs=[-1e-3])
    with pytest.raises(ValueError, match="at least two batches"):
        advise(cfg, batches=batches[:1])
    with pytest.raises(NotImplementedError, match="neither a sigprop model nor a transformers model"):
        advise(torch.nn.Linear(4, 4), batches=batches)



def test_a_model_without_exact_maps_still_gets_an_outcome_at_every_lr(tmp_path):
    """The probe measures the finite network, so a knob the maps refuse costs only the report's exponents (NaN,
    with the reason), never the advice: a Pre-LN ViT (its class token's variance differs from its patches') on
    digits, whose stall level is the class prior's loss."""
    vit = RunConfig(ModelConfig(arch="vit", d_model=32, n_layers=2, n_heads=4), DataConfig(source="digits"),
                    train=TrainConfig(out_dir=str(tmp_path)))
    a = advise(vit, lrs=[1e-4, 1e-2, 10.0])
    assert [p["outcome"] for p in a.predictions][-1] == "diverges" and len(a.predictions) == 3
    assert math.isnan(a.lambda_a) and "class token" in a.unmapped and "class token" in a.table()
    assert abs(a.unigram_loss - math.log(10)) < 0.1                        # ten classes, about equally frequent


def _synthetic(a: float, b: float, w: float, noise: float, seed: int):
    """ℓ(η) = 1 − ½ tanh(ln(η/a)/w) + (η/b)⁴ plus noise: steepest descent per unit ln η at η = a (for b ≫ a)."""
    rng = np.random.default_rng(seed)
    return lambda lr: 1 - 0.5 * math.tanh(math.log(lr / a) / w) + (lr / b) ** 4 + noise * rng.standard_normal()


def test_range_test_finds_the_known_optimum_of_a_synthetic_loss():
    a, b, w = 1e-3, 0.3, 0.6
    loss = _synthetic(a, b, w, 0.01, 0)
    grid = np.exp(np.linspace(math.log(1e-5), math.log(1.0), 20001))
    argmin = float(grid[np.argmin([1 - 0.5 * math.tanh(math.log(x / a) / w) + (x / b) ** 4 for x in grid])])
    t = lr_range_test(loss, 1e-5, 1.0, steps=2000)
    # the EMA lags by β/(1−β) steps: 49 × ln(1e5)/1999 ≈ 0.28 in ln η, a factor 1.33; allow 1.5
    assert a / 1.5 <= t.steepest <= a * 1.5
    assert argmin / 15 <= t.min_over_10 <= argmin / 10 * 1.5
    assert len(t.lrs) < 2000                                  # stopped once the loss passed 4x its best


def test_range_test_stops_when_the_loss_explodes():
    t = lr_range_test(lambda lr: 1.0 + (lr / 1e-3) ** 2, 1e-5, 1.0, steps=300)
    assert t.smoothed[-1] > 4 * min(t.smoothed) and t.lrs[-1] < 0.1


def test_advise_on_a_transformers_gpt2_plain_and_after_apply():
    """A GPT-2 from its config (HF's init) and the same after `sigprop.hf.apply` (DSLM): the maps' λ_g agrees
    with the measured one and the advice is a finite lr inside its interval."""
    pytest.importorskip("transformers")
    import sigprop.hf as hf
    from helpers import HF_VOCAB, gpt2

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, HF_VOCAB, (8, 17), generator=g) for _ in range(2)]
    plain = gpt2(4, d=64)
    applied = gpt2(4, d=64)
    cfg = hf.apply(applied, "dslm")
    for model, kw in ((plain, {}), (applied, {"hf_config": cfg})):
        a = advise(model, batches=batches, steps=100, lrs=[1e-3], **kw)
        assert abs(a.lambda_g - a.lambda_g_measured) <= 0.03 + 0.1 * abs(a.lambda_g)
        assert a.lr_interval[0] <= a.recommended_lr <= a.lr_interval[1] <= a.max_stable_lr * (1 + 1e-12)
        assert math.isfinite(a.lambda_a) and a.lambda_a_measured is None


def test_the_command_reports_what_it_cannot_judge_in_one_line(capsys):
    """A bad lr and two usage errors: exit 2, one line naming the input, no traceback."""
    from sigprop.advice.commands import advise_main

    decoder = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_decoder.toml")
    for argv, needle in ((["--config", decoder, "--lrs", "-1"], "lrs must be positive"),
                         (["--config", decoder, "--bogus"], "unrecognized arguments"),
                         (["--config", decoder, "--budget", "x"], "--budget")):
        assert advise_main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_layer_change_is_the_largest_relative_change_of_a_weight_layer():
    """A two-layer network: the probe's layer_change is the larger of its two linears' relative output changes
    along AdamW's first step, recomputed here by hand (float64, same direction and step)."""
    from sigprop.advice.probe import Group, probe
    from sigprop.records import Record

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    x, y = torch.randn(32, 8, dtype=torch.float64), torch.randn(32, 4, dtype=torch.float64)
    loss_fn = lambda m, b: (m(b[0]) - b[1]).pow(2).mean()
    dummy = [Record(layer=1, sublayer="mlp", fwd_mean=0.0, fwd_var=1.0, token_corr=0.0, grad_var=1.0)]
    p = probe(net, [Group(list(net.parameters()), 1.0, 1e-8, 0.0)], loss_fn, lambda m, b: m(b[0]),
              lambda m, grads: dummy, (x, y), (x, y), [1e-3], iterations=1, step=1e-3)
    grads = torch.autograd.grad(loss_fn(net, (x, y)), list(net.parameters()))
    moved = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    with torch.no_grad():
        for q, w, g in zip(moved.parameters(), net.parameters(), grads):
            q.copy_(w - 1e-3 * g / (g.abs() + 1e-8))
    with torch.no_grad():
        h0, h1 = net[0](x), moved[0](x)
        first = float((h1 - h0).norm() / h0.norm()) / 1e-3
        second = float((moved[2](moved[1](h1)) - net[2](net[1](h0))).norm() / net(x).norm()) / 1e-3
    assert p.layer_change == pytest.approx(max(first, second), rel=1e-9)
    assert p.out_change == pytest.approx(second, rel=1e-9)


def test_along_the_first_step_is_where_torchs_adamw_steps():
    """`along_first_step` at S = η is the model after one step of torch's AdamW at lr η (bias-corrected first step
    g/(|g| + ε), decoupled weight decay), with two groups of different lr multipliers and decays; at S = 0 it is
    the model at init, and the model itself is left as it was."""
    from sigprop.advice.probe import Group, along_first_step

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    x, y = torch.randn(32, 8, dtype=torch.float64), torch.randn(32, 4, dtype=torch.float64)
    loss_fn = lambda m, b: (m(b[0]) - b[1]).pow(2).mean()
    first, second = list(net[0].parameters()), list(net[2].parameters())
    groups = [Group(first, 1.0, 1e-8, 0.1), Group(second, 0.5, 1e-8, 0.0)]
    init = [p.detach().clone() for p in net.parameters()]
    lr = 3e-3
    measure = lambda m: float(loss_fn(m, (x, y)).detach())
    at = along_first_step(net, groups, loss_fn, (x, y), [0.0, lr], measure)
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), init))
    assert at[0] == pytest.approx(float(measure(net)), rel=1e-12)
    opt = torch.optim.AdamW([{"params": first, "lr": lr, "weight_decay": 0.1},
                             {"params": second, "lr": 0.5 * lr, "weight_decay": 0.0}], eps=1e-8)
    loss_fn(net, (x, y)).backward()
    opt.step()
    assert at[1] == pytest.approx(float(measure(net)), rel=1e-9)


@pytest.mark.parametrize("config", ["tiny_encoder.toml", "encdec.toml"])
def test_advise_judges_an_encoder_and_an_encoder_decoder_run(config, tmp_path):
    """Masked LM and the encoder–decoder (the exponents of its encoder stack) from their run configs: finite
    exponents, maps beside the measured λ_g, an advice inside its window."""
    from sigprop.train.config import load_config

    path = Path(__file__).resolve().parents[1] / "configs" / config
    cfg = load_config(path, ["data.max_chars=60000", "model.d_model=32", "data.seq_len=16", "model.max_seq_len=16",
                             "train.batch_size=4", "train.steps=40", f"train.out_dir={tmp_path / 'run'}"])
    a = advise(cfg)
    assert math.isfinite(a.lambda_a) and abs(a.lambda_g - a.lambda_g_measured) <= 0.05 + 0.1 * abs(a.lambda_g)
    assert a.lr_interval[0] <= a.recommended_lr <= a.lr_interval[1] <= a.max_stable_lr * (1 + 1e-12)
    assert (a.lambda_a_measured is None) == (cfg.model.arch == "encdec")


def test_the_line_is_a_run_of_the_grid_around_its_minimum_with_the_whole_grids_scales():
    """The one-step loss profile is a contiguous run of the grid from below its lowest point to the first lr whose
    step raises the held-out loss above its init value; each point equals the loss of that single step taken alone,
    and the two scales read from it equal those of the whole grid (the same two-layer regression as above, whose
    profile falls, then rises)."""
    from sigprop.advice.probe import Group, probe
    from sigprop.advice.rule import one_step_limit
    from sigprop.records import Record

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    x, y = torch.randn(32, 8, dtype=torch.float64), torch.randn(32, 4, dtype=torch.float64)
    loss_fn = lambda m, b: (m(b[0]) - b[1]).pow(2).mean()
    dummy = [Record(layer=1, sublayer="mlp", fwd_mean=0.0, fwd_var=1.0, token_corr=0.0, grad_var=1.0)]
    run = lambda lrs: probe(net, [Group(list(net.parameters()), 1.0, 1e-8, 0.0)], loss_fn, lambda m, b: m(b[0]),
                            lambda m, grads: dummy, (x, y), (x, y), lrs, iterations=1)
    grid = [2.0 ** k for k in range(-12, 2)]
    p = run(grid[::-1])
    every = [run([lr]).line[0] for lr in grid]
    rise = next(i for i, (_, loss) in enumerate(every) if loss > p.loss0)
    whole = dataclasses.replace(p, line=tuple(every[:rise + 1]))
    first = grid.index(p.line[0][0])
    assert p.line == tuple(every[first:rise + 1]) and 3 <= len(p.line) < len(grid)
    assert all(loss <= p.loss0 for _, loss in p.line[:-1]) and p.line[-1][1] > p.loss0
    assert min(p.line, key=lambda point: point[1]) != p.line[0] or first == 0
    assert one_step_limit(p) == one_step_limit(whole) and one_step_optimum(p) == one_step_optimum(whole)


@pytest.mark.parametrize("profile", ["parabola", "diverges", "never rises", "rises at once"])
def test_the_line_walk_reads_the_whole_grids_scales_from_every_start(profile: str):
    """`one_step_line` from each start index of the grid gives the first rise, the lowest point and its neighbours
    of the whole grid on a profile that falls to one minimum and then rises (or blows up, or never rises)."""
    from types import SimpleNamespace

    from sigprop.advice.probe import one_step_line
    from sigprop.advice.rule import one_step_limit

    grid = [2.0 ** k for k in range(-12, 2)]
    loss0 = 5.0
    f = {"parabola": lambda lr: loss0 - 3.0 * lr + 40.0 * lr ** 2,
         "diverges": lambda lr: loss0 - 3.0 * lr + 40.0 * lr ** 2 if lr < 0.1 else math.inf,
         "never rises": lambda lr: loss0 - 3.0 * lr + 0.5 * lr ** 2,
         "rises at once": lambda lr: loss0 + lr}[profile]
    values = [f(lr) for lr in grid]
    rise = next((i for i, v in enumerate(values) if v > loss0), len(grid) - 1)
    whole = SimpleNamespace(loss0=loss0, line=tuple(zip(grid[:rise + 1], values[:rise + 1])))
    for start in range(len(grid)):
        calls: list[float] = []
        line = one_step_line(lambda lr, calls=calls: calls.append(lr) or f(lr), grid, loss0, start)
        walked = SimpleNamespace(loss0=loss0, line=line)
        assert one_step_limit(walked) == one_step_limit(whole), start
        assert one_step_optimum(walked) == one_step_optimum(whole), start
        assert len(calls) == len(set(calls)) and set(line) <= set(whole.line), start


def test_a_run_configs_held_out_batch_is_the_validation_splits_first_batch(tmp_path):
    """advise reads a held-out batch of ``train.batch_size`` sequences, the validation split's first, with the
    masks `sigprop train`'s evaluation stream draws, and reads the unigram loss on its targets."""
    from sigprop.advice.advise import run_inputs
    from sigprop.train.config import load_config
    from sigprop.train.levels import unigram_nll
    from sigprop.train.sampler import generator
    from sigprop.train.trainer import EVAL_STREAM

    path = Path(__file__).resolve().parents[1] / "configs" / "tiny_decoder.toml"
    cfg = load_config(path, ["data.max_chars=60000", "model.d_model=32", "train.batch_size=3", "train.eval_batches=4",
                             f"train.out_dir={tmp_path / 'run'}"])
    inputs = run_inputs(cfg)
    expected = inputs.data.val.batch(torch.arange(3), generator(cfg.train.seed, EVAL_STREAM))
    assert inputs.heldout.targets.shape[0] == 3 < len(inputs.data.val)
    assert torch.equal(inputs.heldout.targets, expected.targets)
    assert all(torch.equal(a, b) for a, b in zip(inputs.heldout.inputs, expected.inputs))
    vocab = inputs.data.tokenizer.vocab_size
    assert inputs.unigram == unigram_nll(inputs.data.train.tokens, expected.targets, vocab)
