"""Each scheme's init and residual rules, checked against independently written formulas and MC."""
import math

import pytest
import torch

from sigprop import ModelConfig, build_model
from sigprop.nn.roles import role_of, site_of
from sigprop.schemes.deepnorm import deepnorm_constants
from sigprop.schemes.dslm import block_correlations, block_grams
from sigprop.theory import dslm as theory_dslm
from sigprop.theory.kernels import relu_kernel
from sigprop.theory.moments import Attention, Moments

D, H, FF = 64, 4, 256


def expected_std(cfg: ModelConfig, role: str, shape, site) -> float | None:
    """The published formulas, written out again per scheme (None: not a random weight)."""
    d, dh, p = cfg.d_model, cfg.d_model // cfg.n_heads, cfg.dropout
    fan_in = shape[-1]
    if role in ("bias", "norm", "constant"):
        return None
    if cfg.scheme in ("preln", "postln", "vanilla"):
        return {"q": math.sqrt(2 / (d + dh)), "k": math.sqrt(2 / (d + dh)), "v": math.sqrt(2 / (d + dh)),
                "o": math.sqrt(1 / d), "ffn_in": math.sqrt(2 / (5 * d)), "ffn_out": math.sqrt(2 / (5 * d)),
                "embed": math.sqrt(1 / d), "pos": math.sqrt(1 / d)}[role]
    if cfg.scheme == "shaped":
        return math.sqrt(0.5) if role in ("embed", "pos") else 1 / math.sqrt(fan_in)
    if cfg.scheme == "deepnorm":
        n = cfg.n_layers
        beta = (8 * n) ** -0.25
        return {"q": math.sqrt(1 / d), "k": math.sqrt(1 / d), "v": beta * math.sqrt(1 / d),
                "o": beta * math.sqrt(1 / d), "ffn_in": beta * math.sqrt(2 / (5 * d)),
                "ffn_out": beta * math.sqrt(2 / (5 * d)), "embed": math.sqrt(1 / d), "pos": math.sqrt(1 / d)}[role]
    assert cfg.scheme == "dslm"
    if role in ("v", "o"):
        r, n = block_correlations(cfg, site[0])[site[1]][0], cfg.max_seq_len
        # the attention gain is the full attention map's output variance at unit value-output gain
        attention = Attention(d, cfg.n_heads, n, 1 / d, 1 / d, 1 / d, 1 / d, causal=site[0] == "dec")
        gain = attention.fwd(Moments(0, 1, r)).var
        return (math.sqrt((1 - p) / gain) / d) ** 0.5
    return {"q": math.sqrt(1 / d), "k": math.sqrt(1 / d), "ffn_in": math.sqrt(math.sqrt((1 - p) / 2) / d),
            "ffn_out": math.sqrt(math.sqrt((1 - p) / 2) / d), "embed": math.sqrt((1 - p) / 2),
            "pos": math.sqrt((1 - p) / 2)}[role]


@pytest.mark.parametrize("scheme", ["preln", "postln", "vanilla", "shaped", "dslm", "deepnorm"])
def test_initial_weight_statistics_match_formula(scheme):
    torch.manual_seed(0)
    cfg = ModelConfig(scheme=scheme, d_model=D, n_heads=H, d_ff=FF, n_layers=3, vocab_size=500,
                      max_seq_len=64, dropout=0.1)
    checked = 0
    for name, p in build_model(cfg).named_parameters():
        want = expected_std(cfg, role_of(p), tuple(p.shape), site_of(p))
        if want is None:
            continue
        n = p.numel()
        # sample std of n normals: relative standard error 1/√(2n); mean has standard error σ/√n
        assert abs(p.std().item() / want - 1) < 5 / math.sqrt(2 * n), name
        assert abs(p.mean().item()) < 5 * want / math.sqrt(n), name
        checked += 1
    assert checked >= 3 * 6 + 2


