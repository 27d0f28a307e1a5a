"""Optimizer rules from the scheme: per-role multipliers reach AdamW, μP / depth-α rules, qk-norm, z-loss."""
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_first_adamw_step
from sigprop.models import ModelConfig, build_model
from sigprop.nn import Attention
from sigprop.schemes import OptimRule, ParamInfo, Site, get_scheme
from sigprop.train.config import OptimConfig, load_config
from sigprop.train.objectives import Batch, loss_terms
from sigprop.train.optim import make_optimizer, param_rules
from sigprop.train.run import train

SMALL = dict(vocab_size=64, max_seq_len=8, n_heads=2)


def _step(cfg: ModelConfig, optim: OptimConfig):
    """One AdamW step on fixed tokens in float64: (rules, params before, grads, params after)."""
    torch.manual_seed(0)
    model = build_model(cfg).double()
    ids = torch.randint(0, cfg.vocab_size, (3, cfg.max_seq_len))
    loss, _ = loss_terms(model, Batch((ids[:, :-1],), ids[:, 1:]))
    loss.backward()
    opt = make_optimizer(model, optim, cfg)
    rules = param_rules(model, cfg)
    before = [p.detach().clone() for _, p, _ in rules]
    grads = [p.grad.detach().clone() for _, p, _ in rules]
    opt.step()
    return rules, before, grads, [p.detach().clone() for _, p, _ in rules]


@pytest.mark.parametrize("kw", [
    dict(scheme="preln", parametrization="mup", d_model=64, base_width=16, n_layers=2),
    dict(scheme="completep", n_layers=8, base_depth=2, d_model=16),
    dict(scheme="depth_mup", parametrization="mup", n_layers=8, base_depth=2, d_model=32, base_width=8),
])
def test_each_update_follows_its_rule(kw):
    """First AdamW step: Δp = −lr·m_lr·(wd·m_wd·p·[ndim ≥ 2] + g/(|g| + ε·m_ε)) for every parameter."""
    optim = OptimConfig(lr=1e-3, eps=1e-3, weight_decay=0.1)      # large ε so its multiplier shows
    rules, before, grads, after = _step(ModelConfig(**SMALL, **kw), optim)
    seen = assert_first_adamw_step(rules, before, grads, after, optim.lr, optim.eps, optim.weight_decay)
    assert len(seen) > 1, "the multipliers must differ between roles for this test to mean anything"


def rule(cfg: ModelConfig, role: str, layer: int | None = 0) -> OptimRule:
    shape = (cfg.d_model, cfg.d_model)
    return get_scheme(cfg.scheme).optim(cfg, ParamInfo(role, None if layer is None else "dec", layer, shape))


def test_rule_values():
    """The tables of sigprop.schemes.mup and sigprop.schemes.depth, by hand."""
    m = ModelConfig(**SMALL, parametrization="mup", d_model=64, base_width=16)          # m = 4
    assert rule(m, "q") == OptimRule(lr=0.25, eps=0.25, weight_decay=4.0)
    assert rule(m, "ffn_out") == rule(m, "q") and rule(m, "head", None) == rule(m, "q")
    assert rule(m, "embed", None) == OptimRule() == rule(m, "norm") == rule(m, "bias")
    c = ModelConfig(**SMALL, scheme="completep", n_layers=8, base_depth=2)              # L/L₀ = 4, α = 1
    assert rule(c, "ffn_in") == OptimRule(lr=1.0, eps=0.25) and rule(c, "norm") == OptimRule(eps=0.25)
    assert rule(c, "embed", None) == OptimRule() and rule(c, "norm", None) == OptimRule()   # final norm
    d = ModelConfig(**SMALL, scheme="depth_mup", n_layers=8, base_depth=2)              # α = ½
    assert rule(d, "o") == OptimRule(lr=0.5, eps=0.5)
    assert get_scheme("depth_mup").residual(d, Site("dec", 3, "mlp")) == (1.0, 0.5)
    assert get_scheme("completep").residual(c, Site("dec", 3, "attn")) == (1.0, 0.25)
    for name in ("preln", "postln", "dslm", "shaped", "deepnorm", "vanilla"):       # existing schemes: all 1
        s = ModelConfig(**SMALL, scheme=name, d_model=64)
        assert {rule(s, r) for r in ("q", "ffn_in", "embed", "norm")} == {OptimRule()}, name


