"""Every architecture × scheme builds and trains one step; ModelConfig rejects bad input clearly."""
import dataclasses

import pytest
import torch
from torch import nn

from sigprop import ModelConfig, build_model
from sigprop.models import ARCHITECTURES
from sigprop.nn.roles import role_of
from sigprop.schemes import SCHEMES, get_scheme, initialize

TINY = dict(vocab_size=40, d_model=16, n_heads=2, n_layers=2, max_seq_len=12)


def tiny(arch: str) -> dict:
    """TINY without the token fields a ViT does not have."""
    return {k: v for k, v in TINY.items() if arch != "vit" or k not in ("vocab_size", "max_seq_len")}


def run(model: nn.Module, cfg: ModelConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if cfg.arch == "vit":
        return model(torch.randn(3, 1, 8, 8, generator=g))
    ids = torch.randint(0, cfg.vocab_size, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[0, 7:] = False
    if cfg.arch == "encdec":
        return model(ids, ids[:, :6], src_mask=mask)
    if cfg.arch == "encoder":
        return model(ids, attention_mask=mask)
    return model(ids)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_forward_backward_finite(arch, scheme):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, scheme=scheme, dropout=0.1, **tiny(arch))
    model = build_model(cfg)
    out = run(model, cfg)
    want = {"vit": (3, 10), "encdec": (3, 6, 40)}.get(arch, (3, 10, 40))
    assert out.shape == want and torch.isfinite(out).all()
    out.logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_dslm_norm_placements_and_rmsnorm(placement):
    """norm_type="rmsnorm" puts RMSNorm at every norm site (no LayerNorm left); at init (gain 1) each
    output token has unit mean square, x/√(mean x² + ε), without LayerNorm's centring."""
    cfg = ModelConfig(scheme="dslm", norm_placement=placement, norm_type="rmsnorm", **TINY)
    model = build_model(cfg).double()
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
    assert len(norms) >= 2 * cfg.n_layers and all(isinstance(m, nn.RMSNorm) for m in norms)
    outs = []
    hooks = [m.register_forward_hook(lambda mod, args, out: outs.append(out)) for m in norms]
    assert torch.isfinite(run(model, cfg)).all()
    for h in hooks:
        h.remove()
    assert len(outs) == len(norms)
    for y in outs:
        torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(y.shape[:-1], dtype=y.dtype), rtol=1e-4, atol=1e-4)
    assert max(y.mean(-1).abs().max() for y in outs) > 0.05                # not centred: not a LayerNorm


def test_shaped_learn_mode_has_trainable_shape_and_residual():
    cfg = ModelConfig(scheme="shaped", shaping="learn", learn_residual=True, **TINY)
    names = {n for n, _ in build_model(cfg).named_parameters()}
    assert any(n.endswith("gamma1") for n in names) and any(n.endswith("s_minus") for n in names)
    assert any(n.endswith("residual.alpha") for n in names)


def test_build_is_deterministic_given_seed():
    cfg = ModelConfig(scheme="dslm", **TINY)
    torch.manual_seed(7)
    a = build_model(cfg).state_dict()
    torch.manual_seed(7)
    b = build_model(cfg).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_init_visits_every_parameter_once_and_refuses_untagged():
    cfg = ModelConfig(arch="encdec", scheme="deepnorm", **TINY)
    model = build_model(cfg)
    counts = initialize(model, cfg, get_scheme(cfg.scheme))
    assert sum(counts.values()) == len(list(model.parameters()))
    assert all(role_of(p) is not None for p in model.parameters())
    model.extra = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="extra.weight"):
        initialize(model, cfg, get_scheme(cfg.scheme))


@pytest.mark.parametrize("field, value, match", [
    ("n_heads", 3, "divisible"),
    ("scheme", "fancy", "scheme must be one of"),
    ("arch", "rnn", "arch must be one of"),
    ("activation", "tanh", "activation must be one of"),
    ("norm_type", "batchnorm", "norm_type must be one of"),
    ("tau0", 0.0, r"tau0 must be in \[2\^-63, 2\^63\]"),
    ("tau0", -1.0, r"tau0 must be in \[2\^-63, 2\^63\]"),
    ("dropout", 1.0, r"dropout must be in \[0, 1\)"),
    ("dropout", -0.1, r"dropout must be in \[0, 1\)"),
    ("n_layers", 0, "n_layers must be a positive integer"),
    ("d_model", -8, "d_model must be a positive integer"),
    ("vocab_size", 0, "vocab_size must be a positive integer"),
    ("max_seq_len", 2.5, "max_seq_len=2.5 has the wrong type; expected int"),
    ("shaping", "sometimes", "shaping must be one of"),
])
def test_invalid_config_names_field_and_allowed_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**TINY, field: value})


