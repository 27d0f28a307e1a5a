"""The `sigprop` command: dispatch, the check job, reproduce, and clear errors."""
import subprocess
import sys

import pytest

from sigprop.cli import main


def test_check_prints_depth_table(capsys):
    assert main(["check", "--depth", "4", "--width", "16", "--seq", "8", "--schemes", "preln", "dslm"]) == 0
    out = capsys.readouterr().out
    assert "var@1" in out and "preln" in out and "dslm" in out


def test_reproduce_quick_writes_results(tmp_path, capsys):
    assert main(["reproduce", "dslm-moments", "--quick", "--out", str(tmp_path)]) == 0
    written = {p.name for p in (tmp_path / "dslm-moments").iterdir()}
    assert "results.json" in written and any(n.endswith(".png") for n in written)
    assert main(["reproduce", "fig1", "--quick", "--out", str(tmp_path)]) == 0
    assert {"fig1.json", "fig1.png", "fig1.md"} <= {p.name for p in (tmp_path / "fig1").iterdir()}


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
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "configs" / "diagnose" / "dslm.toml"
    text = cfg.read_text().replace('out = "runs/diagnose_dslm"', f'out = "{tmp_path}"')
    local = tmp_path / "dslm.toml"
    local.write_text(text)
    assert main(["predict", "--config", str(local)]) == 0
    assert any(p.suffix == ".png" for p in tmp_path.rglob("*"))
