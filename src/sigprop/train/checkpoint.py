"""Atomic, verifiable checkpoints: safetensors for tensors, JSON for everything else.

A checkpoint at step s is three files in ``checkpoints/``::

    step_0000000s.weights.safetensors   model state (tied weights stored once)
    step_0000000s.state.safetensors     optimizer tensors + torch RNG states
    step_0000000s.json                  format marker, configs, step, data position,
                                        optimizer hyper-parameters, python/numpy RNG,
                                        sha256 of both tensor files

Each file is written to a temporary name, fsync'ed and renamed (``os.replace``); the JSON
goes last, so a checkpoint exists only once all its parts are complete. Loading checks
the marker, the model config and both hashes, and raises `CheckpointError` otherwise.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from ..console.errors import UserError
from ..models import ModelConfig

FORMAT, VERSION = "sigprop-checkpoint", 1
_NAME = re.compile(r"^step_(\d{8})\.json$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, corrupt, or belongs to another model/program (a user error: exit 2)."""


def _fsync_replace(tmp: Path, final: Path) -> None:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU, CUDA if present)."""
    npst = np.random.get_state()
    return {"python": random.getstate(), "numpy": [npst[0], npst[1].tolist(), *npst[2:]],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(ckpt_dir: Path, step: int, model: nn.Module | dict[str, torch.Tensor],
                    optimizer: torch.optim.Optimizer | dict[str, Any],
                    meta: dict[str, Any], rngs: list[dict[str, Any]], keep_last: int,
                    protect: Path | None = None) -> Path:
    """Write the checkpoint of ``step`` atomically and keep the newest ``keep_last`` (and ``protect``, the
    last good one, whatever its age); returns the JSON path.

    Args:
        ckpt_dir: the run's ``checkpoints`` folder (created if missing).
        step: the optimizer step the state belongs to.
        model: the model, or its full state dict (what `sigprop.train.parallel.gather_state` returns for a
            sharded model).
        optimizer: the optimizer, or its full state dict.
        meta: JSON-able extras (configs, data position).
        rngs: `capture_rng` of every rank.
        keep_last: how many of the newest checkpoints to keep.
        protect: a checkpoint never deleted (the last good one).

    Raises:
        OSError: the folder or a file cannot be written (nothing of the new checkpoint is then visible).
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    stem = ckpt_dir / f"step_{step:08d}"
    weights, state = Path(f"{stem}.weights.safetensors"), Path(f"{stem}.state.safetensors")
    if isinstance(model, nn.Module):
        save_model(model, f"{weights}.tmp")
    else:
        save_file({k: v.contiguous() for k, v in model.items()}, f"{weights}.tmp")
    _fsync_replace(Path(f"{weights}.tmp"), weights)
    sd = optimizer.state_dict() if isinstance(optimizer, torch.optim.Optimizer) else optimizer
    tensors = {f"optim.{i}.{k}": v.detach().cpu().contiguous()
               for i, st in sd["state"].items() for k, v in st.items() if torch.is_tensor(v)}
    scalars = {str(i): {k: v for k, v in st.items() if not torch.is_tensor(v)} for i, st in sd["state"].items()}
    for r, rng in enumerate(rngs):
        tensors[f"rng.{r}.torch"] = rng["torch"]
        tensors.update({f"rng.{r}.cuda.{d}": t for d, t in enumerate(rng["cuda"])})
    save_file(tensors, f"{state}.tmp")
    _fsync_replace(Path(f"{state}.tmp"), state)
    record = {"format": FORMAT, "version": VERSION, "step": step, **meta,
              "weights": {"file": weights.name, "sha256": _sha256(weights)},
              "state": {"file": state.name, "sha256": _sha256(state)},
              "optimizer": {"param_groups": sd["param_groups"],   # and the state that is not a tensor (Prodigy's step)
                            "scalars": {i: st for i, st in scalars.items() if st}},
              "rng": [{"python": r["python"], "numpy": r["numpy"], "n_cuda": len(r["cuda"])} for r in rngs]}
    tmp = Path(f"{stem}.json.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    _fsync_replace(tmp, Path(f"{stem}.json"))
    for old in list_checkpoints(ckpt_dir)[:-keep_last]:
        if protect is not None and old.name == Path(protect).name:
            continue
        for p in checkpoint_files(old):
            p.unlink(missing_ok=True)
    return Path(f"{stem}.json")


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoint JSON files in ``ckpt_dir``, oldest first.

    Args:
        ckpt_dir: a run's ``checkpoints`` folder; a missing folder has none.
    """
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if _NAME.match(p.name))


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint JSON's file name says it holds."""
    m = _NAME.match(Path(path).name)
    if m is None:
        raise CheckpointError(f"{path} is not named as a sigprop checkpoint (step_NNNNNNNN.json)")
    return int(m.group(1))


def checkpoint_files(path: Path) -> tuple[Path, Path, Path]:
    """The three files of the checkpoint whose JSON is ``path``: JSON, weights, state."""
    path = Path(path)
    stem = path.name[:-len(".json")]
    return path, path.with_name(f"{stem}.weights.safetensors"), path.with_name(f"{stem}.state.safetensors")


def resume_point(ckpt_dir: Path, chosen: str | Path | None) -> Path | None:
    """The checkpoint to resume from: ``chosen`` (which must be one of ``ckpt_dir``'s) or else the newest;
    None when ``ckpt_dir`` holds none."""
    found = list_checkpoints(ckpt_dir)
    if not chosen:
        return found[-1] if found else None
    path = Path(chosen)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; checkpoints of this run: "
                              f"{[p.name for p in found] or 'none'} in {ckpt_dir}")
    if path.resolve() not in [p.resolve() for p in found]:
        raise CheckpointError(f"checkpoint {path} is not one of this run's checkpoints (in {ckpt_dir}: "
                              f"{[p.name for p in found] or 'none'}); resume from a checkpoint of train.out_dir")
    return path


