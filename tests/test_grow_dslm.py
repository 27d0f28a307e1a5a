"""Growth mode "dslm": each new block's V/O follows DSLM's rule at the gain of the grown stream entering it.

The walk (`sigprop.schemes.dslm_growth`) reduces to the scheme's own recursion on a stack that was not grown; on a
grown one every new attention branch measures near 1, and with the gains of a fresh model of the new depth (the rule
switched off) it does not. Branches are measured as in tests/test_hf.py: each attention branch's output (the module
``stack.blocks.i.attn.fn``, before λx + βf) on 8 Zipf sequences, float64, averaged over a few networks; one
network's branch spreads by ~2/√d (0.25 at d = 64), so the bounds are on the mean over the networks, and the
networks' spread is asserted small enough to resolve them first."""
import math
import statistics

import pytest
import torch

from sigprop import ModelConfig, build_model, grow
from sigprop.diagnostics import measure
from sigprop.models.grow import plan
from sigprop.nn.roles import init_std_of, set_init_std
from sigprop.schemes import dslm
from sigprop.schemes.dslm_growth import residual_sites, set_new_block_gains_, stack_gains
from sigprop.theory.dslm_stack import ResidualSite, mean_sites
from sigprop.theory.moments.embedding import zipf_ids

ATTENTION = r"stack\.blocks\.\d+\.attn\.fn"


def walk(model: torch.nn.Module, new: bool) -> tuple[tuple[float, float], ...]:
    """(r, G) at every block of ``model``'s stack by the walk, every block read as new (its own gain) or as old."""
    sites = tuple(s for block in model.stack.blocks for s in residual_sites(model.cfg, block, new))
    return stack_gains(model.cfg, model.stack.blocks[0].attn.site.stack, sites)


@pytest.mark.parametrize("kw", [dict(), dict(norm_placement="post"), dict(norm_placement="out"),
                                dict(arch="encoder"), dict(dropout=0.1), dict(max_seq_len=300)])
def test_the_walk_of_an_ungrown_stack_is_the_schemes_recursion(kw):
    """Blocks read as new take the scheme's Gram recursion's very Monte Carlo samples; read as old, each attention
    branch's c·G is 1 up to the rounding of its std; beyond GRAM_MAX_TOKENS (300 tokens) both are the mean
    recursion. Either way the walk gives the scheme's (r_l, G_l) to rounding."""
    cfg = ModelConfig(**{"scheme": "dslm", "n_layers": 5, "d_model": 32, "max_seq_len": 16, **kw})
    model = build_model(cfg, device="meta")
    fresh = dslm.block_correlations(cfg, model.stack.blocks[0].attn.site.stack)
    as_new, as_old = walk(model, True), walk(model, False)
    for found in (as_new, as_old):
        assert [x for pair in found for x in pair] == pytest.approx([x for pair in fresh for x in pair], rel=1e-10)


def test_the_mean_walk_weighs_each_branch_by_its_variance():
    """Three residual sites by hand: an attention branch of variance c·G = 2 and an MLP branch of variance 1/2 move
    the stream's variance q and correlation r as q ← λ²q + β²w, r ← (λ²qr + β²w(1 − p)ρ)/q; the next attention
    reads its gain at that r."""
    lam, beta, p, L, d, h = 0.8, 0.6, 0.1, 32, 64, 4
    gain = lambda r: dslm.theory_dslm.attention_correlation(r, L, True, d, h)                     # noqa: E731
    g0, out0 = gain(0.3)
    sites = (ResidualSite("attn", lam, beta, 2.0 / g0), ResidualSite("mlp", lam, beta, 0.5),
             ResidualSite("attn", lam, beta))
    first, last = mean_sites(((1.0, 0.3),), sites, p, L, True, d, h, lambda r: r ** 2)
    q1 = lam ** 2 + beta ** 2 * 2.0
    r1 = (lam ** 2 * 0.3 + beta ** 2 * 2.0 * (1 - p) * out0) / q1
    q2 = lam ** 2 * q1 + beta ** 2 * 0.5
    r2 = (lam ** 2 * q1 * r1 + beta ** 2 * 0.5 * (1 - p) * r1 ** 2) / q2
    assert first == (0.3, g0)
    assert last == pytest.approx((r2, gain(r2)[0]), rel=1e-12)


