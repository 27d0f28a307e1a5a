"""Leaving a torchrun rank: `exit_rank` ends the process with the status asked for, its output flushed, and
`train_main` calls it only as one of several ranks."""
import subprocess
import sys

import pytest

LEAVE = ("import sys; from sigprop.train.distributed import exit_rank; "
         "print('out', end=''); print('err', end='', file=sys.stderr); exit_rank(3); print('after')")


def test_exit_rank_flushes_and_ends_with_the_status():
    proc = subprocess.run([sys.executable, "-c", LEAVE], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out", "err")


@pytest.mark.parametrize("world, ends", [("1", False), ("2", True)])
def test_train_main_leaves_the_process_only_under_torchrun(world, ends, monkeypatch):
    from sigprop.train import commands
    left = []
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setattr(commands, "_train", lambda argv: 5)
    monkeypatch.setattr(commands, "exit_rank", left.append)
    assert commands.train_main([]) == 5
    assert left == ([5] if ends else [])
