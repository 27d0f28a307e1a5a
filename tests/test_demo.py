"""`sigprop demo` at smoke size: its data and the printed summary (the report itself: tests/test_report.py);
the text table and the RESULTS.md builder."""
import json

from sigprop import demo
from sigprop.experiments.report import Table
from sigprop.experiments.results import collect, rejudge


def test_quick_demo_writes_data_and_prints_the_summary(quick_demo):
    out = quick_demo.stdout
    assert "rank collapse" in out and "moments at init" in out and "training" in out
    assert ["part", "quantity", "value"] in [line.split() for line in out.splitlines()]
    tmp_path = quick_demo.out
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["rank_collapse"]["final_mean_corr"]["softmax"] > 0.99
    assert set(data["dslm_moments"]["summary"]) == {"Pre-LN standard", "Pre-LN DSLM", "Post-LN standard",
                                                    "Post-LN DSLM"}
    assert set(data["training"]) == {"shaped (no LN, recover)", "Pre-LN", "GPT-2 style (Pre-LN)", "DSLM (Pre-LN)"}
    for r in data["training"].values():
        assert len(r["val_curve"]) >= 2
    advice = data["advice"]                           # every model at the lr advise recommended for it
    assert "demo.advise_lr(" in advice["command"]
    for label, a in advice["advice"].items():
        assert a["lr"] == data["training"][label]["lr"] and a["interval"][0] <= a["lr"] <= a["interval"][1]
        assert a["lr"] <= a["max_stable_lr"] and a["cost_s"] > 0
        assert a["decided_by"].startswith("rule at init") and a["cost_runs"] == 0    # the smoke run's advice
    swept = advice["advice"][demo.SWEPT]
    assert [p["lr"] for p in advice["sweep"]["points"]] == [p["lr"] for p in swept["predictions"]] == list(
        demo.SWEEP_LRS["quick"])
    assert json.loads((tmp_path / "training/advice.json").read_text())["command"] == advice["command"]
    assert len(data["table"]["rows"]) >= 10
    for part in ("rank_collapse/fig1.png", "dslm_moments/results.json", "training/training.json",
                 "training/advice.png"):
        assert (tmp_path / part).stat().st_size > 0


def test_table_renders_text():
    t = Table(["a", "b"], [["<x>", 1.234567], ["y", 2]])
    assert t.text().splitlines() == ["a    b", "---  -----", "<x>  1.235", "y    2"]


def test_collect_builds_verdict_table_and_copies_images(tmp_path):
    for name, verdict in (("claim-a", "reproduced"), ("claim-b", "partly")):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        (d / f"{name}.md").write_text(f"## {name} — a claim\n\n**Verdict: {verdict}.**\n")
        (d / f"{name}.json").write_text(json.dumps({"summary": {"verdict": verdict, "verdict_reason": "x = 1",
                                                                "seeds": [0, 1], "wall_s": 90}}))
        (d / f"{name}.png").write_bytes(b"png")
    (tmp_path / "runs" / "claim-b" / "claim-b-extra.png").write_bytes(b"png2")
    text = collect(tmp_path / "runs", ["claim-a", "claim-b", "missing"], docs=tmp_path / "docs")
    assert "| [claim-a](#claim-a) | **reproduced** | x = 1 | `sigprop reproduce claim-a` | 0, 1 | 1.5 min |" in text
    assert "missing" not in text
    assert (tmp_path / "docs" / "RESULTS.md").read_text() == text
    assert (tmp_path / "docs" / "img" / "claim-b.png").read_bytes() == b"png"
    assert (tmp_path / "docs" / "img" / "claim-b-extra.png").read_bytes() == b"png2"
    assert text.index("(img/claim-b.png)") < text.index("(img/claim-b-extra.png)")
    assert json.loads((tmp_path / "docs" / "results" / "claim-a.json").read_text())["verdict"] == "reproduced"
    assert collect(tmp_path / "runs", ["missing"]) == ""


def test_rejudge_recomputes_a_verdict_from_the_saved_numbers(tmp_path):
    entry = lambda kind, final: {"label": kind, "group": "a", "attrs": {"kind": kind}, "params": 1, "extended": [],
                                 "lr_grid": [1e-3, 3e-3, 1e-2],
                                 "tuning": {"seed": 100, "loss": [5, 4, 4.5], "unigram": None, "best_lr": 3e-3,
                                            "at_edge": False},
                                 "scored": [{"lr": 3e-3, "seeds": [0, 1], "final_loss": final, "unigram": [None] * 2}]}
    models = {"a/deep-thin": entry("deep-thin", [3.0, 3.02]), "a/shallow-wide": entry("shallow-wide", [3.2, 3.22])}
    (tmp_path / "deep-thin").mkdir()
    (tmp_path / "deep-thin" / "deep-thin.json").write_text(json.dumps({"summary": {"models": models}}))
    assert rejudge(tmp_path)["deep-thin"][0] == "reproduced" and set(rejudge(tmp_path)) == {"deep-thin"}


def test_with_a_budget_each_model_is_the_halving_survivor_continued_to_the_end(tmp_path):
    """The full demo's advice: `advise_lr` runs successive halving on the model's own run and names the survivor;
    `continue_model` takes that run on from its last rung to the end at the advised lr."""
    size = {**demo.QUICK, "steps": 20, "advice_budget": 0.5}
    a = demo.advise_lr(tmp_path, demo.SWEPT, size)
    assert a["decided_by"].startswith("halving") and a["cost_runs"] == 0.4 and a["run_dir"]
    r = demo.continue_model(demo.SWEPT, size, a["lr"], 0, a["run_dir"])
    assert r["lr"] == a["lr"] and r["steps_done"] == 20 and r["params"] > 0
    assert r["val_curve"][0][0] == 0 and r["val_curve"][-1][0] == 20           # the arm's start and the end
