"""Every training claim's rule through the harness: synthetic per-point records → `summarize` → verdict (and its
Markdown), one test per branch (reproduced, partly, not reproduced, inconclusive); each claim's size and reach (its
module and its rule); the committed summaries judged again from their own numbers."""
import ast
import json
import math
from pathlib import Path

import pytest

from sigprop.experiments import (
    deep_thin,
    depth_transfer,
    dslm_depth,
    entropy_collapse,
    growth,
    postln_horizon,
    registry,
    shaped_vs_preln,
)
from sigprop.experiments.claim import markdown, summarize
from sigprop.models.build import non_embedding_count, param_count

TUNING = 100


def pt(model, role, lr, seed, final, unigram=None, logged=None):
    return {"model": model, "role": role, "lr": lr, "seed": seed, "final_val_loss": final, "initial_val_loss": 7.0,
            "best_val_loss": final, "final_val_acc": 0.5, "unigram": unigram, "logged": logged or {},
            "diverged": not math.isfinite(final)}


def tuned(key, grid, losses, lr, finals, unigram=None, seeds=(0, 1, 2)):
    """Tuning points over ``grid`` and scored points at ``lr`` (None: no scored seeds)."""
    pts = [pt(key, "tuning", g, TUNING, x, unigram) for g, x in zip(grid, losses)]
    return pts + ([pt(key, "scored", lr, s, x, unigram) for s, x in zip(seeds, finals)] if lr else [])


def run(module, sizes, points):
    claim = module.CLAIM
    s = {**claim.full, **sizes}
    models = claim.models(s)
    summary = summarize(claim, s, models, points, {m.key: [] for m in models})
    assert claim.rule(summary) == (summary["verdict"], summary["verdict_reason"])
    assert markdown(claim, summary).startswith(f"## {claim.name} — ")        # its setup template, table, notes
    return summary


# --- shaped-vs-preln: every shaped variant within +5 % of tuned Pre-LN

SVP = {"gammas": (0.05,)}
GRID = list(shaped_vs_preln.FULL["shaped_lrs"])
PRE_GRID = list(shaped_vs_preln.FULL["preln_lrs"])


def svp_points(recover, learn, edge=False):
    pre_loss = [5.3, 5.1, 5.0, 4.9] if edge else [5.3, 5.0, 5.1, 5.2]
    return (tuned("preln", PRE_GRID, pre_loss, PRE_GRID[1], [5.0, 5.0, 5.0], 5.27)
            + tuned("shaped-recover-0.05", GRID, [5.3, 5.0, 5.1, 5.2], GRID[1], recover)
            + tuned("shaped-learn-0.05", GRID, [5.3, 5.0, 5.1, 5.2], GRID[1], learn))


@pytest.mark.parametrize("recover, learn, edge, verdict", [
    ([5.1, 5.2, 5.2], [4.9, 5.0, 5.1], False, "reproduced"),
    ([5.1, 5.2, 5.2], [5.4, 5.4, 5.4], False, "partly"),        # one within 5 %
    ([5.6, 5.6, 5.6], [5.4, 5.4, 5.4], False, "not reproduced"),
    ([5.1, 5.2, 5.2], [4.9, 5.0, 5.1], True, "inconclusive"),   # Pre-LN's optimum at its grid's top
])
def test_shaped_vs_preln(recover, learn, edge, verdict):
    s = run(shaped_vs_preln, SVP, svp_points(recover, learn, edge))
    assert s["verdict"] == verdict
    assert s["models"]["preln"]["label"] == "Pre-LN"
    assert s["models"]["shaped-learn-0.05"]["tuning"]["best_lr"] == GRID[1]


def test_a_diverged_shaped_seed_is_an_infinite_gap():
    s = run(shaped_vs_preln, SVP, svp_points([5.0, 5.0, math.nan], [5.0, 5.0, 5.0]))
    assert s["verdict"] == "partly" and "+inf%" in s["verdict_reason"]
    assert s["models"]["shaped-recover-0.05"]["scored"][0]["diverged"] == [False, False, True]


