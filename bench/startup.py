"""Start-up cost of ``sigprop simulate``: time of fresh processes and the heavy modules they import.

    OMP_NUM_THREADS=1 python bench/startup.py [--repeats 7] [--src SRC ...]

Each command runs ``--repeats`` times in a fresh interpreter, interleaved over the source trees given with
``--src`` (each put first on PYTHONPATH; default: the installed sigprop). The table gives, per tree and
command, the median wall time and the median CPU time (user + system) of the child, which a shared machine
disturbs less than the wall time. The import check runs a tiny ``simulate sde`` in one process and lists
which of matplotlib, scipy, tokenizers, sigprop.train and sigprop.experiments are then in ``sys.modules``
(matplotlib writes the PNG).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HEAVY = ("matplotlib", "scipy", "tokenizers", "sigprop.train", "sigprop.experiments")
SMALL = ["sde", "--paths", "8", "--steps", "4", "--chunk", "8", "--no-progress", "--out"]


def commands(out: str) -> dict[str, list[str]]:
    """Command label -> argv of a fresh interpreter."""
    return {"sigprop simulate sde --help": [sys.executable, "-m", "sigprop", "simulate", "sde", "--help"],
            "sigprop simulate sde (8 paths, 4 steps, JSON + PNG)": [sys.executable, "-m", "sigprop", "simulate",
                                                                    *SMALL, out]}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def loaded_after_run(out: str, env: dict[str, str]) -> list[str]:
    """The `HEAVY` modules in ``sys.modules`` after a small ``simulate sde`` run."""
    code = ("import sys; from sigprop.simulate.commands import simulate_main; "
            f"simulate_main({[*SMALL, out]!r}); print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip().splitlines()[-1].split() if done.stdout.strip() else []


def environment(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), *filter(None, [env.get("PYTHONPATH")])])
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--src", action="append", default=None, help="a source tree to put first on PYTHONPATH")
    args = parser.parse_args()
    trees = args.src or [None]
    with tempfile.TemporaryDirectory() as out:
        cmds = commands(out)
        times = {(t, name): [] for t in trees for name in cmds}
        for _ in range(args.repeats):
            for tree in trees:
                for name, argv in cmds.items():
                    times[tree, name].append(timed(argv, environment(tree)))
        heavy = {tree: loaded_after_run(out, environment(tree)) for tree in trees}
    print("| source tree | command | median wall s (min–max) | median CPU s |\n|---|---|---|---|")
    for (tree, name), ts in times.items():
        wall, cpu = [w for w, _ in ts], [c for _, c in ts]
        print(f"| {tree or 'installed'} | `{name}` | {statistics.median(wall):.2f} ({min(wall):.2f}–{max(wall):.2f}) "
              f"| {statistics.median(cpu):.2f} |")
    for tree, mods in heavy.items():
        print(f"\n{tree or 'installed'}: heavy modules after a small `simulate sde` run: {', '.join(mods) or 'none'}")


if __name__ == "__main__":
    main()
