"""Every input validated at the boundary, as properties (hypothesis): each generated invalid value is
refused with a ValueError naming its field; each generated valid one builds and runs finitely."""
import dataclasses
import math
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import FAST_TRAIN, train_argv
from sigprop import ModelConfig, build_model
from sigprop.cli import main
from sigprop.diagnostics.commands import DiagnoseConfig
from sigprop.models.config import USED_ONLY_BY
from sigprop.schemes import SCHEMES
from sigprop.simulate import ensemble
from sigprop.theory import sde
from sigprop.train.config import DataConfig, OptimConfig, TrainConfig
from sigprop.train.distributed import resolve_device
from sigprop.train.tokenizer import BPETokenizer

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
WRONG_TYPE = st.sampled_from([None, "1", [1], {"a": 1}, b"x"])
NOT_AN_INT = st.one_of(WRONG_TYPE, st.just(True), st.floats(allow_nan=False).filter(lambda x: x != int(x) if
                                                                                       math.isfinite(x) else True))
# scales that enter squared (τ₀, c±) live in [2^-63, 2^63] (τ₀) and [-2^63, 2^63] (c±), fields.SQUARABLE*
SQUARE_MAX = 2.0 ** 63
TAU0_BAD = st.one_of(NON_FINITE, st.floats(max_value=1 / SQUARE_MAX, exclude_max=True, allow_nan=False),
                     st.floats(min_value=SQUARE_MAX, exclude_min=True, allow_infinity=False))
C_BAD = st.one_of(NON_FINITE, st.floats(min_value=SQUARE_MAX, exclude_min=True, allow_infinity=False),
                  st.floats(max_value=-SQUARE_MAX, exclude_max=True, allow_infinity=False))

# ModelConfig numeric fields: a strategy of values outside their allowed set
MODEL_BAD_FLOATS = {
    "dropout": st.one_of(st.floats(max_value=0.0, exclude_max=True, allow_infinity=False, allow_nan=False),
                         st.floats(min_value=1.0, allow_infinity=False)),
    "tau0": TAU0_BAD,
    "c_plus": C_BAD,
    "c_minus": C_BAD,
    "residual_gamma": st.one_of(st.floats(max_value=0.0, allow_infinity=False, allow_nan=False),
                                st.floats(min_value=1.0, exclude_min=True, allow_infinity=False)),
    "dslm_k": st.floats(max_value=0.0, allow_infinity=False, allow_nan=False),
    "dslm_r0": st.one_of(st.floats(max_value=0.0, exclude_max=True, allow_infinity=False, allow_nan=False),
                         st.floats(min_value=1.0, exclude_min=True, allow_infinity=False)),
}
MODEL_INT_FIELDS = ["vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "d_ff", "image_size",
                    "patch_size", "in_channels", "n_classes"]
MODEL_FLOAT_FIELDS = ["dropout", "tau0", "c_plus", "c_minus", "dslm_k", "dslm_r0", "residual_gamma"]
MODEL_BOOL_FIELDS = ["bias", "learn_residual"]
MODEL_CHOICE_FIELDS = ["arch", "scheme", "norm_placement", "norm_type", "activation", "shaping", "qk_scaling",
                       "hf_family"]
# a base under which every field above is used (so only the value itself can be wrong)
BASE = {"shaped": dict(scheme="shaped", vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_seq_len=8),
        "dslm": dict(scheme="dslm", vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_seq_len=8,
                     activation="shaped_relu"),
        "vit": dict(arch="vit", d_model=16, n_heads=2, n_layers=1)}
HOME = {**{f: "dslm" for f in ("dslm_k", "dslm_r0", "residual_gamma", "norm_type", "dropout", "bias",
                               "learn_residual", "vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len",
                               "d_ff", "arch", "norm_placement", "activation", "shaping", "c_plus", "c_minus",
                               "hf_family")},
        **{f: "shaped" for f in ("tau0", "qk_scaling", "scheme")},
        **{f: "vit" for f in ("image_size", "patch_size", "in_channels", "n_classes")}}