def set_aside_newer(ckpt_dir: Path, step: int) -> Path | None:
    """Move the checkpoints newer than ``step`` into ``ckpt_dir/abandoned_after_<step>/`` (a run resumed
    from an earlier checkpoint continues from there; nothing is deleted); returns that folder or None."""
    newer = [p for p in list_checkpoints(ckpt_dir) if checkpoint_step(p) > step]
    if not newer:
        return None
    folder = ckpt_dir / f"abandoned_after_{step:08d}"
    folder.mkdir(exist_ok=True)
    for ckpt in newer:
        for p in checkpoint_files(ckpt):
            if p.exists():
                os.replace(p, folder / p.name)
    return folder


def read_checkpoint(path: Path, model_config: dict[str, Any]) -> dict[str, Any]:
    """Parse and verify a checkpoint's JSON (marker, model config, file hashes) -> its record."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {path} does not exist") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"corrupt checkpoint {path}: unreadable JSON ({e})") from e
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a sigprop checkpoint (no format={FORMAT!r} marker)")
    if record.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has version {record.get('version')}, expected {VERSION}")
    theirs = record.get("model_config", {})
    with contextlib.suppress(ValueError, TypeError):      # compare resolved configs (older files wrote n_dec_layers)
        theirs = ModelConfig.from_dict(theirs).to_dict()
    diff = sorted(k for k in set(theirs) | set(model_config) if theirs.get(k) != model_config.get(k))
    if diff:
        detail = ", ".join(f"{k}: checkpoint {theirs.get(k)!r} vs run {model_config.get(k)!r}" for k in diff)
        raise CheckpointError(f"checkpoint {path} belongs to a different model ({detail})")
    for part in ("weights", "state"):
        file = Path(path).parent / record[part]["file"]
        if not file.exists():
            raise CheckpointError(f"corrupt checkpoint {path}: {file.name} is missing")
        digest = _sha256(file)
        if digest != record[part]["sha256"]:
            raise CheckpointError(f"corrupt checkpoint {path}: sha256 of {file.name} is {digest[:12]}…, "
                                  f"expected {record[part]['sha256'][:12]}… (truncated or modified)")
    return record


def _read_state(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The optimizer state dict (integer-keyed, as ``optimizer.state_dict()``) of a verified checkpoint;
    fills in the per-rank torch/CUDA RNG states of ``record["rng"]``."""
    tensors = load_file(Path(path).parent / record["state"]["file"])
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for idx, values in record["optimizer"].get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(values)
    record["rng"] = [{**r, "torch": tensors[f"rng.{i}.torch"],
                      "cuda": [tensors[f"rng.{i}.cuda.{d}"] for d in range(r["n_cuda"])]}
                     for i, r in enumerate(record["rng"])]
    return {"state": state, "param_groups": record["optimizer"]["param_groups"]}


def read_states(path: Path, model_config: dict[str, Any]
                ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """Verify a checkpoint and read it whole, without a model: (record with RNG states, full model
    state dict, optimizer state dict). For loaders that place the tensors themselves (sharding)."""
    record = read_checkpoint(path, model_config)
    try:
        weights = load_file(Path(path).parent / record["weights"]["file"])
    except Exception as e:   # safetensors raises several types for malformed files
        raise CheckpointError(f"corrupt checkpoint {path}: cannot load weights ({e})") from e
    return record, weights, _read_state(path, record)


def load_checkpoint(path: Path, model: nn.Module, model_config: dict[str, Any],
                    optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Verify, then load weights (and optimizer state) in place; returns the record with the
    per-rank RNG states under ``"rng"`` (python, numpy, torch, cuda).

    Args:
        path: the checkpoint's JSON file (``step_NNNNNNNN.json``).
        model: the model to load the weights into, built from the same config.
        model_config: that config as a dict (`ModelConfig.to_dict`); a checkpoint of another model is refused.
        optimizer: also load its state, if given.

    Returns:
        The checkpoint's JSON record.

    Raises:
        CheckpointError: the file is missing, unreadable, not a sigprop checkpoint, of another format version
            or model, corrupt, or its weights do not fit ``model``.
    """
    record = read_checkpoint(path, model_config)
    folder = Path(path).parent
    try:
        missing, unexpected = load_model(model, folder / record["weights"]["file"], strict=False)
    except Exception as e:   # safetensors raises several types for malformed files
        raise CheckpointError(f"corrupt checkpoint {path}: cannot load weights ({e})") from e
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not fit the model: missing {sorted(missing)}, "
                              f"unexpected {sorted(unexpected)}")
    optim = _read_state(path, record)
    if optimizer is not None:
        optimizer.load_state_dict(optim)
    return record
