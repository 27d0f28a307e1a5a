"""The lr benchmark's scoring (`sigprop.advice.benchmark`) on configs written by hand."""
import math

import pytest

from sigprop.advice.benchmark import Config, balanced_accuracy, by_family, fixed, least_regret, overall, score, summary

GRID = (1e-3, 1e-2, 1e-1)


def cfg(family, losses, level=5.0, key=None):
    return Config(family, key or f"{family}-{losses}", GRID, tuple(losses), tuple(losses), (False,) * len(losses),
                  level, {}, 10.0)


def test_regret_reads_the_loss_between_grid_lrs_in_log_lr_and_the_nearest_outside():
    c = cfg("a", (4.0, 3.0, 5.0))
    assert c.regret([1e-2]) == 0 and c.regret([1e-3]) == 1.0
    assert c.regret([math.sqrt(1e-3 * 1e-2)]) == pytest.approx(0.5)         # half way in log lr
    assert c.regret([1e-5]) == 1.0 and c.regret([1.0]) == 2.0               # nearest grid lr outside the grid
    assert c.regret([1e-3, 1e-1]) == 1.0                                    # the better of two runs


def test_outcomes_split_failures_by_the_largest_lr_that_trains():
    assert cfg("a", (4.95, 4.5, 5.0)).outcomes() == ["stalls", "trains", "diverges"]
    assert cfg("a", (5.0, 5.0, 5.0)).outcomes() == ["stalls"] * 3           # nothing trains: nothing diverges


def test_fixed_choosers_never_see_the_scored_family_unless_in_hindsight():
    configs = [cfg("a", (4.0, 3.0, 5.0)), cfg("a", (4.0, 3.1, 5.0)), cfg("b", (3.0, 4.0, 5.0))]
    assert least_regret(configs, 1) == (1e-2,) and least_regret(configs, 2) == (1e-3, 1e-2)
    lofo = score(configs, fixed(1))
    assert [r["lrs"] for r in lofo] == [[1e-3], [1e-3], [1e-2]]              # each fitted on the other family
    assert [r["regret"] for r in lofo] == pytest.approx([1.0, 0.9, 1.0])
    assert [r["regret"] for r in score(configs, fixed(1, hindsight=True))] == pytest.approx([0, 0, 1.0])
    s = summary(score(configs, fixed(2)))
    assert s["cost"] == 1.0 and s["n"] == 3


def test_balanced_accuracy_weights_each_achieved_outcome_equally():
    achieved = ["trains"] * 8 + ["stalls", "diverges"]
    assert balanced_accuracy(["trains"] * 10, achieved) == pytest.approx(1 / 3)
    assert balanced_accuracy(achieved, achieved) == 1.0


def test_the_tables_read_each_choosers_rows():
    configs = [cfg("a", (4.0, 3.0, 5.0)), cfg("a", (4.0, 3.1, 5.0)), cfg("b", (3.0, 4.0, 5.0))]
    said = lambda c, every: {"lrs": (1e-2,), "cost": 0.5, "said": ["stalls", "trains", "diverges"]}
    results = {"fixed": score(configs, fixed(1)), "said": score(configs, said)}
    rows = overall(results).splitlines()
    assert rows[2] == "| fixed | 1.000 | 0.967 | 0% | 0 | – |"
    assert rows[3].startswith("| said | 0.000 | 0.333 | 67% | 0.5 | ")       # stalls at 1e-3 in a: not said right
    assert by_family(configs, results).splitlines()[0] == "| chooser | a (2) | b (1) |"
    assert by_family(configs, results).splitlines()[3] == "| said | 0.000 (100%) | 1.000 (0%) |"
    noted = lambda c, every: {"lrs": (1e-2,), "cost": 0.0, "note": "one step size" if c.family == "b" else ""}
    table = by_family(configs, {"noted": score(configs, noted)}).splitlines()
    assert table[2] == "| noted | 0.000 (100%) | 1.000 (0%) † |" and table[-1] == "† noted: one step size"


def test_a_classifiers_stall_level_is_its_class_prior(tmp_path):
    """For the digits ViT the stall level is the class prior's cross-entropy: near log 10 (ten classes, about
    equally frequent), not a token frequency."""
    from helpers import CONFIGS
    from sigprop.train import load_config, train
    from sigprop.train.levels import unigram_loss

    train(load_config(CONFIGS / "vit_digits.toml", [f"train.out_dir={tmp_path}", "train.steps=1", "train.eval_every=1",
                                                    "train.progress=false", "model.n_layers=1"]))
    assert abs(unigram_loss(tmp_path) - math.log(10)) < 0.05