@st.composite
def invalid_model_value(draw):
    kind = draw(st.sampled_from(["int", "float", "bool", "choice"]))
    if kind == "int":
        field = draw(st.sampled_from(MODEL_INT_FIELDS))
        value = draw(st.one_of(NOT_AN_INT, st.integers(max_value=0)))
    elif kind == "float":
        field = draw(st.sampled_from(MODEL_FLOAT_FIELDS))
        value = draw(st.one_of(NON_FINITE, WRONG_TYPE, st.just(True), MODEL_BAD_FLOATS.get(field, NON_FINITE)))
    elif kind == "bool":
        field = draw(st.sampled_from(MODEL_BOOL_FIELDS))
        value = draw(st.one_of(WRONG_TYPE, st.sampled_from(["no", "false", 0, 1, 0.0])))
    else:
        field = draw(st.sampled_from(MODEL_CHOICE_FIELDS))
        value = draw(st.one_of(WRONG_TYPE, st.text(min_size=1, max_size=8).filter(
            lambda s: s not in ("decoder", "encoder", "encdec", "vit", "pre", "post", "none", "relu", "gelu",
                                "shaped_relu", "fixed", "recover", "learn", "temperature", "weights", "init",
                                "layernorm", "rmsnorm", "vanilla", "shaped", "dslm", "deepnorm", "gpt2", "llama"))))
    if value is None and field in ("norm_placement", "d_ff", "dslm_r0", "residual_gamma", "hf_family"):  # the default
        value = "None"
    return field, value


@SETTINGS
@given(invalid_model_value())
def test_model_config_refuses_every_invalid_value_naming_the_field(case):
    field, value = case
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}\b"):
        ModelConfig(**{**BASE[HOME[field]], field: value})


@SETTINGS
@given(st.sampled_from(sorted(USED_ONLY_BY)), st.sampled_from(["preln", "shaped", "dslm"]),
       st.sampled_from(["decoder", "encoder", "vit"]))
def test_a_field_the_model_ignores_is_refused_unless_default(field, scheme, arch):
    base = dict(arch=arch, scheme=scheme, d_model=16, n_heads=2, n_layers=1)
    cfg = ModelConfig(**base)
    used = USED_ONLY_BY[field][1](cfg)
    default = {f.name: f.default for f in dataclasses.fields(ModelConfig)}[field]
    other = {"vocab_size": 300, "max_seq_len": 16, "n_dec_layers": 3, "norm_type": "rmsnorm", "tau0": 2.0,
             "qk_scaling": "weights", "c_plus": 0.5, "c_minus": -2.0, "shaping": "learn", "dslm_k": 3.0,
             "dslm_r0": 0.2, "image_size": 12, "patch_size": 4, "in_channels": 2, "n_classes": 3,
             "admin_mode": "constant"}[field]
    assert other != default
    ModelConfig(**{**base, field: default})
    if used:
        ModelConfig(**{**base, field: other})
    else:
        with pytest.raises(ValueError, match=rf"ModelConfig\.{field}=.* has no effect"):
            ModelConfig(**{**base, field: other})


