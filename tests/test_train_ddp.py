"""DDP: 2 gloo ranks under torchrun see the same global batch and follow the same loss curve as 1 process."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import CONFIGS, FAST_TRAIN, train_argv
from sigprop.train import load_config, load_run, read_jsonl, train

pytestmark = pytest.mark.slow

SETS = [*FAST_TRAIN, "train.eval_batches=2", "train.eval_every=3", "optim.warmup_steps=2", "train.steps=6",
        "train.batch_size=8", "train.diag_every=3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path: Path, config: str, sets: list[str], timeout_s: float = 300) -> None:
    """`sigprop train` of the shipped ``configs/CONFIG.toml`` with ``sets`` on 2 gloo ranks under torchrun. On a
    timeout (e.g. a collective one rank never enters) torchrun is terminated, which stops its ranks (killing it
    would leave them running), and the test fails."""
    script = tmp_path / "entry.py"
    script.write_text("import sys\nfrom sigprop.train import train_main\nsys.exit(train_main(sys.argv[1:]))\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), *train_argv(config, *sets)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        _, err = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout_s} s: {err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]


def curve(out: Path) -> list[tuple[str, int, float]]:
    return [(r["kind"], r["step"], r["loss"]) for r in read_jsonl(out / "metrics.jsonl")
            if r["kind"] in ("train", "eval")]


def test_two_gloo_ranks_match_one_process(tmp_path):
    # the masked-LM objective: each rank's micro-batches hold different numbers of targets,
    # so this also checks the global normalisation of the loss
    one, two = tmp_path / "one", tmp_path / "two"
    train(load_config(CONFIGS / "tiny_encoder.toml", [*SETS, f"train.out_dir={one}"]))
    torchrun(tmp_path, "tiny_encoder", [*SETS, f"train.out_dir={two}", "train.grad_accum=2"])
    a, b = curve(one), curve(two)
    assert [k[:2] for k in a] == [k[:2] for k in b] and len(a) == 6 + 3
    assert [x[2] for x in b] == pytest.approx([x[2] for x in a], rel=1e-5)
    _, m1, _ = load_run(one)
    _, m2, _ = load_run(two)
    for (name, p1), p2 in zip(m1.state_dict().items(), m2.state_dict().values()):
        torch.testing.assert_close(p2, p1, rtol=1e-4, atol=1e-6, msg=name)
