"""`sigprop sweep`: validation before any run, resume (skip finished, re-run an interrupted point to the
same result), one tokenizer for all points, the report rebuilt from sweep.jsonl, and the metrics of
sigprop.train.sweep_report for ordered and categorical size axes."""
import json
import math
from pathlib import Path

import pytest

from sigprop.cli import main
from sigprop.train import sweep as sweep_mod
from sigprop.train import sweep_report
from sigprop.train.run_summary import read_run
from sigprop.train.sweep import finished_records, load_spec, resolve, run_sweep
from sigprop.train.sweep_report import NOT_APPLICABLE, plot_best_lr, summarize, write_report
from sigprop.train.tokenizer import BPETokenizer

BASE = """
[model]
arch = "decoder"
vocab_size = 300
d_model = 16
n_heads = 2
max_seq_len = 16
[data]
source = "pydoc"
seq_len = 16
max_chars = 20000
[optim]
warmup_steps = 1
[train]
steps = 3
batch_size = 4
eval_batches = 1
"""


def write(tmp_path, grid: str, extra: str = "") -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "sweep.toml"
    path.write_text(f'[sweep]\nout_dir = "{tmp_path / "out"}"\n{extra}\n[sweep.grid]\n{grid}\n{BASE}')
    return str(path)


GRID = '"optim.lr" = [1e-3, 1e-2]\nseed = [0]'


@pytest.fixture
def counted(monkeypatch):
    """Counts point runs and tokenizer trainings."""
    calls = {"points": 0, "tokenizer": 0}
    run_point, train_tok = sweep_mod.run_point, BPETokenizer.train

    def point(*a):
        calls["points"] += 1
        return run_point(*a)

    def tok(*a):
        calls["tokenizer"] += 1
        return train_tok(*a)

    monkeypatch.setattr(sweep_mod, "run_point", point)
    monkeypatch.setattr(BPETokenizer, "train", staticmethod(tok))
    return calls


def test_resume_skips_finished_and_reproduces_an_interrupted_point(tmp_path, counted):
    spec = load_spec(write(tmp_path, GRID))
    first = run_sweep(spec, progress=False)
    assert counted == {"points": 2, "tokenizer": 1}
    log = tmp_path / "out" / "sweep.jsonl"
    assert len(log.read_text().splitlines()) == 2
    assert all(json.loads(line)["config"]["data"]["tokenizer"].endswith(".json")
               for line in log.read_text().splitlines())
    with pytest.raises(ValueError, match="--resume"):
        run_sweep(spec, progress=False)
    # kill -9 during the last point: its line never written, its folder half-written
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])   # torn last line
    again = run_sweep(spec, resume=True, progress=False)
    assert counted == {"points": 3, "tokenizer": 1}          # one point re-run, no tokenizer retrained
    for a, b in zip(first, again):
        assert a["id"] == b["id"]
        for key in ("initial_val_loss", "final_val_loss", "best_val_loss", "grad_norm", "max_attn_logit"):
            assert a[key] == b[key], key
    assert len(finished_records(log)) == 2
    assert all(r["max_attn_logit"] is not None and r["min_attn_entropy"] is not None for r in again)


def test_resume_continues_a_stopped_point_from_its_checkpoint_to_the_same_result(tmp_path, counted):
    base = BASE.replace("steps = 3", "steps = 6\nckpt_every = 3\nkeep_last = 3")
    path = tmp_path / "sweep.toml"
    path.write_text(f'[sweep]\nout_dir = "{tmp_path / "out"}"\n[sweep.grid]\n"optim.lr" = [1e-2]\n{base}')
    spec = load_spec(path)
    first = run_sweep(spec, progress=False)[0]
    point = tmp_path / "out" / "points" / first["id"]
    whole = read_run(point)
    # killed after step 5: the step-6 checkpoint and the sweep's line never written, steps 4-5 logged
    (point / "checkpoints" / "step_00000006.json").unlink()
    metrics = point / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()
                               if json.loads(line)["step"] <= 5))
    (tmp_path / "out" / "sweep.jsonl").write_text("")
    again = run_sweep(spec, resume=True, progress=False)[0]
    assert counted["points"] == 2
    events = [json.loads(line).get("event") for line in metrics.read_text().splitlines()]
    assert "resumed" in events                                   # continued, not re-run from step 0
    resumed = read_run(point)
    assert [s for s, *_ in resumed["train_curve"]] == [1, 2, 3, 4, 5, 6]   # the cut-off steps 4-5 logged once
    for key in ("final_val_loss", "best_val_loss", "grad_norm", "steps_done"):
        assert again[key] == first[key], key
    assert resumed["val_curve"] == whole["val_curve"] and resumed["train_curve"] == whole["train_curve"]