# --- entropy-collapse: Pre-LN's entropy collapses at a large lr, shaped's does not

LRS = [1e-2, 3e-2, 1e-1]


def ec_points(pre_top, shaped_top):
    """Entropy per seed at every lr: 2.0 everywhere except the top lr (``pre_top``/``shaped_top`` per seed)."""
    out = []
    for key in entropy_collapse.MODELS:
        top = pre_top if key == "preln" else shaped_top
        for lr in LRS:
            out += [pt(key, "scored", lr, s, 5.0, logged={"entropy": top[s] if lr == LRS[-1] else 2.0})
                    for s in range(3)]
    return out


@pytest.mark.parametrize("pre_top, shaped_top, verdict", [
    ([0.1, 0.1, 0.1], [2.0, 2.0, 2.0], "reproduced"),
    ([0.1, 0.1, 0.9], [2.0, 2.0, 2.0], "partly"),              # Pre-LN's mean collapses, not every seed
    ([0.1, 0.1, 0.1], [0.1, 2.0, 2.0], "partly"),              # a shaped seed collapses, its mean does not
    ([0.1, 0.1, 0.1], [0.1, 0.1, 0.1], "not reproduced"),
    ([2.0, 2.0, 2.0], [2.0, 2.0, 2.0], "inconclusive"),        # the grid never reaches the collapse regime
])
def test_entropy_collapse(pre_top, shaped_top, verdict):
    s = run(entropy_collapse, {}, ec_points(pre_top, shaped_top))
    assert s["verdict"] == verdict and s["verdicts"]["temperature"][0] == verdict
    assert s["models"]["preln"]["lr_grid"] == LRS


def test_entropy_collapse_extends_upward_until_pre_ln_collapses():
    ext = entropy_collapse.CLAIM.extend
    stays = [pt("preln", "scored", lr, 0, 5.0, logged={"entropy": 2.0}) for lr in LRS]
    assert ext(LRS, stays) == ([0.333], "Pre-LN did not collapse up to lr 0.1: added 0.333")
    stays[-1]["logged"]["entropy"] = 0.1
    assert ext(LRS, stays) is None


# --- dslm-depth: DSLM trains at depth where the standard init does not

DSLM = {"depth": 4, "deep_depth": 8, "width": 16, "heads": 2}
DGRID = [3e-3, 1e-2, 3e-2]


def dslm_points(dslm_final, std_final, admin_final=((5.0, 5.0), (5.0, 5.0))):
    u = 5.0
    out = []
    for n in ("preln", "postln"):
        out += tuned(f"dslm-{n}", DGRID, [4.8, 4.5, 4.9], 1e-2, dslm_final, u, (0, 1))
        out += [pt(f"standard-{n}", "tuning", g, TUNING, x, u) for g, x in zip(DGRID, [5.0, 5.0, 5.1])]
        out += [pt(f"standard-{n}", "scored", 1e-2, s, x, u) for s, x in zip((0, 1), std_final)]
    for mode, finals in zip(("profile", "constant"), admin_final):
        out += tuned(f"admin-{mode}", DGRID, [5.0, 4.7, 5.0], 1e-2, finals, u, (0, 1))
    return out + [pt("dslm-preln-deep", "scored", 1e-2, s, 4.6, u) for s in (0, 1)]


@pytest.mark.parametrize("dslm_final, std_final, steps, verdict", [
    ([4.5, 4.5], [5.0, 5.0], 300, "reproduced"),
    ([4.5, 4.5], [4.8, 5.0], 300, "partly"),                    # one standard run trains
    ([4.95, 4.5], [5.0, 5.0], 300, "not reproduced"),           # a DSLM run does not train
    ([4.5, 4.5], [5.0, 5.0], 200, "inconclusive"),              # shorter than the rule's 300 steps
])
def test_dslm_depth(dslm_final, std_final, steps, verdict):
    s = run(dslm_depth, {**DSLM, "steps": steps}, dslm_points(dslm_final, std_final))
    assert s["verdict"] == verdict
    r = s["results"]
    assert r["dslm-preln"]["largest_stable_lr"] == 3e-2 and r["standard-preln"]["largest_stable_lr"] is None


