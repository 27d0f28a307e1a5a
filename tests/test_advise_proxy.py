"""`sigprop advise` by a proxy (`sigprop.advice.proxy`): the proxy is the same run, smaller, within the budget;
the transfer ratio between μP models that differ in width alone is near 1; the grid's optimum and the outcomes."""
import math

import pytest

from helpers import CONFIGS
from sigprop.advice import advise
from sigprop.advice.proxy import MAX_RUNS, advise_by_proxy, pick_by_proxy, plan, transfer_ratio, vertex
from sigprop.cli import main
from sigprop.train import load_config

SIZE = {"model": ("d_model", "d_ff", "n_heads", "n_layers", "n_dec_layers")}
SMALL = ["data.seq_len=16", "model.max_seq_len=16", "data.max_chars=30000", "model.vocab_size=300",
         "train.batch_size=8"]


def run(tmp_path, *sets):
    return load_config(CONFIGS / "tiny_decoder.toml", [*SMALL, f"train.out_dir={tmp_path / 'run'}", *sets])


def without(d, cut):
    return {t: {k: v for k, v in fields.items() if k not in cut.get(t, ())} for t, fields in d.items()}


@pytest.mark.parametrize("budget", [0.5, 0.1, 0.01])
def test_the_proxy_is_the_run_smaller_and_its_grid_fits_the_budget(tmp_path, budget):
    cfg = run(tmp_path, "model.d_model=128", "model.n_layers=16", "train.steps=300", "optim.warmup_steps=30")
    pl = plan(cfg, budget)
    p = pl.proxy
    cut = {**SIZE, "train": ("steps",), "optim": ("warmup_steps",)}
    assert without(p.to_dict(), cut) == without(cfg.to_dict(), cut)          # every non-size field equal
    assert p.model.d_model < cfg.model.d_model or p.model.n_layers < cfg.model.n_layers
    assert p.model.d_model % p.model.n_heads == 0
    assert p.model.d_ff * cfg.model.d_model == cfg.model.d_ff * p.model.d_model
    assert pl.runs == MAX_RUNS and pl.cost <= budget * (1 + 1e-9)
    assert (p.train.steps < cfg.train.steps) == (budget == 0.01)           # only a tiny budget cuts the horizon


def test_a_budget_must_be_positive_and_pay_for_the_smallest_proxy(tmp_path, capsys):
    with pytest.raises(ValueError, match="budget"):
        plan(run(tmp_path), 0.0)
    with pytest.raises(ValueError, match=r"needs at least 0\.\d+ of one training run"):
        plan(run(tmp_path, "model.d_model=128", "model.n_layers=16", "train.steps=300"), 0.003)
    assert main(["advise", "--config", str(CONFIGS / "tiny_decoder.toml"), "--budget", "-1"]) == 2
    assert "--budget -1" in capsys.readouterr().err


@pytest.mark.parametrize("depth", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_the_transfer_ratio_of_a_mup_pair_that_differs_in_width_is_near_one(tmp_path, depth):
    """μP keeps the first step's output and layer changes per unit lr as width grows, so their ratio tends to 1; at
    the finite widths 64 and 256 it is within 0.6–1.25 at depths 2 and 4 (one held-out batch), while the standard
    parametrization's wider model changes 2–4× faster per unit lr (Adam's hidden updates grow with width)."""
    ratios = {}
    for mup in (True, False):
        sets = ['model.parametrization="mup"', "model.base_width=32"] if mup else []
        a = {w: advise(run(tmp_path, *sets, f"model.d_model={w}", f"model.n_layers={depth}")) for w in (64, 256)}
        ratios[mup] = {b: transfer_ratio(a[256], a[64], b) for b in ("layer change", "output change")}
    for basis in ("layer change", "output change"):                 # the shipped basis and the output's
        assert 0.6 <= ratios[True][basis] <= 1.25
        assert ratios[False][basis] <= 0.5 and ratios[False][basis] < 0.75 * ratios[True][basis]


def test_the_optimum_is_the_vertex_of_a_parabola_in_log_lr():
    lrs = [1e-3, 3e-3, 9e-3]
    x = [math.log(v) for v in lrs]
    centre = x[1] + 0.3 * (x[2] - x[1])
    assert vertex(lrs, [(v - centre) ** 2 for v in x]) == pytest.approx(math.exp(centre))
    assert vertex(lrs, [3.0, 2.0, math.nan]) == 3e-3                         # a diverged neighbour: the grid point
    assert vertex(lrs, [3.0, 2.5, 2.0]) == 9e-3                              # at the edge
    assert vertex(lrs, [math.nan] * 3) == 1e-3


@pytest.mark.slow
def test_advice_by_proxy_answers_every_lr_within_its_budget(tmp_path):
    cfg = run(tmp_path, "model.d_model=128", "model.n_layers=4", "train.steps=40", "optim.warmup_steps=4",
              "train.eval_every=20")
    a = advise_by_proxy(cfg, 0.5, lrs=[1e-4, 1e-3, 1e-2, 1e-1, 1.0], out=tmp_path / "proxy", progress=False)
    assert len(a.grid) <= MAX_RUNS and a.cost <= 0.5
    assert [p["outcome"] for p in a.predictions][-1] == "diverges"
    assert all(p["outcome"] in ("trains", "stalls", "diverges") for p in a.predictions)
    assert a.recommended_lr > 0 and math.isfinite(a.recommended_lr)
    again = advise_by_proxy(cfg, 0.5, lrs=[1e-3], out=tmp_path / "proxy", progress=False)   # the runs are reused
    assert again.grid == a.grid and again.cost_s < a.cost_s


def test_a_pick_ranks_the_candidates_on_the_proxy_within_its_budget(tmp_path):
    cfg = run(tmp_path, "model.d_model=128", "model.n_layers=4", "train.steps=40", "optim.warmup_steps=4",
              "train.eval_every=20")
    p = pick_by_proxy(cfg, [1e-3, 10.0], 0.5, out=tmp_path / "proxy", progress=False)
    assert p.lr == 1e-3                                  # lr 10 diverges: it ends no better than it started
    assert [g["lr"] for g in p.grid] == [1e-3, 10.0] and 0 < p.cost <= 0.5
    assert p.grid[1]["final_loss"] > p.grid[0]["final_loss"]
    with pytest.raises(ValueError, match="candidate"):
        pick_by_proxy(cfg, [], 0.5, out=tmp_path / "proxy", progress=False)


def test_a_depth_keeping_proxy_is_the_run_narrower_with_its_steps_cut_to_fit(tmp_path):
    """``keep_depth``: the proxy has the run's blocks and a smaller width; where six runs of even the narrowest do
    not fit the budget its horizon is cut, and the plan still fits."""
    cfg = run(tmp_path, "model.d_model=128", "model.n_layers=16", "train.steps=300", "optim.warmup_steps=30")
    for budget, cut in ((0.5, False), (0.1, True)):
        pl = plan(cfg, budget, keep_depth=True)
        p = pl.proxy
        assert p.model.n_layers == cfg.model.n_layers and p.model.d_model < cfg.model.d_model
        assert pl.cost <= budget * (1 + 1e-9) and (p.train.steps < cfg.train.steps) == cut
        keep = {**SIZE, "model": tuple(k for k in SIZE["model"] if k != "n_layers"), "train": ("steps",),
                "optim": ("warmup_steps",)}
        assert without(p.to_dict(), keep) == without(cfg.to_dict(), keep)