def test_ckpt_minutes_checkpoints_on_the_clock(tmp_path):
    base = BASE.replace("steps = 3", "steps = 4\nckpt_minutes = 1e-9\nkeep_last = 10")
    path = tmp_path / "sweep.toml"
    path.write_text(f'[sweep]\nout_dir = "{tmp_path / "out"}"\n[sweep.grid]\n"optim.lr" = [1e-2]\n{base}')
    spec = load_spec(path)
    r = run_sweep(spec, progress=False)[0]
    saved = sorted(p.name for p in (tmp_path / "out" / "points" / r["id"] / "checkpoints").glob("step_*.json"))
    assert saved == [f"step_{s:08d}.json" for s in (1, 2, 3, 4)]
    with pytest.raises(ValueError, match="train.ckpt_minutes"):
        bad_base = BASE.replace("steps = 3", "steps = 3\nckpt_minutes = -1")
        path.write_text(f'[sweep]\nout_dir = "{tmp_path / "o2"}"\n[sweep.grid]\n"optim.lr" = [1e-2]\n{bad_base}')
        resolve(load_spec(path))


@pytest.mark.parametrize("grid,extra,match", [
    ('"optim.lrr" = [1e-3]', "", "optim.lrr"),
    ('"model.scheme" = ["preln", "nope"]', "", "scheme"),
    ('"optim.lr" = [1e-3, -1.0]', "", "optim.lr"),
    ('"optim.lr" = 1e-3', "", "optim.lr"),
    ('lr = [1e-3]', "", "'lr'"),
    ('"optim.lr" = [1e-3]', 'sizes = "model.d_model"', "sweep.sizes"),
    ('"optim.lr" = [1e-3, 1e-3]', "", "more than once"),
])
def test_bad_key_or_value_is_refused_before_any_run(tmp_path, counted, grid, extra, match):
    with pytest.raises(ValueError, match=match):
        run_sweep(load_spec(write(tmp_path, grid, extra)), progress=False)
    assert counted == {"points": 0, "tokenizer": 0}
    assert not (tmp_path / "out" / "sweep.jsonl").exists()


def test_cli_reports_a_bad_key(tmp_path, capsys):
    assert main(["sweep", "--config", write(tmp_path, '"train.stepz" = [1]')]) == 2
    assert "train.stepz" in capsys.readouterr().err


@pytest.mark.parametrize("grid,size", [
    ('"optim.lr" = [1e-3]\n"model.d_model" = [16, "wide"]', '"model.d_model"'),     # numbers and strings
    ('"optim.lr" = [1e-3]\n"model.dropout" = [0.0, nan]', '"model.dropout"'),          # not a finite number
    (GRID, '"seed"'),                                                                  # averaged over
    (GRID, '"optim.lr"'),                                                              # every curve's x
    (GRID, '["optim.lr"]'),                                                            # not a key
])
def test_a_size_axis_the_report_cannot_use_is_refused_before_any_run(tmp_path, counted, capsys, grid, size):
    assert main(["sweep", "--config", write(tmp_path, grid, f"size = {size}")]) == 2
    err = capsys.readouterr().err
    assert "sweep.size=" in err and len(err.strip().splitlines()) == 1
    assert counted == {"points": 0, "tokenizer": 0}
    assert not (tmp_path / "out" / "sweep.jsonl").exists()


def report_files(out: Path) -> list[Path]:
    return [out / name for name in ("summary.json", "summary.md", "loss_vs_lr.png", "best_lr.png")]