@pytest.mark.parametrize("admin_final, dslm_final, verdict, answer", [
    (((4.7, 4.8), (5.0, 5.0)), [4.5, 4.5], "reproduced", "Post-LN models that train: Post-LN Admin (profile), "
                                                         "Post-LN DSLM"),
    (((4.7, 5.0), (5.0, 5.0)), [4.5, 4.5], "partly", "Post-LN models that train: Post-LN Admin (profile), "
                                                     "Post-LN DSLM"),
    (((5.0, 5.0), (5.0, 5.0)), [4.95, 4.95], "not reproduced", "no Post-LN model trains"),
])
def test_dslm_depth_admin_rule(admin_final, dslm_final, verdict, answer):
    """Admin's further rule: does an Admin Post-LN model train at depth, and which Post-LN models do."""
    s = run(dslm_depth, {**DSLM, "steps": 300}, dslm_points(dslm_final, [5.0, 5.0], admin_final))
    got, reason = s["verdicts"]["admin-postln"]
    assert got == verdict and reason.endswith(answer + ".")
    s = run(dslm_depth, {**DSLM, "steps": 200}, dslm_points(dslm_final, [5.0, 5.0], admin_final))
    assert s["verdicts"]["admin-postln"][0] == "inconclusive"


# --- dslm-postln-horizon: at the papers' long horizon, DSLM Post-LN trains where standard Post-LN does not

HOR = {"depth": 4, "width": 16, "heads": 2}
HGRID = [3e-5, 1e-4, 3e-4, 1e-3]


def horizon_points(finals, improving=(False,) * 4, reference=4.5):
    """Each model tuned with its optimum inside the grid; scored on seed 0 at 1e-4 with ``finals`` (DSLM Post-LN,
    standard Post-LN, Admin) and ``reference`` (DSLM Pre-LN); unigram 5.0."""
    out = []
    for key, final, better in zip(postln_horizon.MODELS, [*finals, reference], improving):
        out += [pt(key, "tuning", g, TUNING, x, 5.0) for g, x in zip(HGRID, [5.0, 4.6, 4.8, 5.0])]
        out.append(pt(key, "scored", 1e-4, 0, final, 5.0, {"improving": better}))
    return out


