"""Stopping a command: SIGINT and SIGTERM end it and every worker it started within seconds (exit 130 / 143),
SIGKILL of it ends its workers too, what finished stays on disk, ``--resume`` completes the rest, and a second
signal stops at once (`sigprop.console.stopping`, `sigprop.console.workers`)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import FAST_TRAIN, free_port, train_argv
from sigprop.console.stopping import Stopped, exit_code, stop_on_signals, stopped_by
from sigprop.console.workers import GRACE, WorkerPool
from sigprop.train import list_checkpoints, read_jsonl

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc").is_dir(), reason="POSIX processes")

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still running (zombies awaiting their reaper are not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def running(marker: str) -> bool:
    """Whether a live process has ``marker`` in its command line (torchrun starts each rank as the leader of a
    new process group, so its ranks are found by their script, not by the group)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace") and alive(int(cmdline.parent.name)):
                return True
        except OSError:
            continue
    return False


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def test_exit_codes_follow_the_shell():
    assert exit_code(Stopped(signal.SIGINT)) == 130 and exit_code(Stopped(signal.SIGTERM)) == 143
    assert exit_code(KeyboardInterrupt()) == 130
    assert stopped_by("SIGTERM", "x").signum == signal.SIGTERM and stopped_by("requested", "x").signum == signal.SIGINT


def test_a_signal_raises_stopped_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as caught, stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)                          # the handler raises at the next bytecode
    assert caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_leaving_the_pool_by_an_exception_ends_busy_workers_within_the_grace():
    start = time.monotonic()
    with pytest.raises(Stopped), WorkerPool(2) as pool:
        futures = [pool.submit(_sleep, 60) for _ in range(4)]
        pids = [p.pid for p in pool._workers()]
        wait_until(lambda: all(alive(p) for p in pids), 10, "workers started")
        raise Stopped(signal.SIGTERM)
    assert time.monotonic() - start < GRACE + 5
    assert not any(alive(p) for p in pids)
    wait_until(lambda: all(f.done() for f in futures), 5, "every call cancelled or failed")


def test_a_normal_exit_waits_for_the_results():
    with WorkerPool(2) as pool:
        futures = [pool.submit(_sleep, 0.1) for _ in range(3)]
    assert all(isinstance(f.result(), int) for f in futures)


