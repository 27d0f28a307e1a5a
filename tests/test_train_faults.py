"""Checkpoints and faults: exact resume, corrupt/foreign checkpoints, NaN loss, SIGINT/SIGTERM."""
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, FAST_TRAIN, StopAt, loss_curve, train_argv
from sigprop.train import (
    Callback,
    CheckpointError,
    NonFiniteLossError,
    list_checkpoints,
    load_config,
    load_run,
    read_jsonl,
    train,
    train_main,
)

FAST = [*FAST_TRAIN, "train.eval_batches=1", "optim.warmup_steps=3", "model.dropout=0.1"]


def cfg_for(out: Path, *sets: str):
    return load_config(CONFIGS / "tiny_decoder.toml", [*FAST, f"train.out_dir={out}", *sets])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 8-step run with checkpoints at steps 4 and 8."""
    out = tmp_path_factory.mktemp("finished")
    trainer = train(cfg_for(out, "train.steps=8", "train.ckpt_every=4", "train.eval_every=4"))
    return out, trainer


def test_resume_is_bit_exact(finished, tmp_path):
    ref_dir, ref = finished
    t1 = train(cfg_for(tmp_path, "train.steps=8", "train.ckpt_every=4", "train.eval_every=4"), [StopAt(3)])
    assert t1.state.step == 3 and t1.stop_reason == "test"
    assert [int(p.name[5:13]) for p in list_checkpoints(tmp_path / "checkpoints")] == [3]
    t2 = train(cfg_for(tmp_path, "train.steps=8", "train.ckpt_every=4", "train.eval_every=4", "train.resume=true"))
    assert loss_curve(tmp_path) == loss_curve(ref_dir)          # exact float equality, dropout on
    for (name, a), b in zip(ref.model.state_dict().items(), t2.model.state_dict().values()):
        assert torch.equal(a, b), name
    events = [r["event"] for r in read_jsonl(tmp_path / "metrics.jsonl", "event")]
    assert events == ["checkpoint", "interrupted", "resumed", "checkpoint", "checkpoint"]


def test_a_stage_stops_at_stop_at_and_its_resume_finishes_the_same_schedule(finished, tmp_path):
    """train.stop_at ends the run early with a checkpoint while the lr schedule keeps train.steps' length; a
    resume with stop_at=0 continues to train.steps exactly as one uninterrupted run."""
    ref_dir, _ = finished
    sets = ("train.steps=8", "train.ckpt_every=4", "train.eval_every=4")
    stage = train(cfg_for(tmp_path, *sets, "train.stop_at=4"))
    assert stage.state.step == 4 and stage.stop_reason is None
    assert [int(p.name[5:13]) for p in list_checkpoints(tmp_path / "checkpoints")] == [4]
    train(cfg_for(tmp_path, *sets, "train.resume=true"))
    assert loss_curve(tmp_path) == loss_curve(ref_dir)
    with pytest.raises(ValueError, match=r"train\.stop_at.*train\.steps=8"):
        cfg_for(tmp_path, *sets, "train.stop_at=9")


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage, message", [
    ("truncate", r"corrupt checkpoint .*sha256 of step_00000008\.weights\.safetensors"),
    ("flip", r"corrupt checkpoint .*sha256 of step_00000008\.state\.safetensors"),
    ("json", r"corrupt checkpoint .*unreadable JSON"),
    ("missing", r"corrupt checkpoint .*step_00000008\.weights\.safetensors is missing"),
])
def test_corrupt_checkpoint_is_refused(finished, tmp_path, damage, message):
    run = copy_run(finished[0], tmp_path / "run")
    stem = run / "checkpoints" / "step_00000008"
    if damage == "truncate":
        w = Path(f"{stem}.weights.safetensors")
        w.write_bytes(w.read_bytes()[:-100])
    elif damage == "flip":
        s = Path(f"{stem}.state.safetensors")
        data = bytearray(s.read_bytes())
        data[-5] ^= 0xFF
        s.write_bytes(bytes(data))
    elif damage == "json":
        j = Path(f"{stem}.json")
        j.write_text(j.read_text()[:200])
    else:
        Path(f"{stem}.weights.safetensors").unlink()
    with pytest.raises(CheckpointError, match=message):
        train(cfg_for(run, "train.steps=10", "train.resume=true"))
    with pytest.raises(CheckpointError, match=message):
        load_run(run)


def test_foreign_checkpoint_is_refused(finished, tmp_path, capsys):
    run = copy_run(finished[0], tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"different model \(n_heads: checkpoint 4 vs run 2\)"):
        train(cfg_for(run, "train.steps=10", "train.resume=true", "model.n_heads=2"))
    (run / "checkpoints" / "step_00000099.json").write_text(json.dumps({"state_dict": "x"}))
    argv = ["--resume", *train_argv("tiny_decoder", *FAST, f"train.out_dir={run}", "train.steps=10")]
    assert train_main(argv) == 2
    assert "is not a sigprop checkpoint" in capsys.readouterr().err


class PoisonAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_start(self, trainer):
        if trainer.state.step == self.step:
            with torch.no_grad():
                next(trainer.model.parameters()).view(-1)[0] = float("nan")


def test_nan_loss_stops_with_last_good_checkpoint(tmp_path, capsys):
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss nan .* at step 6.*step_00000004\.json"):
        train(cfg_for(tmp_path, "train.steps=10", "train.ckpt_every=2"), [PoisonAt(5)])
    ckpts = list_checkpoints(tmp_path / "checkpoints")
    assert ckpts[-1].name == "step_00000004.json"
    _, model, _ = load_run(tmp_path)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert read_jsonl(tmp_path / "metrics.jsonl", "event")[-1]["event"] == "non_finite"
    # through the command: an exploding learning rate exits non-zero with a clear message
    argv = train_argv("tiny_decoder", *FAST, f"train.out_dir={tmp_path / 'cli'}", "train.steps=50", "optim.lr=1e30",
                      "optim.grad_clip=0")
    assert train_main(argv) == 1
    assert "non-finite training loss" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_checkpoint_and_exits_cleanly(tmp_path, sig):
    sets = [*FAST, f"train.out_dir={tmp_path}", "train.steps=100000", "train.ckpt_every=0",
            "train.eval_batches=0"]
    argv = train_argv("tiny_decoder", *sets)
    code = f"import sys; from sigprop.train import train_main; sys.exit(train_main({argv!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics, deadline = tmp_path / "metrics.jsonl", time.monotonic() + 60
    while not (metrics.exists() and len(read_jsonl(metrics, "train")) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"stopped ({sig.name})" in err and "Traceback" not in err
    last = read_jsonl(metrics, "train")[-1]["step"]
    assert list_checkpoints(tmp_path / "checkpoints")[-1].name == f"step_{last:08d}.json"
    resumed = train(cfg_for(tmp_path, f"train.steps={last + 2}", "train.resume=true", "train.eval_batches=0"))
    assert resumed.state.step == last + 2


def _argv(out: Path, *sets: str) -> list[str]:
    return train_argv("tiny_decoder", *FAST, f"train.out_dir={out}", *sets)


def _inject_faults(monkeypatch, factors: dict[int, float]) -> None:
    """Multiply the training loss of the given steps (1-based) by a factor: a spike, or NaN for a blow-up.

    The fault lands at exactly the chosen step on any CPU, unlike a diverging learning rate, whose first
    non-finite step depends on the floating-point kernels."""
    import sigprop.train.trainer as trainer_module

    step = {"now": 0}
    real_step, real_terms = trainer_module.Trainer.train_step, trainer_module.loss_terms

    def train_step(self):
        step["now"] = self.state.step + 1
        return real_step(self)

    def loss_terms(*args, **kwargs):
        loss_sum, correct = real_terms(*args, **kwargs)
        return loss_sum * factors.get(step["now"], 1.0), correct

    monkeypatch.setattr(trainer_module.Trainer, "train_step", train_step)
    monkeypatch.setattr(trainer_module, "loss_terms", loss_terms)


def test_nan_stop_names_the_last_good_checkpoint_and_its_advice_trains_on(tmp_path, capsys, monkeypatch):
    """A healthy start (steps 1-4), then a run whose loss spikes at step 6 and turns non-finite at step 7.
    Checkpoints at every step, only the newest 2 kept: the newest (5, 6) are blown up; the last good one is
    step 4 (its next step, 5, was still healthy), kept although older. Resuming from it as the stop message
    says trains to the end."""
    out = tmp_path / "run"
    common = ["train.ckpt_every=1", "train.keep_last=2", "optim.grad_clip=0", "train.eval_every=0",
              "optim.lr=3e-3"]
    assert train_main(_argv(out, *common, "train.steps=4")) == 0
    capsys.readouterr()
    with monkeypatch.context() as patch:
        _inject_faults(patch, {6: 100.0, 7: math.nan})
        assert train_main([*_argv(out, *common, "train.steps=30", "optim.warmup_steps=0"), "--resume"]) == 1
    err = capsys.readouterr().err
    good = out / "checkpoints" / "step_00000004.json"
    assert f"Last good checkpoint (its next step was healthy): {good}" in err and "Traceback" not in err
    train_rows = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl", "train")}
    assert sorted(train_rows) == [1, 2, 3, 4, 5, 6]                          # step 7 was not applied
    assert train_rows[5]["loss"] < 2 * min(train_rows[s]["loss"] for s in range(1, 5))   # step 5 healthy
    assert not train_rows[6]["loss"] < 2 * min(train_rows[s]["loss"] for s in range(1, 6))  # step 6 spiked
    names = [p.name for p in list_checkpoints(out / "checkpoints")]
    assert good.name in names and names[-1] != good.name                      # kept beside the newer bad ones
    command = err.split("resume from the last good checkpoint:\n")[1].strip().splitlines()[0]
    argv = shlex.split(command)
    assert argv[:2] == ["sigprop", "train"] and argv[-2:] == ["--resume-from", str(good)]
    assert train_main([*argv[2:], "--set", "optim.lr=1e-3"]) == 0              # the user's lower lr wins
    rows = read_jsonl(out / "metrics.jsonl")
    resumed = [r for r in rows if r.get("event") == "resumed"][-1]
    assert resumed["path"] == str(good) and resumed["set_aside"]
    after = [r for r in rows[rows.index(resumed):] if r["kind"] == "train"]
    assert [r["step"] for r in after] == list(range(5, 31))
    assert all(math.isfinite(r["loss"]) for r in after) and after[-1]["loss"] < train_rows[4]["loss"] * 1.5
    assert max(r["lr"] for r in after) <= 1e-3
    assert list_checkpoints(out / "checkpoints")[-1].name == "step_00000030.json"
    assert not any(p.name > "step_00000004" for p in list_checkpoints(out / "checkpoints")
                   if p.name < "step_00000029")                               # the diverged ones set aside
    assert list((out / "checkpoints" / "abandoned_after_00000004").glob("step_*.json"))


def test_healthy_and_last_good_definition():
    from sigprop.train.health import SPIKE, LastGood, healthy

    assert healthy(5.0, 1.0, math.inf) and healthy(2.0 * SPIKE, 1.0, 2.0)
    assert not healthy(2.0 * SPIKE + 1e-9, 1.0, 2.0) and not healthy(1.0, math.nan, 2.0)
    assert not healthy(math.inf, 1.0, 2.0)
    lg = LastGood()
    lg.observe(3.0, 1.0)
    lg.saved(Path("a.json"))
    lg.observe(3.5, 1.0)                     # healthy next step: a.json is good
    lg.saved(Path("b.json"))
    lg.observe(7.0, 1.0)                     # spike (> 2 x 3.0): b.json is not
    lg.saved(Path("c.json"))
    lg.observe(math.nan, math.nan)
    assert lg.good == Path("a.json") and lg.best == 3.0
    assert lg.meta() == {"last_good": "a.json", "best_loss": 3.0}
    fresh = LastGood().meta()                    # written before any finite loss: best_loss null
    resumed = LastGood.from_record(Path("b.json"), fresh)
    assert fresh["best_loss"] is None and resumed.best == math.inf and resumed.pending == Path("b.json")


def test_out_dir_that_sigprop_did_not_create_is_left_untouched(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.toml").write_text("# my notes\n")
    (mine / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    assert train_main(_argv(mine, "train.steps=2")) == 2
    assert "holds files that sigprop did not write (config.toml, metrics.jsonl)" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before
    with pytest.raises(ValueError, match=r"train\.out_dir='' is invalid"):
        cfg_for("", "train.steps=2")
    monkeypatch.chdir(mine)
    for out in (".", str(mine)):
        with pytest.raises(ValueError, match="is the current directory"):
            train(cfg_for(out, "train.steps=2"))
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is an existing file"):
        train(cfg_for(a_file, "train.steps=2"))
    assert a_file.read_text() == "x"


def test_resume_needs_something_to_resume_unless_asked_to_start_fresh(tmp_path, capsys):
    out = tmp_path / "new"
    assert train_main([*_argv(out, "train.steps=2"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err and not out.exists()
    assert train_main([*_argv(out, "train.steps=2", "train.eval_batches=0"), "--resume", "--fresh-if-none"]) == 0
    assert list_checkpoints(out / "checkpoints")[-1].name == "step_00000002.json"
    # an existing run: a fresh start is refused, --resume-from must name one of its checkpoints
    assert train_main(_argv(out, "train.steps=4")) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert train_main([*_argv(out, "train.steps=4"), "--resume-from", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert train_main([*_argv(out, "train.steps=4", "train.fresh_if_none=true")]) == 2
    assert "train.fresh_if_none=True is invalid" in capsys.readouterr().err


def test_eval_and_generate_refuse_what_they_cannot_do(finished, tmp_path, capsys):
    from sigprop.train import eval_main, generate_main

    run = copy_run(finished[0], tmp_path / "run")
    assert eval_main(["--run", str(run), "--set", "train.eval_batches=0"]) == 2
    assert "train.eval_batches=0 in this run" in capsys.readouterr().err
    assert generate_main(["--run", str(run), "--max-new-tokens", "-5"]) == 2
    assert "--max-new-tokens (-5)" in capsys.readouterr().err
    assert generate_main(["--run", str(run), "--max-new-tokens", "3", "--seed", "0"]) == 0
    capsys.readouterr()
    (run / "tokenizer.json").unlink()
    assert generate_main(["--run", str(run), "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert "has no tokenizer.json" in err and "Traceback" not in err


def test_a_run_written_with_the_old_norm_key_still_loads(finished, tmp_path):
    """config.toml and checkpoint JSON that spell ModelConfig.norm_placement by its deprecated name (norm = "preln")
    load as the same run and model; a resume verifies the checkpoint against the new spelling."""
    run = copy_run(finished[0], tmp_path / "run")
    for path in [run / "config.toml", *(run / "checkpoints").glob("*.json")]:
        text = path.read_text()
        old = text.replace('norm_placement = "pre"', 'norm = "preln"').replace('"norm_placement": "pre"',
                                                                               '"norm": "preln"')
        assert old != text and "norm_placement" not in old
        path.write_text(old)
    cfg, model, _ = load_run(finished[0])
    with pytest.warns(DeprecationWarning, match="norm is deprecated"):
        old_cfg, old_model, _ = load_run(run)
    assert old_cfg.model == cfg.model
    for (name, a), b in zip(model.state_dict().items(), old_model.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.warns(DeprecationWarning, match="norm is deprecated"):
        t = train(cfg_for(run, "train.steps=10", "train.resume=true"))
    assert t.state.step == 10


def test_a_prodigy_run_resumes_bit_exactly(tmp_path):
    """Prodigy (optim.optimizer) keeps non-tensor state (each parameter's step count): the checkpoint carries it
    and a resumed run continues as one uninterrupted run."""
    pytest.importorskip("prodigyopt")
    sets = ("train.steps=6", "train.ckpt_every=3", "train.eval_every=3", 'optim.optimizer="prodigy"', "optim.lr=1.0")
    ref = train(cfg_for(tmp_path / "ref", *sets))
    train(cfg_for(tmp_path / "cut", *sets), [StopAt(3)])
    resumed = train(cfg_for(tmp_path / "cut", *sets, "train.resume=true"))
    assert loss_curve(tmp_path / "cut") == loss_curve(tmp_path / "ref")
    for (name, a), b in zip(ref.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert type(resumed.optimizer).__name__ == "Prodigy"
    mup = train(cfg_for(tmp_path / "mup", *sets, 'model.parametrization="mup"', "model.base_width=16"))
    assert len({g["lr"] for g in mup.optimizer.param_groups}) == 1      # one step size: μP's lr rules dropped