def test_new_blocks_take_the_rule_at_the_gain_of_the_grown_stream():
    """Grown 2 → 6 on top: each new block's W_V, W_O carry vo_std at the gain the walk finds at its input (its
    cross-check: the walk of the grown model with every block read as it is), above the fresh 6-block model's gain
    at that layer (the old blocks' larger β mixes the tokens more); old blocks keep their stds and weights."""
    cfg = ModelConfig(scheme="dslm", n_layers=2, d_model=32, max_seq_len=16)
    torch.manual_seed(0)
    small = build_model(cfg)
    grown = grow(small, 6, "dslm")
    new = [s.new for s in plan(2, 6)]
    sites = tuple(s for block, is_new in zip(grown.stack.blocks, new) for s in residual_sites(grown.cfg, block, is_new))
    gains = [g for _, g in stack_gains(grown.cfg, "dec", sites)]
    fresh = [g for _, g in dslm.block_correlations(grown.cfg, "dec")]
    for j, (block, is_new) in enumerate(zip(grown.stack.blocks, new)):
        for weight in (block.attn.fn.v_proj.weight, block.attn.fn.o_proj.weight):
            if is_new:
                assert init_std_of(weight) == pytest.approx(dslm.vo_std(grown.cfg, gains[j]), rel=1e-12)
                assert gains[j] > 1.2 * fresh[j]
                assert weight.std().item() == pytest.approx(init_std_of(weight), rel=5 / math.sqrt(weight.numel()))
    for old, block in zip(small.stack.blocks, grown.stack.blocks):
        assert all(torch.equal(a, b) for a, b in zip(old.parameters(), block.parameters()))
    assert set_new_block_gains_(grown, [False] * 6) == pytest.approx(gains, rel=1e-10)   # now at their gains


def attention_branches(make, seeds: range) -> list[list[float]]:
    """Per network (one per seed, float64): every attention branch's output variance on 8 Zipf sequences."""
    rows = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = make().double().eval()
        ids = zipf_ids(model.cfg.vocab_size, 8, model.cfg.max_seq_len, seed + 1)
        rows.append([r.fwd_var for r in measure(model, ids, blocks=ATTENTION)])
    return rows


def new_branches(n_old: int, n_new: int, every: int | None, fresh_gains: bool, seeds: range = range(4)
                 ) -> tuple[list[float], float]:
    """The new blocks' attention branches of DSLM models (width 64, 64 tokens) grown from ``n_old`` to ``n_new``
    blocks, mean over the networks, and the standard error of their median (the spread of the networks' medians
    over √networks). ``fresh_gains``: the rule switched off, each new block's V/O back at the fresh ``n_new``-block
    model's gain at its layer."""
    cfg = ModelConfig(scheme="dslm", n_layers=n_old, d_model=64, max_seq_len=64)
    new = [s.new for s in plan(n_old, n_new, every)]

    def make() -> torch.nn.Module:
        model = grow(build_model(cfg), n_new, "dslm", every=every)
        if fresh_gains:
            at_layer = dslm.block_correlations(model.cfg, "dec")
            for j in (j for j, is_new in enumerate(new) if is_new):
                std, fn = dslm.vo_std(model.cfg, at_layer[j][1]), model.stack.blocks[j].attn.fn
                for weight in (fn.v_proj.weight, fn.o_proj.weight):
                    with torch.no_grad():
                        weight.mul_(std / init_std_of(weight))
                    set_init_std(weight, std)
        return model

    rows = [[v for v, is_new in zip(row, new) if is_new] for row in attention_branches(make, seeds)]
    medians = [statistics.median(row) for row in rows]
    return [statistics.fmean(col) for col in zip(*rows)], statistics.stdev(medians) / math.sqrt(len(rows))


@pytest.mark.slow
@pytest.mark.parametrize("n_old, n_new, every", [(4, 16, None), (4, 16, 1), (8, 32, None), (8, 32, 2)])
def test_grown_attention_branches_have_unit_variance(n_old, n_new, every):
    """Every new attention branch in [0.7, 1.4], their median in [0.9, 1.1], as a fresh DSLM model's (test_hf), over
    16 networks: one network's branches drift together, so its median moves by ~0.1 and 4 networks cannot resolve the
    ±0.1 band; the standard error of the median is asserted below a third of the band's half-width first."""
    branches, se = new_branches(n_old, n_new, every, fresh_gains=False, seeds=range(16))
    assert se < 0.1 / 3, se
    assert 0.9 <= statistics.median(branches) <= 1.1 and 0.7 <= min(branches) and max(branches) <= 1.4, branches


@pytest.mark.slow
def test_with_the_fresh_models_gains_the_grown_branches_fail_the_bound():
    """The rule switched off (new blocks at the fresh 32-block model's gain for their layer) at 8 → 32 on top: the
    new attention branches' median is above 1.1 by more than 3 standard errors of it (4 networks suffice here)."""
    branches, se = new_branches(8, 32, None, fresh_gains=True)
    assert statistics.median(branches) > 1.1 + 3 * se and max(branches) > 1.4, (statistics.median(branches), se)