def test_residual_and_scheme_combinations():
    with pytest.raises(ValueError, match=r"residual_lambda² \+ residual_gamma² must equal 1"):
        ModelConfig(scheme="shaped", residual_lambda=0.9, residual_gamma=0.2)
    ModelConfig(scheme="shaped", residual_lambda=0.9, residual_gamma=0.2, learn_residual=True)
    ModelConfig(scheme="dslm", residual_lambda=0.6, residual_gamma=0.8)
    with pytest.raises(ValueError, match="norm_placement must be one of \\('none',\\)"):
        ModelConfig(scheme="shaped", norm_placement="pre")
    with pytest.raises(ValueError, match="norm_placement must be one of \\('pre', 'post', 'out', 'sandwich'\\)"):
        ModelConfig(scheme="dslm", norm_placement="none")
    with pytest.raises(ValueError, match="only by schemes 'shaped' and 'dslm'"):
        ModelConfig(scheme="preln", residual_gamma=0.5)
    with pytest.raises(ValueError, match="activation must be one of \\('relu', 'shaped_relu'\\)"):
        ModelConfig(scheme="shaped", activation="gelu")
    with pytest.raises(ValueError, match="patch_size"):
        ModelConfig(arch="vit", image_size=8, patch_size=3)


def test_config_roundtrip_and_unknown_keys():
    cfg = ModelConfig(scheme="dslm", norm_placement="post", **TINY)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown ModelConfig field.*d_modle"):
        ModelConfig.from_dict({**cfg.to_dict(), "d_modle": 3})
    assert dataclasses.replace(cfg, n_layers=5).n_layers == 5


def test_sequence_longer_than_position_table():
    cfg = ModelConfig(**TINY)
    with pytest.raises(ValueError, match="max_seq_len"):
        build_model(cfg)(torch.zeros(1, 13, dtype=torch.long))


RENAMED_NORMS = [("dslm", "preln", "pre"), ("dslm", "postln", "post"), ("shaped", "none", "none"), ("dslm", None, None)]


@pytest.mark.parametrize("scheme, old, new", RENAMED_NORMS)
def test_norm_is_the_deprecated_name_of_norm_placement(scheme, old, new):
    """ModelConfig(norm=...), from_dict of a stored {"norm": ...} and the attribute cfg.norm warn and map to
    norm_placement exactly (same config, same initialized model); to_dict writes only the new name."""
    cfg = ModelConfig(scheme=scheme, norm_placement=new, **TINY)
    with pytest.warns(DeprecationWarning, match="ModelConfig.norm is deprecated; it is called "
                                                "ModelConfig.norm_placement"):
        kwarg = ModelConfig(scheme=scheme, norm=old, **TINY)
    stored = {k: v for k, v in cfg.to_dict().items() if k != "norm_placement"}
    with pytest.warns(DeprecationWarning, match="ModelConfig.norm is deprecated"):
        loaded = ModelConfig.from_dict({**stored, "norm": old})
    assert kwarg == cfg == loaded and kwarg.to_dict() == cfg.to_dict()
    assert "norm" not in cfg.to_dict() and cfg.to_dict()["norm_placement"] == cfg.norm_placement
    with pytest.warns(DeprecationWarning, match="read ModelConfig.norm_placement"):
        assert cfg.norm == {"pre": "preln", "post": "postln", "none": "none"}[cfg.norm_placement]
    torch.manual_seed(0)
    a = build_model(kwarg).state_dict()
    torch.manual_seed(0)
    b = build_model(cfg).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_norm_and_norm_placement_together_are_refused():
    with pytest.raises(ValueError, match="ModelConfig.norm and ModelConfig.norm_placement are one field"):
        ModelConfig(scheme="dslm", norm="preln", norm_placement="pre")
    with pytest.raises(ValueError, match="norm_placement='preln' is invalid"):     # the old values are not new ones
        ModelConfig(scheme="dslm", norm_placement="preln")


def test_qk_scaling_init_is_the_deprecated_name_of_weights():
    """qk_scaling="init" warns and is "weights": the same config (written as "weights") and the same model."""
    cfg = ModelConfig(scheme="shaped", qk_scaling="weights", **TINY)
    with pytest.warns(DeprecationWarning, match="ModelConfig.qk_scaling='init' is deprecated; it is called 'weights'"):
        old = ModelConfig(scheme="shaped", qk_scaling="init", **TINY)
    assert old == cfg and old.to_dict()["qk_scaling"] == "weights"
    torch.manual_seed(0)
    a = build_model(old).state_dict()
    torch.manual_seed(0)
    b = build_model(cfg).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(0)
    c = build_model(ModelConfig(scheme="shaped", **TINY)).state_dict()
    assert not torch.equal(a["stack.blocks.0.attn.fn.q_proj.weight"], c["stack.blocks.0.attn.fn.q_proj.weight"])