@st.composite
def valid_model(draw):
    arch = draw(st.sampled_from(["decoder", "encoder", "encdec", "vit"]))
    scheme = draw(st.sampled_from(["preln", "postln", "vanilla", "shaped", "dslm", "deepnorm"]))
    heads = draw(st.sampled_from([1, 2, 4]))
    kw = dict(arch=arch, scheme=scheme, n_heads=heads, d_model=heads * draw(st.sampled_from([4, 8])),
              n_layers=draw(st.integers(1, 3)), dropout=draw(st.floats(0.0, 0.5)), bias=draw(st.booleans()))
    if draw(st.booleans()):
        kw["d_ff"] = draw(st.integers(1, 40))
    if arch == "vit":
        patch = draw(st.integers(1, 3))
        kw.update(patch_size=patch, image_size=patch * draw(st.integers(1, 3)), in_channels=draw(st.integers(1, 3)),
                  n_classes=draw(st.integers(1, 5)))
    else:
        kw.update(vocab_size=draw(st.integers(2, 64)), max_seq_len=draw(st.integers(1, 8)))
    if arch == "encdec":
        kw["n_dec_layers"] = draw(st.integers(1, 3))
    if scheme == "dslm":
        kw.update(norm_placement=draw(st.sampled_from(["pre", "post"])), dslm_k=draw(st.floats(0.1, 8.0)),
                  dslm_r0=draw(st.none() | st.floats(0.0, 1.0)))
    if scheme in ("shaped", "dslm"):
        gamma = draw(st.none() | st.floats(0.05, 1.0))
        kw.update(residual_gamma=gamma, learn_residual=draw(st.booleans()))
    shaped_relu = scheme == "shaped" or (scheme != "vanilla" and draw(st.booleans()))
    if scheme == "shaped":
        kw.update(tau0=draw(st.floats(0.5, 4.0)), qk_scaling=draw(st.sampled_from(["temperature", "weights"])))
    elif shaped_relu:
        kw["activation"] = "shaped_relu"
    if shaped_relu:
        kw.update(c_plus=draw(st.floats(-3.0, 3.0)), c_minus=draw(st.floats(-3.0, 3.0)),
                  shaping=draw(st.sampled_from(["fixed", "learn"])))
    if scheme not in ("shaped", "vanilla"):
        kw["norm_type"] = draw(st.sampled_from(["layernorm", "rmsnorm"]))
    return ModelConfig(**kw)


def _inputs(cfg: ModelConfig, g: torch.Generator):
    if cfg.arch == "vit":
        return (torch.randn(2, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g),)
    ids = [torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len), generator=g) for _ in range(2)]
    return tuple(ids) if cfg.arch == "encdec" else ids[:1]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_model(), st.integers(0, 2**31 - 1))
def test_every_valid_model_config_builds_and_trains_one_step_finitely(cfg, seed):
    """Finite output and gradients at init, and after one SGD step clipped to global norm 1 as the trainer clips
    (`TrainConfig.grad_clip`): an unclipped step is not bounded (a norm-free d = 8 encoder–decoder with dropout
    0.5 has gradients ~1e5 on mean(out²) and leaves lr 1e-2 with an infinite output)."""
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    torch.manual_seed(seed)
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    out = model(*_inputs(cfg, torch.Generator().manual_seed(seed)))
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    assert torch.isfinite(model(*_inputs(cfg, torch.Generator().manual_seed(seed + 1)))).all()


# --- the train config --------------------------------------------------------------------------------
TRAIN_BAD = {
    (OptimConfig, "optim."): {"lr": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
                              "min_lr_ratio": st.floats(min_value=1.0, exclude_min=True, allow_infinity=False),
                              "weight_decay": st.floats(max_value=0.0, exclude_max=True, allow_infinity=False,
                                                        allow_nan=False),
                              "beta1": st.floats(min_value=1.0, allow_infinity=False),
                              "beta2": st.floats(max_value=0.0, exclude_max=True, allow_infinity=False,
                                                 allow_nan=False),
                              "eps": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
                              "grad_clip": st.floats(max_value=0.0, exclude_max=True, allow_infinity=False,
                                                     allow_nan=False),
                              "warmup_steps": st.integers(max_value=-1)},
    (DataConfig, "data."): {"val_fraction": st.floats(min_value=1.0, allow_infinity=False),
                            "seq_len": st.integers(max_value=1), "max_chars": st.integers(max_value=-1),
                            "mask_prob": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
                            "span_len": st.integers(max_value=0)},
    (TrainConfig, "train."): {"steps": st.integers(max_value=0), "batch_size": st.integers(max_value=0),
                              "grad_accum": st.integers(max_value=0), "keep_last": st.integers(max_value=0),
                              "eval_every": st.integers(max_value=-1), "ckpt_every": st.integers(max_value=-1),
                              "seed": st.integers(max_value=-1), "recover_steps": st.integers(max_value=0)},
}