def test_standard_is_plain_adamw():
    """Unit multipliers: the same step as AdamW with decay on matrices only, two groups."""
    cfg = ModelConfig(**SMALL, d_model=16)
    optim = OptimConfig(lr=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    model = build_model(cfg)
    assert len(make_optimizer(model, optim).param_groups) == 2
    _, before, grads, after = _step(cfg, optim)
    for p0, g, p1 in zip(before, grads, after):
        wd = optim.weight_decay if p0.ndim >= 2 else 0.0
        torch.testing.assert_close(p1, p0 * (1 - optim.lr * wd) - optim.lr * g / (g.abs() + optim.eps))


@pytest.mark.parametrize("kw,same", [
    (dict(parametrization="mup", base_width=16), dict()),                      # μP at its base width
    (dict(scheme="completep", base_depth=2), dict(scheme="preln")),            # α-schemes at their base depth
    (dict(scheme="depth_mup", base_depth=2), dict(scheme="preln")),
])
def test_multipliers_are_one_at_the_base(kw, same):
    a, b = ModelConfig(**SMALL, d_model=16, n_layers=2, **kw), ModelConfig(**SMALL, d_model=16, n_layers=2, **same)
    ids = torch.randint(0, 64, (2, 8))
    torch.manual_seed(1)
    ma = build_model(a)
    torch.manual_seed(1)
    mb = build_model(b)
    torch.testing.assert_close(ma(ids), mb(ids), rtol=0, atol=0)
    assert {r for _, _, r in param_rules(ma, a)} == {OptimRule()}


def test_mup_init_and_scales():
    """μP: input std as at the base width, tied logits × n₀/n, attention logits √d_head₀/d_head."""
    base, wide = (ModelConfig(**SMALL, parametrization="mup", base_width=16, d_model=d) for d in (16, 64))
    s = get_scheme("preln")
    info = lambda cfg: ParamInfo("embed", None, None, (64, cfg.d_model))
    assert s.init_std(wide, info(wide)) == s.init_std(base, info(base)) == pytest.approx(1 / 4)
    assert s.std(wide, info(wide)) == pytest.approx(1 / 8)                  # the standard init shrinks with width
    assert s.logit_scale(base) == pytest.approx(1.0)                         # unit-variance logits at n₀
    assert s.logit_scale(wide) == pytest.approx((16 / 64) / (0.25 * math.sqrt(16)))   # (n₀/n)/(σ_e√n₀)
    torch.manual_seed(0)
    m = build_model(wide)
    attn = m.stack.blocks[0].attn.fn
    assert attn.scale == pytest.approx(math.sqrt(8) / 32)
    assert m.embed.tok.weight.std().item() == pytest.approx(0.25, rel=0.05)
    vit = ModelConfig(arch="vit", parametrization="mup", base_width=16, d_model=64, n_heads=2)
    p = ParamInfo("head", None, None, (10, 64))
    assert s.init_std(vit, p) == pytest.approx(s.std(vit, p) / 2)


def test_transfer_fields_are_validated():
    with pytest.raises(ValueError, match="parametrization"):
        ModelConfig(parametrization="ntk")
    with pytest.raises(ValueError, match="base_width"):
        ModelConfig(parametrization="mup", base_width=30, n_heads=4)
    with pytest.raises(ValueError, match="base_depth"):
        ModelConfig(base_depth=0)
    with pytest.raises(ValueError, match="qk_norm"):
        ModelConfig(scheme="shaped", qk_norm=True)
    with pytest.raises(ValueError, match="optim.z_loss"):
        OptimConfig(z_loss=-1.0)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_qk_norm_normalizes_queries_and_keys(kind):
    torch.manual_seed(0)
    attn = Attention(32, 4, qk_norm=kind).double()
    x = 5 * torch.randn(2, 6, 32, dtype=torch.float64)
    q, k, v = attn.qkv(x)
    for t in (q, k):
        ms = t.pow(2).mean(-1) if kind == "rmsnorm" else t.var(-1, unbiased=False)
        torch.testing.assert_close(ms, torch.ones_like(ms), rtol=1e-4, atol=1e-4)
    plain = Attention(32, 4).double()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if "norm" not in k})
    assert not torch.allclose(plain(x), attn(x))
    torch.testing.assert_close(plain.qkv(x)[2], v)


def test_z_loss_adds_log_z_squared():
    torch.manual_seed(0)
    cfg = ModelConfig(**SMALL, d_model=16)
    model = build_model(cfg).double()
    ids = torch.randint(0, 64, (3, 8))
    targets = ids[:, 1:].clone()
    targets[0, :3] = -100                                                  # ignored positions carry no z-loss
    batch = Batch((ids[:, :-1],), targets)
    ce, _ = loss_terms(model, batch)
    with_z, _ = loss_terms(model, batch, z_loss=1e-2)
    logits = model(ids[:, :-1]).double()
    log_z = torch.log(torch.exp(logits).sum(-1))
    keep = targets != -100
    # loss_terms is float32
    assert with_z.item() == pytest.approx(ce.item() + 1e-2 * log_z[keep].pow(2).sum().item(), rel=1e-6)
    assert ce.item() == pytest.approx(F.cross_entropy(logits[keep], targets[keep], reduction="sum").item())


def test_resume_is_bit_exact_with_rule_groups(tmp_path):
    """A μP + CompleteP run interrupted by a checkpoint and resumed matches the straight run."""
    sets = ["model.scheme=\"completep\"", "model.parametrization=\"mup\"", "model.d_model=32", "model.base_width=16",
            "model.n_layers=4", "model.base_depth=2", "model.vocab_size=300", "model.max_seq_len=16",
            "data.seq_len=16", "data.max_chars=20000", "train.batch_size=4", "train.eval_batches=1",
            "train.progress=false", "optim.warmup_steps=2", "optim.z_loss=1e-4", "train.eval_every=0"]
    straight = train(load_config(None, sets + ["train.steps=6", f"train.out_dir={tmp_path / 'a'}"]))
    train(load_config(None, sets + ["train.steps=6", "train.ckpt_every=3", f"train.out_dir={tmp_path / 'b'}"]))
    first = load_config(None, sets + ["train.steps=3", f"train.out_dir={tmp_path / 'c'}"])
    train(first)
    resumed = train(load_config(None, sets + ["train.steps=6", "train.resume=true", f"train.out_dir={tmp_path / 'c'}"]))
    assert len(resumed.optimizer.param_groups) > 2
    assert {g["lr_mult"] for g in resumed.optimizer.param_groups} > {1.0}
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
