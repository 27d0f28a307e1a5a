"""The bottom layer of the commands (`sigprop.console`): user-error types, the one-line message, the parser,
``--set`` overrides, the progress bar, the run-folder rule, and that ``sigprop simulate`` imports nothing above
the theory and the simulators."""
import io
import json
import subprocess
import sys
from contextlib import redirect_stderr

import pytest

from sigprop.console import (
    EXIT_INVALID,
    Parser,
    UsageError,
    UserError,
    add_progress_flag,
    apply_sets,
    fail,
    parse_value,
    progress,
    read_toml,
)
from sigprop.console.progress import bar
from sigprop.extras import MissingExtraError, require
from sigprop.fields import FieldError
from sigprop.models import ModelConfig
from sigprop.train.checkpoint import CheckpointError
from sigprop.train.run_dir import MARKER, clear


def test_declared_user_errors_are_value_errors_and_keep_their_other_bases():
    for cls in (FieldError, MissingExtraError, CheckpointError, UsageError):
        assert issubclass(cls, UserError) and issubclass(cls, ValueError), cls
    assert issubclass(MissingExtraError, ImportError) and issubclass(CheckpointError, RuntimeError)
    with pytest.raises(FieldError, match=r"ModelConfig\.n_layers=0"):
        ModelConfig(n_layers=0)
    with pytest.raises(MissingExtraError, match="pip install nothing-here"):
        require("sigprop_no_such_module", "a test", "pip install nothing-here")
    assert not issubclass(UserError, (RuntimeError, ImportError))


def test_fail_prints_one_line_and_returns_the_code():
    err = io.StringIO()
    with redirect_stderr(err):
        assert fail("sigprop x", UserError("bad\n  value\tfor  y")) == EXIT_INVALID
        assert fail("sigprop x", OSError("disk"), 7) == 7
    assert err.getvalue() == "sigprop x: error: bad value for y\nsigprop x: error: disk\n"


def test_parser_errors_are_usage_errors_and_help_still_exits_0(capsys):
    p = Parser(prog="sigprop t")
    p.add_argument("--n", type=int, required=True)
    sub = p.add_subparsers(dest="what")
    sub.add_parser("go").add_argument("--k", type=int)
    with pytest.raises(UsageError, match="the following arguments are required: --n"):
        p.parse_args([])
    with pytest.raises(UsageError, match=r"argument --k: invalid int value: 'x' \(see sigprop t go --help\)"):
        p.parse_args(["--n", "1", "go", "--k", "x"])
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--help"])
    assert e.value.code == 0 and "--n" in capsys.readouterr().out


def test_set_overrides_parse_toml_literals_and_refuse_bad_shapes(tmp_path):
    raw = {"optim": {"lr": 1.0}, "train": {"steps": 3}}
    out = apply_sets(raw, ["optim.lr=1e-3", "model.d_model=64", 'data.source="a=b"', "train.tags=[1, 2]",
                           "train.name=plain words"])
    assert out == {"optim": {"lr": 1e-3}, "train": {"steps": 3, "tags": [1, 2], "name": "plain words"},
                   "model": {"d_model": 64}, "data": {"source": "a=b"}}
    assert raw == {"optim": {"lr": 1.0}, "train": {"steps": 3}}            # the input tables are left alone
    assert parse_value("true") is True and parse_value("x.y") == "x.y"
    for bad, match in (("optim.lr", "section.key=value"), ("lr=1", "section.key"), ("a.b.c=1", "section.key"),
                       ("optim.=1", "section.key")):
        with pytest.raises(UserError, match=match):
            apply_sets(raw, [bad])
    with pytest.raises(UserError, match="'seed' is not a table"):
        apply_sets({"seed": 3}, ["seed.x=1"])
    broken = tmp_path / "b.toml"
    broken.write_text("[model\n")
    with pytest.raises(UserError, match="b.toml is not valid TOML"):
        read_toml(broken)
    with pytest.raises(OSError):
        read_toml(tmp_path / "missing.toml")


def test_progress_counts_every_item_and_can_be_switched_off(capsys):
    assert list(progress(range(4), "p", enabled=False)) == [0, 1, 2, 3]
    assert capsys.readouterr().err == ""
    assert list(progress([5, 6], "shown-bar", initial=3)) == [5, 6]
    err = capsys.readouterr().err
    assert "shown-bar" in err and "5/5" in err                 # total = len(items) + initial, reached
    silent = bar(10, "x", initial=2, enabled=False)
    silent.update(3)
    silent.set_postfix({"loss": "1"})
    silent.close()
    assert silent.n == 5 and capsys.readouterr().err == ""
    p = Parser(prog="t")
    add_progress_flag(p)
    assert p.parse_args([]).progress is True and p.parse_args(["--no-progress"]).progress is False


def test_clear_deletes_only_what_sigprop_wrote(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text("{}")
    (run / "metrics.jsonl").write_text("{}\n")
    clear(run)
    assert not run.exists()
    clear(run)                                    # absent: nothing to do
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.toml").write_text("# my notes\n")
    with pytest.raises(UserError, match=r"holds files that sigprop did not write \(config.toml\)"):
        clear(mine)
    assert (mine / "config.toml").read_text() == "# my notes\n"
    monkeypatch.chdir(tmp_path / "mine")
    with pytest.raises(UserError, match="is the current directory"):
        clear(tmp_path / "mine")


HEAVY = ("matplotlib", "scipy", "tokenizers", "sigprop.train", "sigprop.experiments")
LIGHT = ("sigprop.experiments", "sigprop.experiments.registry")      # the command's list of names


def _loaded(code: str) -> list[str]:
    """The packages of HEAVY that ``code`` loads, counting any of their modules but the LIGHT ones."""
    probe = (f"import sys\n{code}\nprint(__import__('json').dumps(sorted({{h for h in {HEAVY!r} for m in sys.modules "
             f"if (m == h or m.startswith(h + '.')) and m not in {LIGHT!r}}})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_simulate_imports_nothing_above_the_theory_and_the_simulators(tmp_path):
    assert _loaded("import sigprop.simulate.commands\nimport sigprop.cli") == []
    run = (f"from sigprop.cli import main\nassert main(['simulate', 'sde', '--paths', '4', '--steps', '2', '--chunk', "
           f"'4', '--no-progress', '--out', {str(tmp_path)!r}]) == 0")
    assert _loaded(run) == ["matplotlib"]                  # matplotlib writes the PNG, and nothing else came in
    assert (tmp_path / "sde.png").stat().st_size > 0 and (tmp_path / "sde.json").is_file()
