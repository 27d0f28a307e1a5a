"""The `sigprop` command: dispatch, the check job, reproduce, and clear errors."""
import json
import subprocess
import sys

import pytest

from helpers import CONFIGS, train_argv
from sigprop.cli import main


def test_check_prints_depth_table(capsys):
    assert main(["check", "--depth", "4", "--width", "16", "--seq", "8", "--schemes", "preln", "dslm"]) == 0
    out = capsys.readouterr().out
    assert "var@1" in out and "preln" in out and "dslm" in out


def test_check_builds_every_placement_a_scheme_allows_with_qk_norm(capsys):
    argv = ["check", "--depth", "2", "--width", "16", "--seq", "8", "--schemes", "preln", "gpt2", "shaped",
            "--placements", "all", "--qk-norm"]
    assert main(argv) == 0
    rows = {line.split(")")[0] + ")" for line in capsys.readouterr().out.splitlines()
            if line.split(" ")[0] in ("preln", "gpt2", "shaped")}
    assert rows == {"preln (pre, qk-norm)", "preln (out, qk-norm)", "preln (sandwich, qk-norm)", "gpt2 (pre, qk-norm)",
                    "shaped (none)"}        # gpt2 allows only pre; shaped attention takes no qk-norm


def test_reproduce_quick_writes_results(tmp_path, capsys):
    assert main(["reproduce", "dslm-moments", "--quick", "--out", str(tmp_path)]) == 0
    written = {p.name for p in (tmp_path / "dslm-moments").iterdir()}
    assert "results.json" in written and any(n.endswith(".png") for n in written)
    assert main(["reproduce", "fig1", "--quick", "--out", str(tmp_path)]) == 0
    assert {"fig1.json", "fig1.png", "fig1.md"} <= {p.name for p in (tmp_path / "fig1").iterdir()}


def test_reproduce_set_overrides_sizes_and_rejects_unknown_keys(tmp_path, capsys):
    assert main(["reproduce", "fig2", "--quick", "--set", "samples=3", "--set", "width=6", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "fig2" / "fig2.json").read_text())["summary"]
    assert (summary["samples"], summary["width"]) == (3, 6)
    assert main(["reproduce", "fig2", "--quick", "--set", "sampels=3", "--out", str(tmp_path)]) == 2
    assert "unknown size(s) ['sampels']" in capsys.readouterr().err
    assert main(["reproduce", "fig2", "--set", "samples", "--out", str(tmp_path)]) == 2
    assert main(["reproduce", "all", "--set", "samples=3", "--out", str(tmp_path)]) == 2
    assert "needs one experiment" in capsys.readouterr().err


@pytest.mark.slow
def test_reproduce_a_training_claim_end_to_end(tmp_path, claim_outputs):
    """`sigprop reproduce NAME --quick --set ...` → NAME.{json,md,png} in the one schema, judged again from the
    JSON, collected into RESULTS.md."""
    from sigprop.experiments.depth_transfer import CLAIM
    from sigprop.experiments.results import rejudge

    assert main(["reproduce", "depth-transfer", "--quick", "--set", "widths=[16]", "--out", str(tmp_path)]) == 0
    out = tmp_path / "depth-transfer"
    saved = claim_outputs(out, "depth-transfer", json.loads((out / "depth-transfer.json").read_text())["summary"],
                          ("claim", "models", "results", "sizes", "tuning_seed"))
    s = saved["summary"]
    assert s["sizes"]["widths"] == [16] and set(s["results"]["panels"]) == {"preln", "preln-qk-norm-z-loss",
                                                                            "dslm-preln", "shaped", "depth-mup",
                                                                            "completep", "width-standard", "width-mup"}
    for key, m in s["models"].items():           # a 2-lr grid has its optimum at an edge: extended once
        assert key.split("/")[0] == m["group"] and len(m["lr_grid"]) in (3, 4) and len(m["extended"]) == 1
        assert all(isinstance(b["lr"], float) and b["seeds"] == [0] for b in m["scored"])
        assert m["tuning"] is None and [b["lr"] for b in m["scored"]] == m["lr_grid"]
    assert rejudge(tmp_path)["depth-transfer"] == (s["verdict"], s["verdict_reason"]) == CLAIM.rule(s)
    assert "[depth-transfer](#depth-transfer)" in (tmp_path / "RESULTS.md").read_text()