def test_categorical_size_sweep_writes_its_report(tmp_path, capsys):
    grid = '"optim.lr" = [1e-3, 1e-2]\n"model.parametrization" = ["standard", "mup"]\nseed = [0]'
    assert main(["sweep", "--config", write(tmp_path, grid, 'size = "model.parametrization"')]) == 0
    out = tmp_path / "out"
    assert all(f.stat().st_size > 0 for f in report_files(out))
    summary = json.loads((out / "summary.json").read_text())
    (panel,) = summary["panels"]
    assert panel["sizes"] == ["standard", "mup"]
    assert panel["transfer_regret"] == panel["best_lr_ratio"] == NOT_APPLICABLE
    assert "model.parametrization holds categories" in summary["not_applicable"]["transfer_regret"]
    assert [g["size"] for g in summary["groups"]] == ["standard", "mup"]
    assert all(g["best_lr"] in (1e-3, 1e-2) and math.isfinite(g["sensitivity"]) for g in summary["groups"])
    assert "transfer regret: not applicable" in (out / "summary.md").read_text()


def test_a_failed_report_keeps_the_points_and_report_only_rebuilds_it(tmp_path, counted, capsys, monkeypatch):
    cfg = write(tmp_path, GRID)
    out = tmp_path / "out"
    assert main(["sweep", "--config", cfg, "--report-only"]) == 2                    # nothing to report yet
    assert "no finished point" in capsys.readouterr().err

    def broken(*a, **k):
        raise RuntimeError("no figure")

    monkeypatch.setattr(sweep_report, "plot_best_lr", broken)
    assert main(["sweep", "--config", cfg]) == 1
    err = capsys.readouterr().err
    assert "no figure" in err and f"sigprop sweep --config {cfg} --report-only" in err
    lines = (out / "sweep.jsonl").read_text()
    assert len(finished_records(out / "sweep.jsonl")) == 2 and not (out / "best_lr.png").exists()
    monkeypatch.undo()

    assert main(["sweep", "--config", cfg, "--report-only"]) == 0
    assert all(f.stat().st_size > 0 for f in report_files(out))
    for f in report_files(out):
        f.unlink()
    assert main(["sweep", "--config", cfg, "--resume"]) == 0                         # nothing left to run
    assert all(f.stat().st_size > 0 for f in report_files(out))
    assert counted["points"] == 2 and (out / "sweep.jsonl").read_text() == lines


def rec(point, init, final, diverged=False):
    return {"point": point, "config": {"optim": {"lr": point["optim.lr"]}}, "initial_val_loss": init,
            "final_val_loss": math.nan if diverged else final, "diverged": diverged}