def test_dslm_recursion_reproduces_authors_numbers():
    """The authors' limit of the recursion (L → ∞: attention output correlation 1): d=1024, p=0.1, r0=0.221,
    192 layers, λ²=0.995 give r = 0.199, 0.203, 0.378, 0.504 (Kedia et al., ICML 2024, public code)."""
    lam, beta = math.sqrt(0.995), math.sqrt(0.005)
    r = theory_dslm.block_correlations(((1.0, 0.221 * 0.9),), 192, lam, beta, 0.1, None, False, 1024, 16, relu_kernel)
    for layer, want in [(0, 0.199), (1, 0.203), (48, 0.378), (96, 0.504)]:
        assert r[layer][0] == pytest.approx(want, abs=6e-4)
        assert r[layer][1] == r[layer][0]                        # G = r in the limit


def residuals(model):
    return [(m.alpha.item(), m.beta.item()) for m in model.modules() if type(m).__name__ == "Residual"]


def test_dslm_residual_beta_squared_is_k_over_n():
    cfg = ModelConfig(scheme="dslm", d_model=D, n_heads=H, n_layers=10, dslm_k=2.0)
    for lam, beta in residuals(build_model(cfg)):
        assert beta ** 2 == pytest.approx(2.0 / 20) and lam ** 2 + beta ** 2 == pytest.approx(1.0)
    cfg = ModelConfig(arch="encdec", scheme="dslm", d_model=D, n_heads=H, n_layers=4, n_dec_layers=5)
    betas = sorted({round(b ** 2, 12) for _, b in residuals(build_model(cfg))})
    assert betas == pytest.approx([2.0 / 15, 2.0 / 8])          # decoder: 3 branches × 5, encoder 2 × 4


def test_shaped_residual_is_unit_norm():
    for gamma in (None, 0.05, 0.5):
        cfg = ModelConfig(scheme="shaped", d_model=D, n_heads=H, residual_gamma=gamma)
        for lam, g in residuals(build_model(cfg)):
            assert g == pytest.approx(gamma or 0.2, rel=1e-6) and lam ** 2 + g ** 2 == pytest.approx(1.0)


@pytest.mark.parametrize("arch, stack, n, m, alpha, beta", [
    ("encoder", "enc", 6, 6, (2 * 6) ** 0.25, (8 * 6) ** -0.25),
    ("decoder", "dec", 18, 18, (2 * 18) ** 0.25, (8 * 18) ** -0.25),
    ("encdec", "enc", 6, 6, 0.81 * (6 ** 4 * 6) ** (1 / 16), 0.87 * (6 ** 4 * 6) ** (-1 / 16)),
    ("encdec", "dec", 6, 6, (3 * 6) ** 0.25, (12 * 6) ** -0.25),
])
def test_deepnorm_constants_match_published_table(arch, stack, n, m, alpha, beta):
    assert deepnorm_constants(arch, stack, n, m) == pytest.approx((alpha, beta), rel=1e-12)


def test_deepnorm_table_spot_values():
    """DeepNet Table 1 worked values: decoder-only M=18 → α ≈ 2.449, β ≈ 0.2887; 100L enc-dec (N=M=50)."""
    assert deepnorm_constants("decoder", "dec", 1, 18) == pytest.approx((2.4495, 0.2887), abs=1e-4)
    a_enc, b_enc = deepnorm_constants("encdec", "enc", 50, 50)
    assert (a_enc, b_enc) == pytest.approx((0.81 * 50 ** (5 / 16), 0.87 * 50 ** (-5 / 16)))
    cfg = ModelConfig(arch="encdec", scheme="deepnorm", d_model=D, n_heads=H, n_layers=3, n_dec_layers=4)
    alphas = {round(a, 5) for a, _ in residuals(build_model(cfg))}
    assert alphas == {round(deepnorm_constants("encdec", s, 3, 4)[0], 5) for s in ("enc", "dec")}


@pytest.mark.slow
@pytest.mark.parametrize("arch, r0, sublayer", [("encoder", 0.4, "attn"), ("encoder", 0.4, "mlp"),
                                                ("decoder", None, "attn"), ("decoder", None, "mlp"),
                                                ("vit", None, "attn")])
