"""`sigprop sweep`: validation before any run, resume (skip finished, re-run an interrupted point to the
same result), one tokenizer for all points, and the metrics of sigprop.train.sweep_report."""
import json
import math
from pathlib import Path

import pytest

from sigprop.cli import main
from sigprop.train import sweep as sweep_mod
from sigprop.train.sweep import finished_records, load_spec, resolve, run_sweep
from sigprop.train.sweep_report import summarize, write_report
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
    assert all(json.loads(line)["config"]["data"]["tokenizer"].endswith(".json") for line in log.read_text().splitlines())
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


@pytest.mark.parametrize("grid,extra,match", [
    ('"optim.lrr" = [1e-3]', "", "optim.lrr"),
    ('"model.scheme" = ["preln", "nope"]', "", "scheme"),
    ('"optim.lr" = [1e-3, -1.0]', "", "optim.lr"),
    ('"optim.lr" = 1e-3', "", "optim.lr"),
    ('lr = [1e-3]', "", "'lr'"),
    ('"optim.lr" = [1e-3]', 'sizes = "model.d_model"', "sweep.sizes"),
])
def test_bad_key_or_value_is_refused_before_any_run(tmp_path, counted, grid, extra, match):
    with pytest.raises(ValueError, match=match):
        run_sweep(load_spec(write(tmp_path, grid, extra)), progress=False)
    assert counted == {"points": 0, "tokenizer": 0}
    assert not (tmp_path / "out" / "sweep.jsonl").exists()


def test_cli_reports_a_bad_key(tmp_path, capsys):
    assert main(["sweep", "--config", write(tmp_path, '"train.stepz" = [1]')]) == 2
    assert "train.stepz" in capsys.readouterr().err


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
