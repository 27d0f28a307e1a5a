"""The lr protocol: a grid is extended past the edge that holds the optimum, scored seeds run at the choice."""
import math

import pytest

from sigprop.experiments import tuning


@pytest.fixture
def fake_sweep(monkeypatch):
    """sweep_runs with loss = (log10 lr − log10 optimum)² + 4 (NaN above ``diverge``), no training."""
    calls = []

    def install(optimum, diverge=math.inf):
        def fake(out, run_config, lrs, seeds, jobs=1):
            calls.append((list(lrs), list(seeds)))
            return [{"lr": lr, "seed": s, "final_val_loss": math.nan if lr > diverge else
                     (math.log10(lr) - math.log10(optimum)) ** 2 + 4 + 0.01 * s} for lr in lrs for s in seeds]
        monkeypatch.setattr(tuning, "sweep_runs", fake)
        return calls
    return install


def test_interior_optimum_is_not_extended(fake_sweep):
    calls = fake_sweep(3e-3)
    m = tuning.tune("x", {}, [1e-3, 3e-3, 1e-2], 100, [0, 1])
    assert m["best_lr"] == 3e-3 and not m["at_edge"] and m["extended"] == []
    assert calls == [([1e-3, 3e-3, 1e-2], [100]), ([3e-3], [0, 1])]
    assert m["final_loss"] == pytest.approx([4.0, 4.01])


def test_edge_optimum_is_extended_upward_then_bracketed(fake_sweep):
    fake_sweep(0.05)
    m = tuning.tune("x", {}, [1e-3, 1e-2], 100, [0])
    assert m["lr_grid"] == pytest.approx([1e-3, 1e-2, 0.1, 1.0])       # 0.1 at the top, then bracketed by 1.0
    assert m["best_lr"] == pytest.approx(0.1) and not m["at_edge"]
    assert len(m["extended"]) == 2 and all("top" in e for e in m["extended"])


def test_extension_stops_at_max_and_reports_the_edge(fake_sweep):
    fake_sweep(10.0)
    m = tuning.tune("x", {}, [1e-3, 1e-2], 100, [0], max_extend=2)
    assert m["lr_grid"] == pytest.approx([1e-3, 1e-2, 0.1, 1.0]) and m["best_lr"] == pytest.approx(1.0)
    assert m["at_edge"] and len(m["extended"]) == 2


def test_all_diverged_extends_downward(fake_sweep):
    fake_sweep(1e-4, diverge=5e-4)
    m = tuning.tune("x", {}, [1e-3, 1e-2], 100, [0], max_extend=1)
    assert m["lr_grid"] == pytest.approx([1e-4, 1e-3, 1e-2]) and m["best_lr"] == pytest.approx(1e-4)
    assert "bottom" in m["extended"][0]


def test_tuning_seed_must_not_be_scored():
    with pytest.raises(ValueError, match="tuning_seed"):
        tuning.tune("x", {}, [1e-3, 1e-2], 0, [0, 1])


def test_layer_stats_reads_the_diagnostics_rows():
    rows = [{"fwd_var": 3.0, "fwd_mean": 1.0, "attn_entropy": 2.0, "max_logit": 5.0},
            {"fwd_var": 8.0, "fwd_mean": 1.0, "attn_entropy": None, "max_logit": None}]
    assert tuning.layer_stats(rows) == {"attn_entropy": [2.0], "max_logit": [5.0], "stream_rms": [2.0, 3.0]}


@pytest.mark.slow
def test_tune_extends_a_real_grid_through_the_sweep(tmp_path):
    """Tiny decoder, lrs far below its optimum: the best lr is the grid's top, one lr is added above it
    through `sigprop.train.sweep`, and the scored seed runs at the final choice."""
    run_config = {"model": {"arch": "decoder", "d_model": 16, "n_layers": 1, "n_heads": 2, "vocab_size": 300,
                        "max_seq_len": 16},
              "data": {"source": "pydoc", "seq_len": 16, "max_chars": 20000}, "optim": {"warmup_steps": 1},
              "train": {"steps": 6, "batch_size": 4, "eval_every": 3, "eval_batches": 1, "diag_every": 0}}
    m = tuning.tune(tmp_path, run_config, [1e-5, 1e-4], 100, [0], max_extend=1)
    assert m["lr_grid"] == [1e-5, 1e-4, 1e-3] and m["extended"] and m["best_lr"] == 1e-3
    assert [r["seed"] for r in m["runs"]] == [0] and m["runs"][0]["lr"] == 1e-3
    assert m["final_loss"][0] < m["runs"][0]["initial_val_loss"] and len(m["runs"][0]["val_curve"]) == 3
