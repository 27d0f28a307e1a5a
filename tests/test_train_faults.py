"""Checkpoints and faults: exact resume, corrupt/foreign checkpoints, NaN loss, SIGINT/SIGTERM."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sigprop.train import (Callback, CheckpointError, NonFiniteLossError, list_checkpoints, load_config,
                           load_run, read_jsonl, train, train_main)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FAST = ["data.max_chars=100000", "model.d_model=32", "data.seq_len=32", "train.progress=false",
        "train.eval_batches=1", "optim.warmup_steps=3", "model.dropout=0.1"]


def cfg_for(out: Path, *sets: str):
    return load_config(CONFIGS / "tiny_decoder.toml", [*FAST, f"train.out_dir={out}", *sets])


def losses(out: Path) -> list[tuple[str, int, float]]:
    return [(r["kind"], r["step"], r["loss"]) for r in read_jsonl(out / "metrics.jsonl") if r["kind"] in ("train", "eval")]


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer):
        if trainer.state.step == self.step:
            trainer.request_stop("test")


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
    assert losses(tmp_path) == losses(ref_dir)          # exact float equality, dropout on
    for (name, a), b in zip(ref.model.state_dict().items(), t2.model.state_dict().values()):
        assert torch.equal(a, b), name
    events = [r["event"] for r in read_jsonl(tmp_path / "metrics.jsonl", "event")]
    assert events == ["checkpoint", "interrupted", "resumed", "checkpoint", "checkpoint"]


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
    argv = ["--config", str(CONFIGS / "tiny_decoder.toml"), "--resume",
            *[a for s in [*FAST, f"train.out_dir={run}", "train.steps=10"] for a in ("--set", s)]]
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
    argv = ["--config", str(CONFIGS / "tiny_decoder.toml"),
            *[a for s in [*FAST, f"train.out_dir={tmp_path / 'cli'}", "train.steps=50", "optim.lr=1e30",
                          "optim.grad_clip=0"] for a in ("--set", s)]]
    assert train_main(argv) == 1
    assert "non-finite training loss" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_checkpoint_and_exits_cleanly(tmp_path, sig):
    sets = [*FAST, f"train.out_dir={tmp_path}", "train.steps=100000", "train.ckpt_every=0",
            "train.eval_batches=0"]
    argv = ["--config", str(CONFIGS / "tiny_decoder.toml"), *[a for s in sets for a in ("--set", s)]]
    code = f"import sys; from sigprop.train import train_main; sys.exit(train_main({argv!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics, deadline = tmp_path / "metrics.jsonl", time.monotonic() + 60
    while not (metrics.exists() and len(read_jsonl(metrics, "train")) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"stopped ({sig.name})" in err and "Traceback" not in err
    last = read_jsonl(metrics, "train")[-1]["step"]
    assert list_checkpoints(tmp_path / "checkpoints")[-1].name == f"step_{last:08d}.json"
    resumed = train(cfg_for(tmp_path, f"train.steps={last + 2}", "train.resume=true", "train.eval_batches=0"))
    assert resumed.state.step == last + 2