def test_a_chooser_that_fails_on_a_config_gives_no_answer_there_and_is_retried(tmp_path, capsys):
    from sigprop.advice.benchmark import NO_ANSWER, _cached

    calls = []

    def compute(c):
        calls.append(c.key)
        if len(calls) == 1:
            raise RuntimeError("a broken run")
        return {"lr": 1e-2}

    run = _cached("x", compute, tmp_path)
    c = cfg("a", (4.0, 3.0, 5.0))
    assert run(c, [c]) is None and "a broken run" in capsys.readouterr().err
    assert run(c, [c]) == {"family": "a", "key": c.key, "lr": 1e-2} and run(c, [c])["lr"] == 1e-2
    assert len(calls) == 2                                                   # kept once it succeeded
    assert score([c], lambda *_: NO_ANSWER)[0]["regret"] == math.inf


@pytest.mark.slow
def test_advise_lofo_decides_each_config_by_the_rule_fitted_on_the_other_families(tmp_path):
    """The refitted chooser reads each config's probe from the cache (its runs from the config) and applies the rule
    fitted on the other family alone; the families' best lrs sit at different multiples of their output-change scale,
    so a rule fitted with the scored family would recommend another lr."""
    from dataclasses import replace

    from sigprop.advice import fit as F
    from sigprop.advice.benchmark import _cached, lofo_chooser
    from sigprop.advice.rule import outcome
    from test_advice_fit import planted

    cases = [replace(x, probe=replace(x.probe, out_change=4 * x.probe.out_change)) for x in planted(0, 6)]
    cases += planted(1, 6)
    configs = [Config("a" if i < 6 else "b", f"c{i}", tuple(r.lr for r in x.runs), tuple(r.loss for r in x.runs),
                      tuple(r.initial_loss for r in x.runs), tuple(r.diverged for r in x.runs), x.unigram, {}, 10.0)
               for i, x in enumerate(cases)]
    rows = {c.key: {**F.case_row(replace(x, runs=())), "cost_s": 2.0} for c, x in zip(configs, cases)}
    for c in configs:
        _cached("probe", lambda c: rows[c.key], tmp_path)(c, configs)
    choose = lofo_chooser(tmp_path)
    every = F.fit(cases)
    for c, x in zip(configs, cases):
        d = x.decide(F.fit([y for e, y in zip(configs, cases) if e.family != c.family]))
        assert choose(c, configs) == {"lrs": (d.recommended,), "cost": 0.2,
                                      "said": [outcome(lr, d)[0] for lr in c.lrs]}
        assert d.recommended != pytest.approx(x.decide(every).recommended, rel=0.1)