def test_dslm_blocks_have_unit_output_variance(arch, r0, sublayer):
    """DSLM's invariant, by Monte Carlo: a block fed the tokens the scheme's V/O rule is made for returns D(f(x))
    with unit variance: Gaussian tokens with the token Gram the recursion predicts at that block
    (`sigprop.schemes.dslm.block_grams`: long-range correlated tokens in a bidirectional encoder; the Zipf
    sequences of a causal decoder, with their repeated tokens and position-dependent correlations, where the
    finite-length attention gain matters most; for the first block of a ViT, uncorrelated tokens, 1 +
    (image/patch)² of them), through the block's own norm. 12 independent models (weight draws) give the spread
    (finite width makes each draw fluctuate by ~5%); the mean must be 1 ± 5%, with a standard error under 2% so
    the check can decide (5% ≥ 2.5 standard errors). With the logits' coupling to the values' finite-width Gram
    left out of the gain, the ViT block measures 1.09."""
    p, seq = 0.1, 128
    layer = 0 if arch == "vit" else 2
    gen = torch.Generator().manual_seed(0)
    estimates = []
    for seed in range(12):
        torch.manual_seed(seed)
        cfg = ModelConfig(arch=arch, scheme="dslm", d_model=256, n_heads=4, n_layers=6,
                          max_seq_len=seq, dropout=p, dslm_r0=r0,
                          **({"image_size": 16, "patch_size": 2} if arch == "vit" else {}))
        sub = getattr(build_model(cfg).double().stack.blocks[layer], sublayer)
        sub.train()
        grams = block_grams(cfg, "dec" if arch == "decoder" else "enc")[layer]                  # (S, T, T)
        chol = torch.linalg.cholesky(grams + 1e-9 * torch.eye(cfg.n_tokens, dtype=torch.float64))
        x = chol[torch.arange(16) % len(grams)] @ torch.randn(16, cfg.n_tokens, 256, generator=gen,
                                                             dtype=torch.float64)
        with torch.no_grad():
            y = sub.drop(sub.fn(sub.norm(x)))
        estimates.append(y.var().item())
    est = torch.tensor(estimates)
    se = est.std().item() / math.sqrt(len(estimates))
    assert se < 0.02
    assert abs(est.mean().item() - 1) < 0.05, estimates


def test_shaped_qk_scaling_weights_draws_qk_from_n_to_minus_three_halves():
    """W_Q, W_K ~ N(0, n^{-3/2}) (std n^{-3/4}) with qk_scaling="weights"; other weights unchanged."""
    n = 128
    torch.manual_seed(0)
    model = build_model(ModelConfig(scheme="shaped", qk_scaling="weights", d_model=n, n_layers=2, vocab_size=64))
    attn = model.stack.blocks[0].attn.fn
    for w, std in ((attn.q_proj.weight, n ** -0.75), (attn.k_proj.weight, n ** -0.75), (attn.v_proj.weight, n ** -0.5)):
        se = std / math.sqrt(2 * w.numel())                  # standard error of a sample std
        assert abs(w.std().item() - std) < 5 * se


@pytest.mark.parametrize("arch", ["decoder", "encdec"])
def test_gpt2_init_follows_nanogpt(arch):
    """GPT-2/nanoGPT: every weight std 0.02 (embeddings, positions, Q, K, V, FFN up); the attention O and
    FFN down projections 0.02/√(2L), L = blocks of their own stack; tied logits without a multiplier."""
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, scheme="gpt2", d_model=D, n_heads=H, d_ff=FF, n_layers=3, vocab_size=500,
                      max_seq_len=64, **({"n_dec_layers": 5} if arch == "encdec" else {}))
    model = build_model(cfg)
    seen = set()
    for name, p in model.named_parameters():
        role = role_of(p)
        if role in ("bias", "norm", "constant"):
            continue
        blocks = {"enc": 3, "dec": 5 if arch == "encdec" else 3}[site_of(p)[0]] if role in ("o", "ffn_out") else None
        want = 0.02 / math.sqrt(2 * blocks) if blocks else 0.02
        assert abs(p.std().item() / want - 1) < 5 / math.sqrt(2 * p.numel()), (name, role)
        seen.add(role)
    assert {"embed", "pos", "q", "k", "v", "o", "ffn_in", "ffn_out"} <= seen
    assert model.logit_scale == 1.0