@st.composite
def invalid_train_value(draw):
    (cls, prefix), table = draw(st.sampled_from(sorted(TRAIN_BAD.items(), key=lambda kv: kv[0][1])))
    field = draw(st.sampled_from(sorted(table)))
    hint = {f.name: f.type for f in dataclasses.fields(cls)}[field]
    wrong = NON_FINITE if hint == "float" else NOT_AN_INT
    value = draw(st.one_of(table[field], wrong, WRONG_TYPE, st.just(True)))
    return cls, prefix + field, field, value


@SETTINGS
@given(invalid_train_value())
def test_train_config_refuses_every_invalid_value_naming_the_field(case):
    cls, name, field, value = case
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        cls(**{field: value})


@SETTINGS
@given(lr=st.floats(1e-6, 10.0), wd=st.floats(0.0, 1.0), b1=st.floats(0.0, 0.999), b2=st.floats(0.0, 0.999),
       eps=st.floats(1e-12, 1e-3), clip=st.floats(0.0, 10.0))
def test_every_valid_optim_config_steps_finitely(lr, wd, b1, b2, eps, clip):
    from sigprop.train.trainer import make_optimizer

    cfg = OptimConfig(lr=lr, weight_decay=wd, beta1=b1, beta2=b2, eps=eps, grad_clip=clip)
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=16, d_model=8, n_heads=2, n_layers=1, max_seq_len=4))
    opt = make_optimizer(model, cfg)
    model(torch.randint(0, 16, (2, 4))).logsumexp(-1).mean().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else math.inf)
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


# --- the simulation entry points -----------------------------------------------------------------------
V0 = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
SDE_BAD = {"gamma": st.one_of(NON_FINITE, st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
                              st.floats(min_value=1.0, exclude_min=True, allow_infinity=False)),
           "tau0": TAU0_BAD, "c_plus": C_BAD, "c_minus": C_BAD,
           "t": st.one_of(NON_FINITE, st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)),
           "steps": st.one_of(st.integers(max_value=0), NOT_AN_INT),
           "paths": st.one_of(st.integers(max_value=0), NOT_AN_INT),
           "seed": NOT_AN_INT}


@SETTINGS
@given(st.sampled_from(sorted(SDE_BAD)).flatmap(lambda f: st.tuples(st.just(f), SDE_BAD[f])))
def test_sde_simulate_refuses_every_invalid_argument_naming_it(case):
    field, value = case
    args = dict(t=0.1, steps=2, paths=2, seed=0, gamma=0.5, tau0=1.0, c_plus=0.0, c_minus=-1.0)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        sde.simulate("transformer", V0, **{**args, field: value})


@SETTINGS
@given(gamma=st.floats(0.05, 1.0), tau0=st.floats(0.2, 5.0), c_plus=st.floats(-3, 3), c_minus=st.floats(-3, 3),
       t=st.floats(0.01, 3.0), blowup=st.floats(2.0, 1e6), seed=st.integers(0, 2**31 - 1))
def test_sde_simulate_keeps_its_contract_for_every_valid_argument(gamma, tau0, c_plus, c_minus, t, blowup, seed):
    """V finite; a stopped path has stop_time in (0, t] and holds its value from then on; a path that never
    stopped has stop_time = inf; exploded paths are stopped ones whose last proposal was large."""
    p = sde.simulate("transformer", V0, t=t, steps=8, paths=16, seed=seed, gamma=gamma, tau0=tau0,
                     c_plus=c_plus, c_minus=c_minus, blowup=blowup)
    assert torch.isfinite(p.V).all()
    assert bool((p.stop_time[~p.stopped] == math.inf).all())
    assert bool(((p.stop_time[p.stopped] > 0) & (p.stop_time[p.stopped] <= t * (1 + 1e-12))).all())
    assert not bool((p.exploded & ~p.stopped).any())