@pytest.mark.slow
def test_halving_keeps_the_arm_its_rungs_read_off_the_grid_runs_by_the_schedule_the_other_families_choose(tmp_path):
    """The halving chooser centres each config's bracket on the grid lr nearest the rule refitted without its family,
    reads every arm's rung loss off that grid run's training losses, and halves by the schedule of least mean regret
    on the other families. The planted runs lead early at the larger lrs (a fast start that ends worse), so a short
    rung misleads and the schedules differ."""
    from dataclasses import replace

    from sigprop.advice import fit as F
    from sigprop.advice.benchmark import _cached, halving_chooser
    from sigprop.advice.halving import SCHEDULES, halve, rung_loss
    from test_advice_fit import planted

    steps, configs, cases = 100, [], []
    for f, seed in enumerate((0, 1, 2)):
        for i, x in enumerate(planted(seed, 3)):
            taus = [30.0 * (r.lr / x.runs[0].lr) ** -0.5 for r in x.runs]
            curves = tuple(tuple((9.0 if r.diverged else r.loss) + 2.0 * math.exp(-s / tau)
                                 for s in range(1, steps + 1)) for r, tau in zip(x.runs, taus))
            cases.append(replace(x, name=f"{'abc'[f]} c{i}"))
            configs.append(Config("abc"[f], f"c{i}", tuple(r.lr for r in x.runs),
                                  tuple(x.initial_loss if x.diverged else x.loss for x in x.runs),
                                  tuple(r.initial_loss for r in x.runs), tuple(r.diverged for r in x.runs), x.unigram,
                                  {"train": {"steps": steps}}, 10.0, curves))
    rows = {c.family + c.key: {**F.case_row(replace(x, runs=())), "cost_s": 2.0} for c, x in zip(configs, cases)}
    for c in configs:
        _cached("probe", lambda c: rows[c.family + c.key], tmp_path)(c, configs)

    fits = {}

    def pick(c, s, out):
        key = frozenset(out)
        if key not in fits:
            fits[key] = F.fit([y for e, y in zip(configs, cases) if e.family not in out])
        lr = cases[configs.index(c)].decide(fits[key]).recommended
        i = min(range(len(c.lrs)), key=lambda j: abs(math.log(c.lrs[j] / lr)))
        lo = min(max(0, i - s.arms // 2), len(c.lrs) - s.arms)
        arms = dict(zip(c.lrs[lo:lo + s.arms], c.curves[lo:lo + s.arms]))
        return halve(list(arms), lambda lr, n: rung_loss(dict(enumerate(arms[lr], 1)), n, steps), s, steps)[0]

    choose, chosen = halving_chooser(tmp_path), set()
    for c in configs:
        others = [x for x in configs if x.family != c.family]
        s = min(SCHEDULES, key=lambda s: (sum(x.regret([pick(x, s, {c.family, x.family})]) for x in others), s.extra))
        row = choose(c, configs)
        assert row["lrs"] == (pick(c, s, {c.family}),) and row["detail"] == str(s)
        assert row["cost"] == pytest.approx(s.extra + 0.2)
        chosen.add(str(s))
    assert len(chosen) > 1


def test_a_benchmark_json_gives_back_its_configs_curves_included(tmp_path):
    """`load_json` reads what ``--json`` writes (tuples back from lists, the training curves with them), and a file
    written before the curves existed loads without them."""
    import json
    from dataclasses import asdict, replace

    from sigprop.advice.benchmark import load_json
    c = replace(cfg("a", (4.0, 3.0, 5.0)), curves=((6.0, 5.0), (6.0, 4.0), (6.0, math.nan)))
    (tmp_path / "b.json").write_text(json.dumps({"configs": [asdict(c)], "results": {}}))
    back = load_json(tmp_path / "b.json")[0]
    assert back.lrs == c.lrs and back.losses == c.losses and back.curves[:2] == c.curves[:2]
    assert math.isnan(back.curves[2][1]) and back.train_losses(1e-2) == {1: 6.0, 2: 4.0}
    old = {k: v for k, v in asdict(c).items() if k != "curves"} | {"dirs": ["x", "y", "z"]}
    (tmp_path / "old.json").write_text(json.dumps({"configs": [old]}))
    assert load_json(tmp_path / "old.json")[0].curves == ()


def test_reference_configs_are_fitted_on_and_never_scored():
    """`score` scores its configs alone; a chooser sees the ``every`` configs too (the fixed lr of another family)."""
    scored = [cfg("new", (4.0, 3.0, 5.0))]
    reference = [cfg("old", (3.0, 4.0, 5.0)), cfg("old", (3.5, 4.0, 5.0), key="o2")]
    rows = score(scored, fixed(1), reference)
    assert [r["family"] for r in rows] == ["new"] and rows[0]["lrs"] == [1e-3] and rows[0]["regret"] == 1.0
    assert score(scored, fixed(1))[0]["regret"] == math.inf                 # no other family: no answer


def test_shipped_halving_reads_the_grid_runs_around_the_shipped_rules_lr(tmp_path):
    """The shipped chooser centres the shipped schedule's bracket on the grid lr nearest advise's lr (its cached
    probe), halves on the grid runs' curves, and costs the schedule's extra runs plus the probe's share of a run."""
    from dataclasses import replace

    from sigprop.advice.benchmark import _cached, choosers
    from sigprop.advice.halving import schedule_for

    grid, steps = (1e-4, 1e-3, 1e-2, 1e-1), 100
    finals = (4.5, 3.0, 3.2, 5.0)
    early = (4.9, 4.0, 4.5, 3.8)         # before step 60 each bracket's leader is not the run that ends best
    curves = tuple(tuple(e if s < 60 else f for s in range(1, steps + 1)) for e, f in zip(early, finals))
    c = replace(Config("x", "k", grid, finals, (7.0,) * 4, (False,) * 4, 5.0, {"train": {"steps": steps}}, 10.0),
                curves=curves)
    s = schedule_for(0.5)
    assert s.arms == 3 and s.rungs[-1] * steps < 60
    for advised, kept in ((2e-4, 1e-3), (0.05, 1e-1)):       # brackets 1e-4…1e-2 and 1e-3…1e-1 (shifted into the grid)
        cache = tmp_path / f"{advised:g}"
        probe = {"lr": advised, "cost_s": 1.0, "outcomes": ["trains"] * 4}
        _cached("advise", lambda c, probe=probe: probe, cache)(c, [c])
        row = choosers(cache, ["halving-shipped"])["halving-shipped"](c, [c])
        assert row["lrs"] == (kept,) and row["cost"] == pytest.approx(s.extra + 0.1)
        assert row["said"] == ["trains"] * 4 and row["detail"] == str(s)


def test_targets_are_met_or_not_by_the_rows_figures():
    from sigprop.advice.benchmark import targets

    def row(regret, cost=0.4, said=("trains",), achieved=("trains",)):
        return {"regret": regret, "cost": cost, "said": list(said), "achieved": list(achieved)}

    good = [row(0.0)] * 8 + [row(0.1)] * 2                                   # 80 % near, mean 0.02
    assert all(targets(good).values())
    assert targets(good[:7] + [row(0.1)] * 3)["≤ 0.05 on ≥ 80 %"] is False
    assert targets([row(0.0)] * 9 + [row(0.6)])["mean ≤ 0.05"] is False
    assert targets([row(0.0, cost=0.6)] * 10)["cost ≤ 0.5"] is False
    assert targets([row(0.0, said=())] * 10)["outcomes ≥ 0.8"] is False       # predicts no outcome
    assert targets([row(0.0, said=("stalls",))] * 10)["outcomes ≥ 0.8"] is False
    assert targets([row(0.0)] * 9 + [row(math.inf)])["every config answered"] is False