def test_module_entry_point_and_unknown_command():
    ok = subprocess.run([sys.executable, "-m", "sigprop", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "reproduce" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "sigprop", "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_delegated_command_reports_bad_config(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[model]\nd_modle = 3\n')
    with pytest.raises(SystemExit) as e:
        sys.exit(main(["predict", "--config", str(cfg)]))
    assert e.value.code != 0


def test_shipped_diagnose_config_predicts(tmp_path, capsys):
    cfg = CONFIGS / "diagnose" / "dslm.toml"
    text = cfg.read_text().replace('out = "runs/diagnose_dslm"', f'out = "{tmp_path}"')
    local = tmp_path / "dslm.toml"
    local.write_text(text)
    assert main(["predict", "--config", str(local)]) == 0
    assert any(p.suffix == ".png" for p in tmp_path.rglob("*"))


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


@pytest.mark.parametrize("argv, needles", [
    (["train", "--config", "/nonexistent/run.toml"], ["/nonexistent/run.toml", "no such file"]),
    (["predict", "--config", "/nonexistent/model.toml"], ["No such file"]),
    (["demo", "--quick", "--out", "/proc/sigprop-demo"], ["/proc/sigprop-demo"]),
    (["reproduce", "fig1", "--quick", "--out", "/proc/sigprop-fig1"], ["/proc/sigprop-fig1"]),
    (["check", "--depth", "0", "--schemes", "preln"], ["ModelConfig.n_layers=0"]),
    (["generate", "--run", "/nonexistent", "--max-new-tokens", "-5"], ["--max-new-tokens (-5)"]),
    (["eval", "--run", "/nonexistent"], ["not a sigprop run folder"]),
])
def test_user_errors_exit_2_with_one_line(argv, needles, capsys):
    assert main(argv) == 2
    _one_line_error(capsys, *needles)


@pytest.mark.parametrize("text, needles", [
    ("", ["no [model] table"]),
    ("[model]\nscheme = 'shaped'\ntau0 = inf\n", ["ModelConfig.tau0=inf", "finite"]),
    ("[model]\nscheme = 'shaped'\nc_plus = nan\n", ["ModelConfig.c_plus=nan", "finite"]),
    ("[model]\nn_dec_layers = 3\n", ["ModelConfig.n_dec_layers=3", "no effect"]),
    ("[model\n", ["Expected"]),
])
def test_predict_refuses_bad_model_tables(tmp_path, text, needles, capsys):
    cfg = tmp_path / "m.toml"
    cfg.write_text(text)
    assert main(["predict", "--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    _one_line_error(capsys, *needles)
    assert main(["diagnose", "--config", str(tmp_path), "--out", str(tmp_path / "out")]) == 2   # a folder
    _one_line_error(capsys)


def test_train_refuses_unwritable_and_bad_optimizer_values(tmp_path, capsys):
    for sets, needle in ([["train.out_dir=/proc/sigprop-run"], "cannot be written"],
                         [["optim.lr=inf"], "optim.lr=inf"], [["optim.weight_decay=nan"], "optim.weight_decay=nan"],
                         [["optim.weight_decay=-1"], "optim.weight_decay=-1.0"], [["optim.beta1=1.5"], "optim.beta1"],
                         [["optim.eps=-1"], "optim.eps"], [["model.vocab_size=5e9"], "model.vocab_size"],
                         [["model.vocab_size=5000000000"], "a positive integer <= 4194304"],
                         [["train.out_dir="], "train.out_dir=''"]):
        argv = ["train", *train_argv("tiny_decoder", *sets, "train.progress=false")]
        if "out_dir" not in sets[0]:
            argv += ["--set", f"train.out_dir={tmp_path / 'run'}"]
        assert main(argv) == 2
        _one_line_error(capsys, needle)
    assert not (tmp_path / "run").exists()


BUG = """
import sys
import {module} as target
def bug(*args, **kwargs):
    raise {error}("a bug inside sigprop")
target.{name} = bug
from sigprop.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize("module, name, argv", [
    ("sigprop.diagnostics.check", "depth_profile", ["check", "--depth", "2", "--width", "8", "--seq", "4",
                                                     "--schemes", "preln"]),
    ("sigprop.simulate.commands", "path_statistics", ["simulate", "sde", "--paths", "2", "--steps", "2",
                                                       "--no-progress", "--out", "{tmp}"]),
    ("sigprop.diagnostics.commands", "load", ["predict", "--config", "{tmp}/m.toml"]),
    ("sigprop.train.commands", "load_config", ["train", "--set", "model.d_model=8"]),
    ("sigprop.train.sweep", "load_spec", ["sweep", "--config", "{tmp}/s.toml"]),
])
@pytest.mark.parametrize("error", ["ValueError", pytest.param("RuntimeError", marks=pytest.mark.slow)])
def test_a_bug_shows_its_traceback_and_does_not_exit_2(tmp_path, module, name, argv, error):
    """Only declared user errors are one line and exit 2: a plain ValueError raised inside sigprop is a bug."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = BUG.format(module=module, name=name, error=error, argv=argv)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and f"{error}: a bug inside sigprop" in done.stderr


@pytest.mark.parametrize("argv, needles", [
    (["frobnicate"], ["invalid choice: 'frobnicate'"]),
    (["train", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["sweep"], ["the following arguments are required: --config"]),
    (["sweep", "--config", "/nonexistent/sweep.toml"], ["/nonexistent/sweep.toml"]),
    (["grow", "--run", "/nonexistent", "--to", "x", "--mode", "copy", "--out", "/nonexistent/o"], ["--to must be"]),
    (["eval"], ["the following arguments are required: --run"]),
    (["reproduce", "nope"], ["invalid choice: 'nope'"]),
    (["simulate", "sde", "--paths", "0"], ["argument --paths"]),
])
def test_usage_errors_exit_2_with_one_line(argv, needles, capsys):
    assert main(argv) == 2
    _one_line_error(capsys, *needles)


def test_a_missing_extra_is_a_user_error(monkeypatch, capsys):
    from sigprop.diagnostics import check
    from sigprop.extras import require

    monkeypatch.setattr(check, "depth_profile", lambda cfg: require("sigprop_no_such_extra", "check", "pip install x"))
    assert main(["check", "--depth", "2", "--width", "8", "--seq", "4", "--schemes", "preln"]) == 2
    _one_line_error(capsys, "check needs the 'sigprop_no_such_extra' package", "pip install x")


@pytest.mark.parametrize("code", ["import sigprop.console", "from sigprop.cli import main; main(['--help'])",
                                  "from sigprop.cli import main; main(['reproduce', '--help'])"])
def test_the_bottom_layer_and_the_help_load_no_torch(code):
    probe = f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.split()[-1] == "False", done.stdout + done.stderr