@pytest.mark.parametrize("finals, improving, steps, verdict, cause", [
    ((4.6, 5.0, 5.0), (False,) * 4, 2000, "reproduced", "yes"),
    ((4.6, 4.7, 5.0), (False,) * 4, 2000, "partly", "yes"),             # standard Post-LN trains too
    ((5.0, 5.0, 4.7), (False,) * 4, 2000, "not reproduced", "yes"),     # only Admin trains
    ((5.0, 5.0, 5.0), (True, False, False, False), 2000, "not reproduced", "open"),
    ((5.0, 5.0, 5.0), (False,) * 4, 2000, "not reproduced", "no"),
    ((4.6, 5.0, 5.0), (False,) * 4, 1000, "inconclusive", "yes"),       # shorter than the rule's horizon
])
def test_postln_horizon(finals, improving, steps, verdict, cause):
    s = run(postln_horizon, {**HOR, "steps": steps, "warmup": steps // 4}, horizon_points(finals, improving))
    assert s["verdict"] == verdict and s["verdicts"]["horizon-cause"][0] == cause
    assert run(postln_horizon, {**HOR, "steps": 2000, "warmup": 200},
               horizon_points(finals, improving))["verdict"] == "inconclusive"          # warmup under 25 %
    assert run(postln_horizon, {**HOR, "steps": 2000, "warmup": 500},
               horizon_points(finals, improving, reference=5.0))["verdict"] == "inconclusive"   # the regime fails


def test_a_run_still_improving_fell_over_the_last_quarter():
    from sigprop.experiments.verdicts import improving

    assert improving([[0, 6.0], [1500, 5.0], [2000, 4.9]], 2000)
    assert not improving([[0, 6.0], [1500, 5.0], [2000, 4.99]], 2000)
    assert not improving([[0, 6.0], [1500, 5.0], [2000, math.nan]], 2000)


# --- deep-thin: deeper-thinner beats shallow-wide in every setting

SETTINGS = ("encoder-preln", "vit")


def dt_points(gaps, edge=False):
    out = []
    for name, gap in zip(SETTINGS, gaps):
        grid = list(deep_thin.SETTINGS[name].lrs)
        loss = [3.2, 3.0, 2.9] if edge else [3.2, 3.0, 3.1]
        out += tuned(f"{name}/deep-thin", grid, loss, grid[1], [3.0, 3.02], 3.9, (0, 1))
        out += tuned(f"{name}/shallow-wide", grid, [3.2, 3.0, 3.1], grid[1], [3.0 + gap, 3.02 + gap], 3.9, (0, 1))
    return out


@pytest.mark.parametrize("gaps, edge, verdict", [
    ((0.2, 0.2), False, "reproduced"),
    ((0.2, 0.0), False, "partly"),
    ((-0.1, 0.01), False, "not reproduced"),                    # Δ = 0.01 is inside the combined s.e.
    ((0.2, 0.2), True, "inconclusive"),
])
def test_deep_thin(gaps, edge, verdict):
    s = run(deep_thin, {"settings": SETTINGS}, dt_points(gaps, edge))
    assert s["verdict"] == verdict
    assert s["results"]["vit"]["gap"] == pytest.approx(gaps[1])
    assert s["results"]["encoder-preln"]["unigram_val_loss"]["mean"] == 3.9


def test_deep_thin_pairs_match_parameters():
    """Deep-thin has ≤ and within 10 % of shallow-wide's total parameters, and equal block weights."""
    for setting in deep_thin.SETTINGS.values():
        deep, wide = (deep_thin.model_table(setting, deep_thin.SHAPES[k]) for k in ("deep-thin", "shallow-wide"))
        ratio = param_count(deep) / param_count(wide)
        assert 0.9 <= ratio <= 1.0, (setting, ratio)
        ne = non_embedding_count(deep) / non_embedding_count(wide)
        assert abs(ne - 1) < 0.01, (setting, ne)


# --- depth-transfer: η* carries across depth (depth-μP, CompleteP) and width (μP), moves under standard rules

TGRID = [5e-4 * 2 ** k for k in range(7)]               # 5e-4 … 3.2e-2
TSIZES = {"depths": (2, 8), "widths": (32, 64), "lrs": tuple(TGRID), "width": 16}


def dt_transfer_points(best):
    """Loss (log2 lr − log2 η*)² + 4 per (panel, size); ``best``: panel key → (η* smallest, η* largest)."""
    out = []
    for panel in (*depth_transfer.DEPTH, *depth_transfer.WIDTH):
        sizes = TSIZES["depths"] if panel in depth_transfer.DEPTH else TSIZES["widths"]
        for size, eta in zip(sizes, best.get(panel, (TGRID[3], TGRID[3]))):
            out += [pt(f"{panel}/{size}", "scored", lr, 0, (math.log2(lr) - math.log2(eta)) ** 2 + 4, 5.2,
                       logged={"max_attn_logit": 1.0, "min_attn_entropy": 1.0, "grad_norm_median": 1.0,
                               "grad_norm_max": 2.0}) for lr in TGRID]
    return out


@pytest.mark.parametrize("best, verdict", [
    ({"preln": (TGRID[3], TGRID[1])}, "reproduced"),                            # Pre-LN moves ×4
    ({"preln": (TGRID[3], TGRID[1]), "width-mup": (TGRID[3], TGRID[5])}, "partly"),
    ({k: (TGRID[1], TGRID[3]) for k in ("completep", "depth-mup", "width-mup")}, "not reproduced"),
    ({k: (TGRID[3], TGRID[6]) for k in ("completep", "depth-mup", "width-mup")}, "inconclusive"),   # at the top
])
def test_depth_transfer(best, verdict):
    s = run(depth_transfer, TSIZES, dt_transfer_points(best))
    assert s["verdict"] == verdict
    panels = s["results"]["panels"]
    assert panels["completep"]["status"] == {"reproduced": "transfers", "partly": "transfers",
                                             "not reproduced": "moves", "inconclusive": "undetermined"}[verdict]
    assert panels["preln"]["transfer_regret"] >= 0
    assert panels["preln"]["explain"]["8"]["largest_lr"][0]["lr"] == TGRID[-1]


def test_depth_transfer_brackets_every_size_of_a_panel():
    ext = depth_transfer.CLAIM.extend
    inside = [pt("a/1", "scored", lr, 0, x) for lr, x in zip(TGRID[:3], [5.0, 4.0, 4.5])]
    top = [pt("a/2", "scored", lr, 0, x) for lr, x in zip(TGRID[:3], [5.0, 4.5, 4.0])]
    bottom = [pt("a/3", "scored", lr, 0, x) for lr, x in zip(TGRID[:3], [4.0, 4.5, math.nan])]
    assert ext(TGRID[:3], inside) is None
    assert ext(TGRID[:3], inside + top + bottom)[0] == [2.5e-4, 4e-3]


# --- growth: the grown model reaches scratch's final loss with ≥ 10 % less compute on every seed

GGRID = list(growth.FULL["lrs"])


def growth_points(crossings, scratch_final=(4.6, 4.6, 4.6), edge=False):
    """Scratch ends at ``scratch_final``; the grown run's curve falls linearly in compute from 7.0 to 4.0 and
    crosses 4.6 at the compute fraction ``crossings[i]`` of scratch's (None: it ends at 4.7, above it)."""
    s = growth.FULL
    scratch_attrs, grown_attrs = (m.attrs for m in growth.models(s))
    total = growth.compute_at(scratch_attrs, scratch_attrs["steps"])
    steps = grown_attrs["steps"]
    curves = []
    for f in crossings:
        end = growth.compute_at(grown_attrs, steps)
        c = [growth.compute_at(grown_attrs, t) for t in range(0, steps + 1, 10)]
        # the line through (0, 7.0) and (f·total, 4.6), floored at 4.7 when the run never reaches 4.6
        slope = (7.0 - 4.6) / (f * total) if f else 2.3 / end
        curves.append([[t, max(7.0 - slope * x, 4.0 if f else 4.7)] for t, x in zip(range(0, steps + 1, 10), c)])
    pts = [pt("scratch", "tuning", g, TUNING, x, 5.2) for g, x in zip(GGRID, [4.9, 4.6, 4.8] if not edge
                                                                         else [4.9, 4.8, 4.6])]
    pts += [pt("grown", "tuning", g, TUNING, x, 5.2) for g, x in zip(GGRID, [4.9, 4.6, 4.8])]
    pts += [pt("scratch", "scored", GGRID[1], seed, x, 5.2, {"val_curve": [[0, 7.0], [600, x]]})
            for seed, x in enumerate(scratch_final)]
    pts += [pt("grown", "scored", GGRID[1], seed, c[-1][1], 5.2, {"val_curve": c}) for seed, c in enumerate(curves)]
    return pts


@pytest.mark.parametrize("crossings, scratch_final, edge, verdict", [
    ([0.7, 0.8, 0.85], (4.6,) * 3, False, "reproduced"),
    ([0.7, 0.95, 0.85], (4.6,) * 3, False, "partly"),        # every seed within the compute, one saves < 10 %
    ([0.7, None, 0.85], (4.6,) * 3, False, "not reproduced"),
    ([0.7, 0.8, 0.85], (4.6,) * 3, True, "inconclusive"),    # scratch's optimum at its grid's top
    ([0.7, 0.8, 0.85], (5.15, 4.6, 4.6), False, "inconclusive"),    # scratch does not train on seed 0
])
def test_growth(crossings, scratch_final, edge, verdict):
    s = run(growth, {}, growth_points(crossings, scratch_final, edge))
    assert s["verdict"] == verdict
    if scratch_final[0] == 4.6:
        got = s["results"]["fractions"]
        assert [f is None for f in got] == [c is None for c in crossings]
        assert [f for f in got if f is not None] == pytest.approx([c for c in crossings if c is not None], rel=1e-9)


def test_growth_counts_compute_at_the_depth_of_each_step():
    """Equal FLOPs: the grown schedule spends scratch's compute; the crossing is linear in compute."""
    s = growth.FULL
    scratch, grown = (m.attrs for m in growth.models(s))
    total = growth.compute_at(scratch, scratch["steps"])
    assert growth.compute_at(grown, grown["steps"]) == pytest.approx(total, rel=grown["flops_after"] / total)
    assert grown["flops_before"] < grown["flops_after"] == scratch["flops_after"]
    a = {"grow_at": 10, "flops_before": 1.0, "flops_after": 4.0}
    assert growth.compute_at(a, 5) == 5 and growth.compute_at(a, 12) == 18
    assert growth.compute_to_reach(a, [[0, 7.0], [10, 5.0], [12, 4.0]], 4.5) == pytest.approx(14.0)
    assert growth.compute_to_reach(a, [[0, 7.0], [10, 5.0]], 4.5) is None


ROOT = Path(__file__).resolve().parents[1]
CLAIM_MODULES = sorted({registry.EXPERIMENTS[n].split(":")[0] for n in registry.EXPERIMENTS if registry.is_claim(n)})
HARNESS = {"claim", "outputs", "report", "training", "tuning"}


@pytest.mark.parametrize("module", CLAIM_MODULES)
def test_a_claim_is_its_module_and_its_rule(module):
    """A claim states only its models, sizes, rule and special table or plot: its module is at most 120 lines, and
    within `sigprop.experiments` it imports the harness, `verdicts` (its rule) and other claims only."""
    text = (ROOT / "src" / "sigprop" / "experiments" / f"{module}.py").read_text()
    assert len(text.splitlines()) <= 120
    local = {n.module or a.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.level == 1
             for a in n.names}
    assert local <= HARNESS | {"verdicts"} | set(CLAIM_MODULES), local


@pytest.mark.slow
def test_committed_summaries_rejudge_from_their_own_numbers():
    """Every committed claim summary (docs/results/NAME.json) in the harness's schema gives back its verdicts and
    results when its claim's rules and derive run on it alone; no summary is in another schema."""
    other = set()
    for path in [ROOT / "docs" / "results" / f"{n}.json" for n in registry.EXPERIMENTS if registry.is_claim(n)]:
        if not path.exists():
            continue
        saved = json.loads(path.read_text())
        if "claim" not in saved:
            other.add(path.stem)
            continue
        claim = registry.entry(saved["claim"])
        assert claim.rule(saved) == (saved["verdict"], saved["verdict_reason"])
        assert {k: list(r(saved)) for k, r in claim.rules.items()} == saved["verdicts"]
        derived = json.loads(json.dumps(claim.derive(saved))) if claim.derive else {}
        assert json.dumps(derived, sort_keys=True) == json.dumps(saved["results"], sort_keys=True), path.stem
    assert not other, other