ENSEMBLE_BAD = {"gamma": SDE_BAD["gamma"],
                "tau0": TAU0_BAD, "c_plus": C_BAD, "c_minus": C_BAD,
                "width": st.one_of(st.integers(max_value=0), NOT_AN_INT),
                "depth": st.one_of(st.integers(max_value=-1), NOT_AN_INT),
                "samples": st.one_of(st.integers(max_value=0), NOT_AN_INT), "seed": NOT_AN_INT}


@SETTINGS
@given(st.sampled_from(sorted(ENSEMBLE_BAD)).flatmap(lambda f: st.tuples(st.just(f), ENSEMBLE_BAD[f])))
def test_ensemble_simulate_refuses_every_invalid_argument_naming_it(case):
    field, value = case
    args = dict(width=8, depth=1, samples=2, seed=0, gamma=0.5, tau0=1.0, c_plus=0.0, c_minus=-1.0)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        ensemble.simulate("shaped", V0, **{**args, field: value})


@SETTINGS
@given(gamma=st.floats(0.05, 1.0), tau0=st.floats(0.2, 5.0), c_plus=st.floats(-3, 3), c_minus=st.floats(-3, 3),
       width=st.integers(2, 16), depth=st.integers(0, 3), seed=st.integers(0, 2**31 - 1))
def test_ensemble_simulate_is_finite_for_every_valid_argument(gamma, tau0, c_plus, c_minus, width, depth, seed):
    covs = ensemble.simulate("shaped", V0, width=width, depth=depth, samples=3, seed=seed, gamma=gamma, tau0=tau0,
                             c_plus=c_plus, c_minus=c_minus)
    assert covs.shape == (3, depth + 1, 2, 2) and torch.isfinite(covs).all()


def test_sde_functions_refuse_bad_matrices_and_propagate_nan():
    with pytest.raises(ValueError, match="V must be positive semi-definite"):
        sde.drift("resnet", -torch.eye(2, dtype=torch.float64), gamma=0.5)
    with pytest.raises(ValueError, match="V must be finite"):
        sde.diffusion("shaped_attention", torch.full((2, 2), math.nan, dtype=torch.float64), gamma=0.5)
    V = torch.stack([V0, torch.tensor([[math.inf, 0.0], [0.0, 1.0]], dtype=torch.float64)])
    R, ok = sde.psd_root(V)
    assert ok.tolist() == [True, False]
    assert torch.allclose(R[0] @ R[0].mT, V0) and torch.isnan(R[1]).all()


def test_sde_and_ensemble_take_their_scales_up_to_the_bounds_finitely():
    for tau0, c in ((1 / SQUARE_MAX, SQUARE_MAX), (SQUARE_MAX, -SQUARE_MAX)):
        for dtype in (torch.float32, torch.float64):
            p = sde.simulate("transformer", V0, t=0.1, steps=2, paths=2, gamma=0.5, tau0=tau0, c_plus=c, dtype=dtype)
            assert torch.isfinite(p.V).all()
        covs = ensemble.simulate("shaped", V0, width=8, depth=2, samples=2, gamma=0.5, tau0=tau0, c_plus=c)
        assert covs.shape == (2, 3, 2, 2)


@pytest.mark.parametrize("kw, name", [
    (dict(tau0=math.inf), "tau0"), (dict(tau0=1e-300), "tau0"), (dict(tau0=1e300), "tau0"),
    (dict(c_plus=1e200), "c_plus"), (dict(c_minus=-1e200), "c_minus"),
    (dict(dtype=torch.float16), "dtype"), (dict(dtype=torch.int64), "dtype"),
    (dict(V0="x"), "V0"), (dict(V0=None), "V0"), (dict(V0=V0.to(torch.complex128)), "V0"),
])
def test_sde_simulate_refuses_scales_out_of_bounds_and_unusable_inputs(kw, name):
    """τ₀ = inf, a τ₀ whose square vanishes or overflows, c± whose square overflows, a dtype torch.linalg cannot
    compute in and a V0 that is not a real matrix: each a ValueError naming the argument, before any work."""
    args = dict(V0=V0, t=0.1, steps=2, paths=2, gamma=0.5)
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        sde.simulate("transformer", **{**args, **kw})


