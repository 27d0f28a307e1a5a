"""The run folder rule: sigprop never overwrites or deletes what it did not create.

A folder is sigprop's to write into, or to delete and start afresh, only if it is new, empty, or a sigprop
run folder (one holding the ``MARKER`` file that `claim` writes, or checkpoints), and never the current
directory (`check_owned`). ``train.out_dir`` must be such a folder; a run folder with checkpoints is
continued only with ``train.resume``, a fresh run there is refused, and ``--resume`` with no checkpoint is
an error unless ``train.fresh_if_none`` asks to start from step 0 (`check_run_dir`). A sweep point or an
experiment's run that starts again from scratch clears its folder by the same rule (`clear`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..console.errors import UserError
from .checkpoint import list_checkpoints, resume_point

MARKER = ".sigprop-run"       # written first into every run folder; its presence makes a folder a sigprop run


def is_run(folder: Path) -> bool:
    """True when ``folder`` holds a sigprop run's marker (or, for runs older than the marker, checkpoints)."""
    return (folder / MARKER).is_file() or bool(list_checkpoints(folder / "checkpoints"))


def check_owned(folder: Path, where: str) -> None:
    """UserError (worded with ``where``, e.g. ``train.out_dir='x'``) unless ``folder`` is sigprop's to write
    into or delete: absent, empty or a sigprop run folder, and not the current directory."""
    if folder.resolve() == Path.cwd().resolve():
        raise UserError(f"{where} is the current directory; choose a new folder for the run, e.g. runs/NAME")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{where} is an existing file, not a folder; choose a new folder for the run")
    if folder.is_dir() and any(folder.iterdir()) and not is_run(folder):
        names = sorted(p.name for p in folder.iterdir())
        raise UserError(f"{where} holds files that sigprop did not write ({', '.join(names[:5])}"
                        f"{', …' if len(names) > 5 else ''}); choose a new or empty folder")


def clear(run_dir: Path) -> None:
    """Delete ``run_dir`` so that a run starts there from scratch, if `check_owned` allows it (UserError if not)."""
    check_owned(run_dir, f"run folder {str(run_dir)!r}")
    if run_dir.is_dir():
        shutil.rmtree(run_dir)


def check_run_dir(train: Any) -> Path:
    """``train.out_dir`` (a `TrainConfig`) as a Path once the rule above holds; UserError otherwise."""
    run_dir = Path(train.out_dir)
    where = f"train.out_dir={train.out_dir!r}"
    check_owned(run_dir, where)
    ckpts = list_checkpoints(run_dir / "checkpoints")
    if not train.resume and ckpts:
        raise UserError(f"{where} already holds checkpoints; set train.resume=true (or --resume) to continue, "
                        "or choose another train.out_dir")
    if train.resume and resume_point(run_dir / "checkpoints", train.resume_from) is None and not train.fresh_if_none:
        raise UserError(f"nothing to resume: {where} has no checkpoint; drop --resume to start a new run, or set "
                        "train.fresh_if_none=true (--fresh-if-none) to start from step 0 when there is none")
    return run_dir


def claim(run_dir: Path) -> None:
    """Create ``run_dir`` (if needed) and mark it as a sigprop run; raises UserError if it cannot be written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / MARKER).write_text(json.dumps({"format": "sigprop-run", "version": 1}) + "\n")
    except OSError as e:
        raise UserError(f"train.out_dir={str(run_dir)!r} cannot be written: {e.strerror or e}") from e