def test_metrics_by_hand(tmp_path):
    """Two depths × three lrs: η*, edge, sensitivity and transfer regret from their definitions."""
    rs = [rec({"optim.lr": lr, "model.n_layers": n}, 6.0, f, d) for n, lr, f, d in [
        (2, 1e-3, 5.0, False), (2, 1e-2, 4.0, False), (2, 1e-1, 4.5, False),
        (8, 1e-3, 4.2, False), (8, 1e-2, 4.4, False), (8, 1e-1, 0.0, True)]]
    s = summarize(rs, "model.n_layers")
    shallow, deep = s["groups"]
    assert (shallow["best_lr"], shallow["edge"]) == (1e-2, False)
    assert (deep["best_lr"], deep["edge"]) == (1e-3, True)
    assert shallow["sensitivity"] == pytest.approx((5.0 + 4.0 + 4.5) / 3 - 4.0)
    assert deep["sensitivity"] == pytest.approx((4.2 + 4.4 + 6.0) / 3 - 4.2)      # diverged → loss at init
    (panel,) = s["panels"]
    assert panel["transfer_regret"] == pytest.approx(4.4 - 4.2)
    assert panel["best_lr_ratio"] == pytest.approx(0.1)
    out = write_report(rs, "model.n_layers", tmp_path)
    assert "⚠ edge" in out["table"]
    for name in ("summary.json", "summary.md", "loss_vs_lr.png", "best_lr.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_transfer_regret_needs_the_smallest_sizes_best_lr_in_the_largest_sizes_grid():
    """Grids centred per group (around advice) differ between sizes: no transfer regret, and the reason."""
    rs = [rec({"optim.lr": lr, "model.n_layers": n}, 6.0, f) for n, lr, f in [
        (2, 1e-3, 5.0), (2, 4e-3, 4.0), (8, 5e-4, 4.2), (8, 2e-3, 4.4)]]
    s = summarize(rs, "model.n_layers")
    (panel,) = s["panels"]
    assert panel["transfer_regret"] == NOT_APPLICABLE and panel["best_lr_ratio"] == pytest.approx(5e-4 / 4e-3)
    assert "grids differ" in s["not_applicable"]["transfer_regret"]
    assert "transfer regret: not applicable" in sweep_report.table(s)


def test_categorical_and_ordered_size_axes_by_hand():
    """Booleans are categories in grid order, each with its own η* and sensitivity, and no transfer regret; a
    numeric axis with a size ≤ 0 is drawn on a linear x (a log x would drop it)."""
    rs = [rec({"optim.lr": lr, "model.qk_norm": q}, 6.0, f) for q, lr, f in [
        (True, 1e-3, 5.0), (True, 1e-2, 4.0), (True, 1e-1, 4.5),
        (False, 1e-3, 4.2), (False, 1e-2, 4.4), (False, 1e-1, 4.8)]]
    s = summarize(rs, "model.qk_norm")
    on, off = s["groups"]
    assert (on["size"], on["best_lr"], on["edge"]) == (True, 1e-2, False)
    assert (off["size"], off["best_lr"], off["edge"]) == (False, 1e-3, True)
    assert off["sensitivity"] == pytest.approx((4.2 + 4.4 + 4.8) / 3 - 4.2)
    (panel,) = s["panels"]
    assert panel["sizes"] == [True, False] and panel["transfer_regret"] == NOT_APPLICABLE
    assert set(s["not_applicable"]) == {"transfer_regret", "best_lr_ratio"}
    ax = plot_best_lr(s).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["True", "False"]
    weight_decay = [rec({"optim.lr": lr, "optim.weight_decay": w}, 6.0, 5.0 - lr - w) for w in (0.0, 0.1)
                    for lr in (1e-3, 1e-2)]
    assert plot_best_lr(summarize(weight_decay, "optim.weight_decay")).axes[0].get_xscale() == "linear"
    with pytest.raises(ValueError, match="sweep.size='model.qk_norm'"):
        summarize([*rs, rec({"optim.lr": 1e-3, "model.qk_norm": "on"}, 6.0, 5.0)], "model.qk_norm")


@pytest.mark.slow
def test_worker_processes_match_in_process(tmp_path):
    grid = '"optim.lr" = [1e-3, 1e-2]\nseed = [0]'
    a = run_sweep(load_spec(write(tmp_path / "a", grid)), jobs=1, progress=False)
    b = run_sweep(load_spec(write(tmp_path / "b", grid)), jobs=2, progress=False)
    assert [r["final_val_loss"] for r in a] == [r["final_val_loss"] for r in b]


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs" / "sweep").glob("*.toml")))
def test_shipped_sweep_configs_resolve(path):
    spec = load_spec(path)
    points = resolve(spec)
    assert len(points) > 1 and spec.size in spec.grid


@pytest.mark.parametrize("path", sorted(p for p in (Path(__file__).resolve().parents[1] / "configs" / "advise_bench")
                                        .glob("*.toml") if p.name != "base.toml"))
def test_the_lr_benchmarks_families_resolve_over_one_grid(path):
    """Every family sweeps the shared ×3 grid from 1e-4 to 0.3; one whose models train best near its top goes on
    at the same spacing."""
    spec = load_spec(path)
    lrs = spec.grid["optim.lr"]
    assert len(resolve(spec)) >= 8 and lrs[:8] == [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
    assert all(3 <= b / a <= 10 / 3 + 1e-9 for a, b in zip(lrs[7:], lrs[8:]))


def test_a_point_folder_of_other_files_is_not_cleared(tmp_path):
    """A point starts from scratch by clearing its folder, by the run-folder rule: never a folder of other files."""
    spec = load_spec(write(tmp_path, GRID))
    point, cfg = resolve(spec)[0]
    folder = Path(cfg.train.out_dir)
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files that sigprop did not write"):
        sweep_mod.run_point(sweep_mod.point_id(spec, point), point, cfg.to_dict())
    assert (folder / "notes.txt").read_text() == "mine"


def test_a_grid_over_the_old_norm_key_resolves_to_norm_placement(tmp_path):
    """A grid over ``model.norm`` (the deprecated name) gives each point the config of ``model.norm_placement``."""
    dslm = '[sweep.set]\n"model.scheme" = "dslm"'
    with pytest.warns(DeprecationWarning, match=r"model\.norm is deprecated; it is called model\.norm_placement"):
        old = resolve(load_spec(write(tmp_path / "old", '"model.norm" = ["preln", "postln"]', dslm)))
    new = resolve(load_spec(write(tmp_path / "new", '"model.norm_placement" = ["pre", "post"]', dslm)))
    assert [c.model for _, c in old] == [c.model for _, c in new]
    assert [c.model.norm_placement for _, c in old] == ["pre", "post"]


def test_around_advice_centres_each_groups_grid_on_its_own_lr(tmp_path, counted, capsys):
    """Each group (scheme) gets the grid's shape around its own centre, measured once for all its seeds and kept
    for --resume and --report-only; a folder centred on advice is refused without the flag."""
    cfg = write(tmp_path, '"optim.lr" = [0.5, 2.0]\n"model.scheme" = ["preln", "dslm"]\nseed = [0, 1]',
                "around_advice = true")
    asked = []

    def centre(c):
        asked.append((c.model.scheme, c.train.seed, c.data.tokenizer))
        return {"preln": 1e-3, "dslm": 4e-3}[c.model.scheme], {"why": "test"}

    records = run_sweep(load_spec(cfg), progress=False, centre=centre)
    assert [(s, seed) for s, seed, _ in asked] == [("preln", 0), ("dslm", 0)]
    assert all(tok for _, _, tok in asked)                                  # the sweep's pinned tokenizer
    lrs = {(r["point"]["model.scheme"], r["point"]["seed"]): [] for r in records}
    for r in records:
        lrs[r["point"]["model.scheme"], r["point"]["seed"]].append(r["point"]["optim.lr"])
        assert r["config"]["optim"]["lr"] == r["point"]["optim.lr"]
    assert lrs == {("preln", 0): [5e-4, 2e-3], ("preln", 1): [5e-4, 2e-3], ("dslm", 0): [2e-3, 8e-3],
                   ("dslm", 1): [2e-3, 8e-3]}
    out = tmp_path / "out"
    assert json.loads((out / "lr_centres.json").read_text())["scheme=dslm"] == {"lr": 4e-3, "detail": {"why": "test"}}
    assert run_sweep(load_spec(cfg), resume=True, progress=False, centre=centre) == records
    assert len(asked) == 2 and counted["points"] == 8

    plain = write(tmp_path, '"optim.lr" = [0.5, 2.0]\n"model.scheme" = ["preln", "dslm"]\nseed = [0, 1]')
    assert main(["sweep", "--config", plain, "--report-only"]) == 2
    assert "centred on advice" in capsys.readouterr().err
    assert main(["sweep", "--config", plain, "--report-only", "--around-advice"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [g["lrs"] for g in summary["groups"]] == [[5e-4, 2e-3], [2e-3, 8e-3]]


@pytest.mark.parametrize("grid,match", [
    ('"model.scheme" = ["preln"]', "needs sweep.grid.'optim.lr'"),
    ('"optim.lr" = [0.0, 1.0]', "positive numbers"),
])
def test_around_advice_needs_an_lr_grid_to_centre(tmp_path, counted, grid, match):
    with pytest.raises(ValueError, match=match):
        load_spec(write(tmp_path, grid, "around_advice = true"))
    assert counted == {"points": 0, "tokenizer": 0}


def test_around_advice_refuses_a_centre_that_is_not_a_positive_lr(tmp_path, counted):
    spec = load_spec(write(tmp_path, GRID, "around_advice = true"))
    with pytest.raises(ValueError, match="advised lr of group 'all' is nan"):
        run_sweep(spec, progress=False, centre=lambda c: (math.nan, {}))
    assert counted["points"] == 0


@pytest.mark.slow
def test_around_advice_from_the_command_line_uses_advise(tmp_path):
    """``sigprop sweep --around-advice``: the centre is advise's recommended lr for the group's config."""
    from sigprop.advice import advise

    cfg = write(tmp_path, '"optim.lr" = [0.5, 2.0]\nseed = [0]')
    assert main(["sweep", "--config", cfg, "--around-advice", "--no-progress"]) == 0
    (centre,) = json.loads((tmp_path / "out" / "lr_centres.json").read_text()).values()
    spec = load_spec(cfg, around_advice=True)
    (point, run_cfg), _ = resolve(spec)
    assert centre["lr"] == pytest.approx(advise(run_cfg).recommended_lr, rel=1e-6)
    assert [r["point"]["optim.lr"] for r in finished_records(tmp_path / "out" / "sweep.jsonl").values()] == \
        pytest.approx([centre["lr"] / 2, centre["lr"] * 2], rel=1e-5)