# --- the model config: fields that only some schemes use, scales that enter squared ---------------------
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_learn_residual_is_refused_by_the_schemes_that_fix_their_residual_weights(scheme):
    """Only shaped, dslm and deepnorm have residual weights of their own to train (as `hf.apply`); the others'
    are fixed by their rule (unit adds, depth multipliers (L₀/L)^α)."""
    cfg = dict(scheme=scheme, d_model=16, n_heads=2, n_layers=1, max_seq_len=8, vocab_size=32, learn_residual=True)
    if scheme in ("shaped", "dslm", "deepnorm"):
        trained = [p for p in build_model(ModelConfig(**cfg)).parameters() if p.ndim == 0 and p.requires_grad]
        assert trained                                  # λ, γ (α, β) of every residual add are parameters
    else:
        with pytest.raises(ValueError, match=rf"ModelConfig\.learn_residual=True is invalid: .*scheme {scheme!r}"
                                             rf".*\('shaped', 'dslm', 'deepnorm'\)"):
            ModelConfig(**cfg)


def test_model_scales_at_the_bounds_build_forward_and_predict_without_a_traceback():
    from sigprop.models.predict import predict

    base = dict(scheme="shaped", d_model=16, n_heads=2, n_layers=1, max_seq_len=8, vocab_size=32)
    for kw in (dict(tau0=1 / SQUARE_MAX), dict(tau0=SQUARE_MAX), dict(c_plus=SQUARE_MAX, c_minus=-SQUARE_MAX)):
        cfg = ModelConfig(**base, **kw)
        torch.manual_seed(0)
        assert torch.isfinite(build_model(cfg)(torch.randint(0, 32, (2, 8)))).all()
        try:
            predict(cfg)
        except NotImplementedError:                     # hard-max attention has no derived map: a clear refusal
            pass


# --- the diagnose config -------------------------------------------------------------------------------
DIAGNOSE_BAD = {"seq_len": st.one_of(st.integers(max_value=1), NOT_AN_INT.filter(lambda v: v is not None)),
                "batch": st.one_of(st.integers(max_value=0), NOT_AN_INT),
                "seed": st.one_of(st.integers(max_value=-1), NOT_AN_INT),
                "out": st.one_of(st.sampled_from(["", "  "]), st.integers(), st.just(None), st.just(["runs"])),
                "token_collision": st.one_of(NON_FINITE, st.sampled_from(["0.5", [0.5], True]),
                                             st.floats(max_value=0.0, exclude_max=True, allow_infinity=False),
                                             st.floats(min_value=1.0, exclude_min=True, allow_infinity=False))}


@SETTINGS
@given(st.sampled_from(sorted(DIAGNOSE_BAD)).flatmap(lambda f: st.tuples(st.just(f), DIAGNOSE_BAD[f])))
def test_diagnose_config_refuses_every_invalid_value_naming_the_field(case):
    """The shared field checker's wording: ``diagnose.FIELD=VALUE is invalid`` / ``has the wrong type``."""
    field, value = case
    with pytest.raises(ValueError, match=rf"^diagnose\.{field}=.* (is invalid|has the wrong type)"):
        DiagnoseConfig(**{field: value})


def test_a_diagnose_batch_that_cannot_fit_in_memory_is_refused_with_its_estimate():
    from sigprop.diagnostics.commands import measure_bytes, physical_memory

    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_seq_len=8, vocab_size=32)
    small, huge = DiagnoseConfig(batch=2), DiagnoseConfig(batch=10 ** 11)
    # float64 (B, T, d) of the embedding and 2 sublayers, with their gradients, the logits and the token ids
    assert measure_bytes(cfg, small) == 8 * (2 * 3 * 2 * 8 * 16 + 2 * 8 * 32 + 2 * 8)
    assert measure_bytes(cfg, huge) == measure_bytes(cfg, small) * 10 ** 11 // 2
    assert measure_bytes(cfg, huge) > (physical_memory() or 0)


