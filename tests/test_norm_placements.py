"""Norms on the branch output: placements "out", x ← x + N(f(x)), and "sandwich", x ← x + N₂(f(N₁(x))).

The modules compute the formula, the init pass handles every norm they add, the schemes allow them where their
rule still holds and refuse them by name elsewhere, the moment map is the composition of the existing maps (a
branch ending in a norm adds exactly β² to the stream variance), and identity growth keeps the function. The
prediction against measurement at 8–48 blocks is in tests/test_predict_knobs.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sigprop import ModelConfig, build_model, grow
from sigprop.diagnostics import measure
from sigprop.models import predict
from sigprop.nn.roles import role_of
from sigprop.schemes import get_scheme, initialize
from sigprop.theory.moments.blocks import serial
from sigprop.theory.moments.embedding import zipf_ids
from sigprop.theory.moments.norm import LayerNorm
from sigprop.theory.moments.state import Moments

SIZE = dict(d_model=32, n_heads=4, n_layers=3, max_seq_len=8, vocab_size=64)


@pytest.mark.parametrize("placement", ["out", "sandwich"])
def test_sublayer_computes_its_placement(placement):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**SIZE, norm_placement=placement)).double()
    sub = model.stack.blocks[1].mlp
    assert (sub.norm is not None) == (placement == "sandwich") and sub.out_norm is not None
    with torch.no_grad():
        sub.out_norm.weight.uniform_(0.5, 1.5)        # distinct gains: each norm must sit where the formula says
        if sub.norm is not None:
            sub.norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    h = sub.norm(x) if placement == "sandwich" else x
    torch.testing.assert_close(sub(x), x + sub.out_norm(sub.fn(h)), rtol=1e-12, atol=1e-12)
    assert not isinstance(model.stack.final_norm, torch.nn.Identity)


@pytest.mark.parametrize("placement, norms", [("pre", 1), ("out", 1), ("sandwich", 2)])
def test_every_norm_is_tagged_and_initialized(placement, norms):
    cfg = ModelConfig(**SIZE, norm_placement=placement)
    model = build_model(cfg)
    gains = [p for p in model.parameters() if role_of(p) == "norm"]
    assert len(gains) == 2 * cfg.n_layers * norms + 1                          # + the final norm
    with torch.no_grad():
        for p in gains:
            p.fill_(3.0)
    initialize(model, cfg, get_scheme(cfg.scheme))
    assert all(bool((p == 1).all()) for p in gains)


@pytest.mark.parametrize("scheme, allowed", [("preln", ("pre", "out", "sandwich")),
                                             ("depth_mup", ("pre", "out", "sandwich")),
                                             ("completep", ("pre", "out", "sandwich")),
                                             ("gpt2", ("pre",)), ("dslm", ("pre", "post", "out", "sandwich")),
                                             ("postln", ("post",)),
                                             ("deepnorm", ("post",)), ("admin", ("post",))])
def test_schemes_allow_or_refuse_by_name(scheme, allowed):
    assert get_scheme(scheme).norm_placements == allowed
    for placement in ("out", "sandwich"):
        if placement in allowed:
            ModelConfig(scheme=scheme, norm_placement=placement)
        else:
            with pytest.raises(ValueError, match=f"norm_placement='{placement}' is invalid") as err:
                ModelConfig(scheme=scheme, norm_placement=placement)
            assert f"one of {allowed!r}" in str(err.value)


@pytest.mark.parametrize("placement", ["out", "sandwich"])
def test_moment_map_composes_the_norm_on_the_branch_output(placement):
    model = build_model(ModelConfig(**SIZE, norm_placement=placement), device="meta")
    sub = model.stack.blocks[0].mlp
    m = Moments(0.0, 2.5, 0.3)
    fn = sub.fn.moment_map()
    first = [LayerNorm(32)] if placement == "sandwich" else []
    branch = serial(*first, fn, LayerNorm(32))
    out = sub.moment_map(8).fwd(m)
    assert out.var == pytest.approx(m.var + 1.0, rel=1e-12)                 # a normalized branch adds exactly 1
    assert out.cov == pytest.approx(m.cov + branch.fwd(m).cov, rel=1e-12)
    g = Moments(0.0, 2.5, 0.3, grad_var=1.7, grad_corr=0.2)
    back = sub.moment_map(8).bwd(m, g)
    assert back.grad_var == pytest.approx(1.7 + branch.bwd(m, g).grad_var, rel=1e-12)


@pytest.mark.parametrize("placement", ["out", "sandwich"])
def test_predicted_stream_grows_by_one_per_normalized_branch(placement):
    """Pre-LN init with a norm on every branch output: each sublayer adds exactly unit variance."""
    records = predict(ModelConfig(**SIZE, norm_placement=placement), seq_len=8, token_collision=1 / 64)
    var = [r.fwd_var for r in records]
    assert [b - a for a, b in zip(var, var[1:])] == pytest.approx([1.0] * (len(var) - 1), rel=1e-9)


@pytest.mark.parametrize("placement", ["out", "sandwich"])
def test_identity_growth_zeroes_the_output_norm(placement):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**SIZE, norm_placement=placement)).double().eval()
    ids = torch.randint(0, 64, (2, 8))
    grown = grow(model, 5, "identity").eval()
    with torch.no_grad():
        torch.testing.assert_close(grown(ids), model(ids), rtol=0, atol=1e-12)
    for block in grown.stack.blocks[3:]:
        assert not block.attn.out_norm.weight.any() and not block.mlp.out_norm.weight.any()
        assert block.attn.fn.o_proj.weight.any() and block.mlp.fn.fc2.weight.any()     # the projections are kept


def dslm_moments(placement: str, networks: int) -> tuple[np.ndarray, np.ndarray]:
    """(branches, gradient): each branch's variance before its output norm (the module ``fn``: for "pre" the branch
    itself), attention and MLP alternating, and the stream gradient's variance at every sublayer output relative to
    the last one's; means over ``networks`` DSLM decoders of width 64 and 8 blocks on 4 × 16 Zipf ids (the token law
    the scheme assumes)."""
    cfg = ModelConfig(d_model=64, n_heads=4, n_layers=8, max_seq_len=16, vocab_size=64, scheme="dslm",
                      norm_placement=placement)
    branches, grads = [], []
    for seed in range(networks):
        torch.manual_seed(seed)
        records = measure(build_model(cfg).double(), zipf_ids(64, 4, 16, seed=100 + seed), seed=seed,
                          blocks=r"stack\.blocks\.\d+\.(attn|mlp)(\.fn)?", attention_stats=False, stable_ranks=False)
        branches.append([r.fwd_var for r in records[0::2]])        # call order: each branch ``fn``, its sublayer
        grads.append([r.grad_var for r in records[1::2]])
    grad = np.array(grads).mean(0)
    return np.array(branches).mean(0), grad / grad[-1]


@pytest.mark.slow
def test_dslm_keeps_the_branch_before_its_output_norm_at_one():
    """DSLM under "out" and "sandwich" (`sigprop.schemes.dslm`): the branch before its output norm has variance σ_f²
    with median in [0.9, 1.1] over the attention and over the MLP sublayers (the output norm is then an identity in
    the mean), and the stream gradient relative to the output stays in DSLM's band [0.8, 1.3], compared with Pre-LN
    DSLM's in the same networks' setting: its dip no deeper (within 0.1), its rise toward the input at most 0.25 above.
    The rise is the causal gain's spread over positions (position 0 attends to itself: σ_f² is 1 on average, not per
    position), which the output norm turns into a gradient gain E[1/σ_f²] > 1 per attention branch; it is largest
    where the tokens are least correlated (the first blocks) and bounded by Σβ² = k. 16 networks: a sublayer's mean
    moves by ~2/√(16d)."""
    _, pre_grad = dslm_moments("pre", 16)
    for placement in ("out", "sandwich"):
        branches, grad = dslm_moments(placement, 16)
        for kind, v in (("attention", branches[0::2]), ("mlp", branches[1::2])):
            assert 0.9 <= float(np.median(v)) <= 1.1, (placement, kind, v)
            assert 0.75 <= v.min() and v.max() <= 1.3, (placement, kind, v)
        assert grad.min() >= pre_grad.min() - 0.1 and grad.max() <= pre_grad.max() + 0.25, (grad, pre_grad)
        assert 0.8 <= grad.min() and grad.max() <= 1.3, (placement, grad)