PARENT = textwrap.dedent(r"""
    import os, signal, sys, time
    from sigprop.console.workers import WorkerPool
    from sigprop.console.stopping import Stopped, exit_code, stop_on_signals

    def stubborn_nap(s):              # a worker that survives SIGTERM (it says so): only a kill ends it
        signal.signal(signal.SIGTERM, lambda *_: os.write(1, b"term\n"))
        os.write(1, b"busy\n")       # one write: the two workers' lines never interleave
        time.sleep(s)

    try:
        with stop_on_signals(), WorkerPool(2) as pool:
            futures = [pool.submit(stubborn_nap, 60) for _ in range(2)]
            print(" ".join(str(p.pid) for p in pool._workers()), flush=True)
            time.sleep(60)
    except Stopped as e:
        sys.exit(exit_code(e))
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, "twice"], ids=["SIGKILL", "second-SIGINT"])
def test_workers_die_with_their_parent_and_a_second_signal_stops_at_once(sig):
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV, start_new_session=True)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(3)]      # the workers may start before the print
        pids = [int(p) for line in lines if line != "busy" for p in line.split()]
        assert len(pids) == 2 and lines.count("busy") == 2, (lines, proc.stderr.read())
        start = time.monotonic()
        if sig == "twice":        # the first SIGINT starts the graceful stop; the second ends it at once
            proc.send_signal(signal.SIGINT)
            assert proc.stdout.readline().strip() == "term"            # the parent is in its grace period
            start = time.monotonic()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 130
            assert time.monotonic() - start < GRACE / 2, "the second signal did not stop at once"
            assert "stopped at once" in proc.stderr.read()
        else:
            proc.send_signal(sig)
            proc.wait(timeout=10)
        wait_until(lambda: not group_alive(proc.pid), 10, "no worker outlives its parent")
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


# -- the commands ---------------------------------------------------------------------------------------------

SWEEP = """
[sweep]
out_dir = "{out}"
[sweep.grid]
"optim.lr" = [1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2]
seed = [0]
[model]
arch = "decoder"
vocab_size = 300
d_model = 32
n_heads = 2
n_layers = 2
max_seq_len = 32
[data]
source = "pydoc"
seq_len = 32
max_chars = 20000
[optim]
warmup_steps = 2
[train]
steps = 40
batch_size = 8
eval_batches = 1
"""


def _sweep(tmp_path: Path) -> tuple[list[str], Path, int]:
    config = tmp_path / "sweep.toml"
    config.write_text(SWEEP.format(out=tmp_path / "out"))
    log = tmp_path / "out" / "sweep.jsonl"
    return ["sweep", "--config", str(config), "--jobs", "2", "--no-progress"], log, 6


def _demo(tmp_path: Path) -> tuple[list[str], Path, int]:
    out = tmp_path / "demo"
    return ["demo", "--quick", "--jobs", "2", "--out", str(out), "--no-progress"], out / "parts", 12


def _finished(kind: str, where: Path) -> int:
    if kind == "sweep":
        return len(where.read_text().splitlines()) if where.exists() else 0
    return len(list(where.glob("*-*.json"))) if where.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sweep", "demo"])
@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM", "SIGKILL"])
def test_a_stopped_command_leaves_no_process_keeps_what_finished_and_resumes(tmp_path, kind, how):
    argv, where, total = (_sweep if kind == "sweep" else _demo)(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "sigprop", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        wait_until(lambda: _finished(kind, where) >= 1 or proc.poll() is not None, 120, "a first finished point")
        assert proc.poll() is None, "the command finished before it could be stopped"
        start = time.monotonic()
        if how == "SIGINT to the group":       # what a terminal's Ctrl-C does
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=30)
        if how != "SIGKILL":
            assert time.monotonic() - start < 10
            assert proc.returncode == (130 if "SIGINT" in how else 143), err
            assert "resume" in err and "Traceback" not in err, err
        wait_until(lambda: not group_alive(proc.pid), 10, "no descendant outlives the command")
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    kept = _finished(kind, where)
    assert 1 <= kept < total
    done = subprocess.run([sys.executable, "-m", "sigprop", *argv, "--resume"], capture_output=True, text=True,
                          env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _finished(kind, where) == total
    if kind == "sweep":
        assert len({json.loads(line)["id"] for line in where.read_text().splitlines()}) == total
    else:
        assert (where.parent / "report.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_torchrun_ranks_stop_with_torchrun_and_keep_their_checkpoint(tmp_path, sig):
    script = tmp_path / "entry.py"
    script.write_text("import sys\nfrom sigprop.train import train_main\nsys.exit(train_main(sys.argv[1:]))\n")
    out = tmp_path / "run"
    argv = train_argv("tiny_decoder", *FAST_TRAIN, f"train.out_dir={out}", "train.steps=100000", "train.ckpt_every=0",
                      "train.eval_batches=0")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                             "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)
    try:
        metrics = out / "metrics.jsonl"
        wait_until(lambda: metrics.exists() and len(read_jsonl(metrics, "train")) >= 3 or proc.poll() is not None,
                   120, "three training steps")
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        wait_until(lambda: not running(str(script)), 20, "no rank outlives torchrun")
    finally:
        if proc.poll() is None:
            proc.kill()
    last = read_jsonl(metrics, "train")[-1]["step"]
    assert [p.name for p in list_checkpoints(out / "checkpoints")][-1:] == [f"step_{last:08d}.json"], err[-3000:]