# --- the CLI: user errors exit 2 with one line ---------------------------------------------------------
def _cli_error(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


TOY_MODEL = "[model]\nd_model = 16\nn_heads = 2\nn_layers = 1\nmax_seq_len = 8\nvocab_size = 32\n"


@pytest.mark.parametrize("tables, needles", [
    ("[diagnose]\nout = 3\n", ["diagnose.out=3", "expected str"]),
    ('[diagnose]\ntoken_collision = "0.5"\n', ["diagnose.token_collision='0.5'", "expected float"]),
    ("[diagnose]\nbatch = 100000000000\n", ["diagnose.batch=100000000000", "fit in memory", "needs at least",
                                             "TiB", "this machine has"]),
    ("scheme = 'shaped'\ntau0 = 1e-300\n", ["ModelConfig.tau0=1e-300", "[2^-63, 2^63]"]),
    ("scheme = 'shaped'\nc_plus = 1e200\n", ["ModelConfig.c_plus=1e+200", "[-2^63, 2^63]"]),
])
@pytest.mark.parametrize("command", ["predict", "diagnose"])
def test_predict_and_diagnose_refuse_bad_diagnose_tables_and_scales(tmp_path, capsys, command, tables, needles):
    """Both read the same file, so both refuse it the same way, before writing anything."""
    path = tmp_path / "m.toml"
    path.write_text(TOY_MODEL + tables)
    _cli_error(capsys, [command, "--config", str(path), "--out", str(tmp_path / "out")], *needles)
    assert not (tmp_path / "out").exists()


def _train(tmp_path, *sets: str) -> list[str]:
    return ["train", *train_argv("tiny_decoder", *FAST_TRAIN, f"train.out_dir={tmp_path / 'run'}", *sets)]


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as one without CUDA, wherever the test runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("device, needles", [
    ("cuda", ["train.device='cuda'", "a device this machine has", "['cpu']"]),
    ("cuda:1", ["train.device='cuda:1'", "['cpu']"]),
    ("cudafoo", ["train.device='cudafoo'", "'cuda:N'", "this machine has ['cpu']"]),
])
def test_train_refuses_a_device_this_machine_lacks(tmp_path, capsys, no_cuda, device, needles):
    _cli_error(capsys, _train(tmp_path, f"train.device={device}"), *needles)


def test_a_device_name_is_checked_in_the_config_and_its_presence_where_the_run_starts(no_cuda):
    assert TrainConfig(device="cuda:3").device == "cuda:3"      # a config may be written for another machine
    with pytest.raises(ValueError, match=r"train\.device='gpu' is invalid: .*'auto', 'cpu', 'cuda' or 'cuda:N'"):
        TrainConfig(device="gpu")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"train\.device='cuda:3' is invalid: .*\['cpu'\]"):
        resolve_device("cuda:3")


def test_train_refuses_a_missing_or_unreadable_tokenizer(tmp_path, capsys):
    _cli_error(capsys, _train(tmp_path, f"data.tokenizer={tmp_path / 'none.json'}"),
               f"data.tokenizer='{tmp_path / 'none.json'}' is invalid", "no such file")
    (tmp_path / "bad.json").write_text("not json")
    _cli_error(capsys, _train(tmp_path, f"data.tokenizer={tmp_path / 'bad.json'}"),
               f"data.tokenizer='{tmp_path / 'bad.json'}' is invalid", "tokenizers can read")
    with pytest.raises(ValueError, match=r"^data\.tokenizer='.*bad\.json' is invalid"):
        BPETokenizer.load(tmp_path / "bad.json")


def test_an_hf_source_without_datasets_names_the_package_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)         # `import datasets` fails, as where it is absent
    _cli_error(capsys, _train(tmp_path, f"data.source=hf:{tmp_path}"),
               f"data.source='hf:{tmp_path}' needs the 'datasets' package", "pip install datasets")
