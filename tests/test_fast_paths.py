"""Fast paths pinned to their reference forms: the fused Q/K/V projection and the fused AdamW step
equal the plain forms to float rounding (1e-6 in float32, 1e-12 in float64), in outputs, gradients
and updated weights."""
import pytest
import torch

from sigprop.models import ModelConfig, build_model
from sigprop.nn import Attention, ShapedAttention
from sigprop.train.config import OptimConfig
from sigprop.train.optim import make_optimizer, param_groups, param_rules

B, T, S, D, H = 3, 12, 7, 32, 4
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _padding(s: int) -> torch.Tensor:
    km = torch.ones(B, s, dtype=torch.bool)
    km[1, s - 3:] = False
    km[2, s // 2:] = False
    return km


def _separate(attn: Attention, x: torch.Tensor, kv: torch.Tensor | None, key_mask: torch.Tensor | None):
    """The attention forward with Q, K, V projected one linear at a time."""
    kv = x if kv is None else kv
    split = lambda y: y.view(y.shape[0], y.shape[1], H, D // H).transpose(1, 2)
    q, k, v = split(attn.q_proj(x)), split(attn.k_proj(kv)), split(attn.v_proj(kv))
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    y = attn.mix(q, k, v, key_mask)
    return attn.o_proj(y.transpose(1, 2).reshape(x.shape))


def _value_and_grads(fn, module: torch.nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """fn's output, then the gradients of ⟨output, G⟩ (G fixed) w.r.t. every parameter and input."""
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = fn(*inputs)
    leaves = [*module.parameters(), *inputs]
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    return [out.detach(), *torch.autograd.grad((out * g).sum(), leaves)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal,padded,cross", [(True, False, False), (True, True, False), (False, True, False),
                                                 (False, True, True), (False, False, True)])
@pytest.mark.parametrize("kind", ["plain", "bias+qk_norm", "shaped"])
def test_fused_qkv_equals_separate_projections(dtype, causal, padded, cross, kind):
    torch.manual_seed(0)
    if kind == "shaped":
        attn = ShapedAttention(D, H, causal=causal, identity=not cross, gamma1=0.7, gamma2=0.4)
    else:
        attn = Attention(D, H, causal=causal, bias=kind != "plain", qk_norm=None if kind == "plain" else "layernorm")
    attn = attn.to(dtype)
    x = torch.randn(B, T, D, dtype=dtype)
    kv = torch.randn(B, S, D, dtype=dtype) if cross else None
    km = _padding(S if cross else T) if padded else None
    inputs = (x,) if kv is None else (x, kv)
    fused = _value_and_grads(lambda *t: attn(t[0], t[1] if cross else None, km), attn, *inputs)
    separate = _value_and_grads(lambda *t: _separate(attn, t[0], t[1] if cross else None, km), attn, *inputs)
    for a, b in zip(fused, separate):
        torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_adamw_equals_the_per_parameter_loop(dtype):
    """Five steps of `make_optimizer` (fused) and of AdamW's loop over the same groups from one start."""
    cfg = ModelConfig(vocab_size=64, max_seq_len=8, n_heads=2, d_model=16, n_layers=2, scheme="dslm")
    optim = OptimConfig(lr=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    fused_model = build_model(cfg).to(dtype)
    loop_model = build_model(cfg).to(dtype)
    loop_model.load_state_dict(fused_model.state_dict())
    fused = make_optimizer(fused_model, optim)
    loop = torch.optim.AdamW(param_groups(param_rules(loop_model, cfg), optim), lr=optim.lr,
                             betas=(optim.beta1, optim.beta2), eps=optim.eps, foreach=False, fused=False)
    assert fused.defaults["fused"] and len(fused.param_groups) == len(loop.param_groups)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p, q in zip(fused_model.parameters(), loop_model.parameters()):
            p.grad = torch.randn(p.shape, generator=gen, dtype=dtype)
            q.grad = p.grad.clone()
        fused.step()
        loop.step()
    for p, q in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(p, q, rtol=TOL[dtype], atol=TOL[dtype])
