"""The run folder rule: a run never overwrites what it did not create.

``train.out_dir`` must be a new folder, an empty folder, or a sigprop run folder (one holding the
``MARKER`` file that `claim` writes, or checkpoints). A run folder with checkpoints is continued only with
``train.resume``; a fresh run there is refused. The current directory is never a run folder, and
``--resume`` with no checkpoint is an error unless ``train.fresh_if_none`` asks to start from step 0.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoint import list_checkpoints, resume_point

MARKER = ".sigprop-run"       # written first into every run folder; its presence makes a folder a sigprop run


def is_run(folder: Path) -> bool:
    """True when ``folder`` holds a sigprop run's marker (or, for runs older than the marker, checkpoints)."""
    return (folder / MARKER).is_file() or bool(list_checkpoints(folder / "checkpoints"))


def check_run_dir(train: Any) -> Path:
    """``train.out_dir`` (a `TrainConfig`) as a Path once the rule above holds; ValueError otherwise."""
    run_dir = Path(train.out_dir)
    where = f"train.out_dir={train.out_dir!r}"
    if run_dir.resolve() == Path.cwd().resolve():
        raise ValueError(f"{where} is the current directory; choose a new folder for the run, e.g. runs/NAME")
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{where} is an existing file, not a folder; choose a new folder for the run")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not is_run(run_dir):
        names = sorted(p.name for p in run_dir.iterdir())
        raise ValueError(f"{where} holds files that sigprop did not write ({', '.join(names[:5])}"
                         f"{', …' if len(names) > 5 else ''}); choose a new or empty folder")
    ckpts = list_checkpoints(run_dir / "checkpoints")
    if not train.resume and ckpts:
        raise ValueError(f"{where} already holds checkpoints; set train.resume=true (or --resume) to continue, "
                         "or choose another train.out_dir")
    if train.resume and resume_point(run_dir / "checkpoints", train.resume_from) is None and not train.fresh_if_none:
        raise ValueError(f"nothing to resume: {where} has no checkpoint; drop --resume to start a new run, or set "
                         "train.fresh_if_none=true (--fresh-if-none) to start from step 0 when there is none")
    return run_dir


def claim(run_dir: Path) -> None:
    """Create ``run_dir`` (if needed) and mark it as a sigprop run; raises ValueError if it cannot be written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / MARKER).write_text(json.dumps({"format": "sigprop-run", "version": 1}) + "\n")
    except OSError as e:
        raise ValueError(f"train.out_dir={str(run_dir)!r} cannot be written: {e.strerror or e}") from e
