"""Shaped attention: fused SDPA form equals the explicit matrix; structure of A."""
import math

import pytest
import torch

from sigprop import ModelConfig
from sigprop.nn import Attention, ShapedAttention

B, T, D, H = 3, 12, 32, 4


def _x(seed=0, t=T):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, t, D, generator=g, dtype=torch.float64)


def _padding():
    km = torch.ones(B, T, dtype=torch.bool)
    km[1, 9:] = False
    km[2, 5:] = False
    return km


def _explicit(attn, x, key_mask=None, kv=None):
    a = attn.attention_matrix(x, kv=kv, key_mask=key_mask)                 # (B, H, T, S)
    _, _, v = attn.qkv(x, kv)
    return attn.o_proj((a @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], D))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("gammas", [(1.0, 1.0), (0.3, 0.7)])
def test_fused_equals_explicit_float64(causal, padded, gammas):
    torch.manual_seed(0)
    attn = ShapedAttention(D, H, causal=causal, tau0=0.5).double()
    attn.set_shape(*gammas)
    x, km = _x(), (_padding() if padded else None)
    assert (attn(x, key_mask=km) - _explicit(attn, x, km)).abs().max() <= 1e-10


def test_cross_attention_fused_equals_explicit():
    torch.manual_seed(1)
    attn = ShapedAttention(D, H, identity=False).double()
    x, mem = _x(0, t=5), _x(1)
    km = _padding()
    assert (attn(x, kv=mem, key_mask=km) - _explicit(attn, x, km, kv=mem)).abs().max() <= 1e-10


@pytest.mark.parametrize("causal", [False, True])
def test_rows_sum_to_one_and_masked_entries_vanish(causal):
    torch.manual_seed(2)
    attn = ShapedAttention(D, H, causal=causal).double()
    km = _padding()
    a = attn.attention_matrix(_x(), key_mask=km)
    torch.testing.assert_close(a.sum(-1), torch.ones(B, H, T, dtype=torch.float64), atol=1e-12, rtol=0)
    masked = ~km[:, None, None, :].expand(B, H, T, T)
    if causal:
        masked = masked | ~torch.ones(T, T, dtype=torch.bool).tril()
    off_diag = masked & ~torch.eye(T, dtype=torch.bool)
    assert a[off_diag].abs().max() <= 1e-12


def test_tends_to_identity_as_tau0_grows():
    torch.manual_seed(3)
    x, errs = _x(), []
    for tau0 in (1.0, 10.0, 100.0, 1000.0):
        attn = ShapedAttention(D, H, tau0=tau0).double()
        errs.append((attn.attention_matrix(x) - torch.eye(T, dtype=torch.float64)).abs().max().item())
    # Softmax(Y/τ) − C = O(1/τ): each tenfold τ₀ shrinks the deviation about tenfold
    assert errs[-1] < 1e-3
    for a, b in zip(errs, errs[1:]):
        assert 5 < a / b < 20


def test_temperature_is_tau0_sqrt_n_nk():
    attn = ShapedAttention(64, 4, tau0=2.0)
    assert attn.scale == pytest.approx(1.0 / (2.0 * (64 * 16) ** 0.5))


def test_zero_shaping_is_plain_softmax_attention():
    torch.manual_seed(4)
    shaped = ShapedAttention(D, H, causal=True).double()
    plain = Attention(D, H, causal=True, scale=shaped.scale).double()
    plain.load_state_dict(shaped.state_dict(), strict=False)
    shaped.set_shape(0.0, 0.0)
    x = _x()
    torch.testing.assert_close(shaped(x), plain(x), atol=1e-12, rtol=0)


def test_learn_mode_trains_gammas():
    attn = ShapedAttention(D, H, mode="learn").double()
    attn(_x()).pow(2).sum().backward()
    assert attn.gamma1.grad is not None and attn.gamma2.grad.abs().sum() > 0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="tau0"):
        ShapedAttention(D, H, tau0=0.0)
    with pytest.raises(ValueError, match="mode"):
        ShapedAttention(D, H, mode="sometimes")
    with pytest.raises(ValueError, match="divisible"):
        ShapedAttention(30, 4)


def test_cross_attention_learn_mode_has_no_unused_parameter():
    attn = ShapedAttention(D, H, mode="learn", identity=False)
    names = {n for n, _ in attn.named_parameters()}
    assert "gamma2" in names and "gamma1" not in names           # DDP rejects unused parameters
    assert attn.gamma1.abs().sum() == 0


def test_qk_scaling_weights_is_equal_at_init_and_moves_logits_n_quarter_faster_under_adam():
    """Same function at init; one Adam step (tiny lr, first order) changes the logits n^{1/4}× more."""
    n, heads, T = 64, 4, 12
    torch.manual_seed(0)
    x = torch.randn(3, T, n, dtype=torch.float64)
    target = torch.randn(3, T, n, dtype=torch.float64)
    mods = {q: ShapedAttention(n, heads, causal=True, qk_scaling=q).double() for q in ("temperature", "weights")}
    mods["weights"].load_state_dict(mods["temperature"].state_dict())
    with torch.no_grad():
        for w in (mods["weights"].q_proj.weight, mods["weights"].k_proj.weight):
            w.mul_(n ** -0.25)                       # N(0, 1/n) → N(0, n^{-3/2})
    logits = lambda m: m.logits(*m.qkv(x)[:2], None)
    l0 = {q: logits(m) for q, m in mods.items()}
    finite = l0["weights"].isfinite()
    torch.testing.assert_close(l0["weights"][finite], l0["temperature"][finite], rtol=1e-12, atol=1e-12)
    change = {}
    for q, m in mods.items():
        opt = torch.optim.Adam(m.parameters(), lr=1e-7, eps=1e-30)
        ((m(x) - target) ** 2).mean().backward()
        opt.step()
        with torch.no_grad():
            change[q] = (logits(m) - l0[q])[finite].norm()
    assert change["weights"] / change["temperature"] == pytest.approx(n ** 0.25, rel=1e-4)


def test_qk_scaling_init_is_the_deprecated_name_of_weights():
    with pytest.warns(DeprecationWarning, match="qk_scaling='init' is deprecated; it is called 'weights'"):
        old = ShapedAttention(64, 4, qk_scaling="init")
    assert old.scale == ShapedAttention(64, 4, qk_scaling="weights").scale == 1 / math.sqrt(16)
    assert ShapedAttention(64, 4).scale == 1 / math.sqrt(16 * 64)


def test_qk_scaling_is_validated():
    with pytest.raises(ValueError, match="qk_scaling"):
        ShapedAttention(16, 2, qk_scaling="fast")
    with pytest.raises(ValueError, match="ModelConfig.qk_scaling"):
        ModelConfig(scheme="shaped", qk_scaling="fast")


@pytest.mark.parametrize("cls", [Attention, ShapedAttention])
def test_without_output_projection_the_output_is_a_v_and_there_is_no_moment_map(cls):
    attn = cls(D, H, output_proj=False).double()
    x = _x(4)
    assert "o_proj.weight" not in dict(attn.named_parameters())
    torch.testing.assert_close(attn(x), _explicit(attn, x), rtol=1e-12, atol=1e-12)
    with pytest.raises(NotImplementedError, match="output_proj"):
        attn.moment_map(T)
