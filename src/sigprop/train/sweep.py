"""`sigprop sweep`: train a grid of run configs, resumably, one JSON line per finished point.

A sweep file is TOML with a ``[sweep]`` table; its other tables ([model], [data], [optim],
[train]) are the base run config, laid over the file named by ``sweep.base`` if given::

    [sweep]
    base = "../tiny_decoder.toml"     # optional, relative to this file
    out_dir = "runs/sweep"            # sweep.jsonl, points/, tokenizer.json, plots and summary
    size = "model.n_layers"           # optional: the size axis (numbers, or categories: strings/booleans)
    around_advice = false             # optional: centre each group's lr grid on its advised lr (below)
    [sweep.set]                       # optional: overrides applied to every point
    "train.steps" = 200
    [sweep.grid]                      # every combination is one point; "seed" is train.seed
    "optim.lr" = [1e-3, 3e-3, 1e-2]
    "model.n_layers" = [2, 8]
    seed = [0, 1]

Every point's config is built and validated before the first run starts, so a bad key or value
stops the sweep naming it; so does a grid value listed twice, or a size axis the report cannot use
(`sweep_report.check_size`). One BPE tokenizer per distinct data source is trained once into
``out_dir`` and pinned on every point (``data.tokenizer``), so no point retrains it. A point is
finished when its line is in ``sweep.jsonl`` (written by the parent, flushed and fsynced);
``--resume`` skips finished points, continues an unfinished point from its last checkpoint and runs any other
from scratch; a resume is bit-exact on CPU, so every way gives the same result (fixed seeds). Points checkpoint
every ``train.ckpt_minutes`` (5 unless the base sets it) and at the end, so a stop loses at most those minutes
of each running point. Ctrl-C stops the workers' runs after their current step, with a checkpoint; nothing
finished is lost.
The report (`sweep_report`) is built from those lines alone: ``--report-only`` rebuilds it without
running anything, and a failing report leaves ``sweep.jsonl`` as it was.

**Centred grids** (``around_advice``): the ``optim.lr`` values give the grid's shape, and each group (the points
that differ only in lr and seed) gets its own grid, those values times c_g / ḡ, where ḡ is their geometric mean
and c_g the group's centre (the command's ``--around-advice`` takes `sigprop.advice.advise`'s recommended lr,
measured once per group on its first point). The centres are kept in ``out_dir/lr_centres.json`` as they are
measured, so ``--resume`` and ``--report-only`` rebuild the same points without measuring again.
"""
from __future__ import annotations

import concurrent.futures as cf
import copy
import hashlib
import itertools
import json
import math
import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..console import UserError, read_toml, set_dotted, split_key
from ..console import progress as progress_bar
from ..console.files import write_atomic
from ..console.workers import WorkerPool
from .checkpoint import list_checkpoints
from .config import RunConfig, from_mapping
from .corpus import load_documents, split_documents
from .one_run import run_once
from .run_dir import clear
from .run_summary import CURVES
from .sweep_report import LR, check_size, group_label
from .tokenizer import BPETokenizer

SWEEP_KEYS = ("base", "out_dir", "size", "set", "grid", "around_advice")
CENTRES = "lr_centres.json"
SIZE_KEYS = ("model.n_layers", "model.d_model")
POINT_DEFAULTS = {"progress": False, "ckpt_every": 0, "ckpt_minutes": 5.0, "keep_last": 1}


@dataclass(frozen=True)
class SweepSpec:
    """A resolved sweep: the base run tables, the grid and where it writes."""

    base: dict[str, Any]                       # run-config tables before the grid
    grid: dict[str, list[Any]]                 # dotted key (or "seed") -> values
    out_dir: Path
    size: str | None = None                    # the size axis: a grid key (numbers or categories) or None
    fixed: dict[str, Any] = field(default_factory=dict)   # dotted overrides on every point
    around_advice: bool = False                # each group's lr grid centred on ``centres[group]``
    centres: dict[str, float] = field(default_factory=dict)   # group label -> centre lr (``around_advice``)

    def grid_points(self) -> list[dict[str, Any]]:
        """Every grid combination as {dotted key: value}, in grid order, with the grid's own lr values."""
        keys = list(self.grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(self.grid[k] for k in keys))]

    def points(self) -> list[dict[str, Any]]:
        """`grid_points`, each lr moved to its group's centred grid under ``around_advice`` (module docstring);
        UserError for a group whose centre is not measured yet."""
        points = self.grid_points()
        if not self.around_advice:
            return points
        mean = math.exp(statistics.fmean(math.log(v) for v in self.grid[LR]))
        missing = [g for g in dict.fromkeys(map(group_label, points)) if g not in self.centres]
        if missing:
            raise UserError(f"sweep.around_advice: no advised lr for group {missing[0]!r} yet in "
                            f"{self.out_dir / CENTRES}; run the sweep with --around-advice to measure it")
        return [{**p, LR: float(f"{p[LR] * self.centres[group_label(p)] / mean:.6g}")} for p in points]


def _dotted(key: str) -> str:
    """The run-config key of a sweep key (``seed`` is ``train.seed``); UserError if it is not section.key."""
    key = "train.seed" if key == "seed" else key
    split_key(key, "sweep key")
    return key


def point_tables(spec: SweepSpec, point: Mapping[str, Any]) -> dict[str, Any]:
    """The raw run tables of one point: base, then ``sweep.set``, then the point's values."""
    raw = copy.deepcopy(spec.base)
    for key, value in {**spec.fixed, **point}.items():
        set_dotted(raw, _dotted(key), value, "sweep key")
    return raw


def point_id(spec: SweepSpec, point: Mapping[str, Any]) -> str:
    """A stable, readable name for a point: its values joined, plus a short hash of its whole run tables
    (base, ``sweep.set`` and the point), so a changed base never passes for a finished point."""
    digest = hashlib.sha1(json.dumps(point_tables(spec, point), sort_keys=True).encode()).hexdigest()[:8]
    readable = "-".join(f"{k.split('.')[-1]}{v}" for k, v in point.items())
    return f"{readable[:80]}-{digest}".replace("/", "_").replace(" ", "")


def load_spec(path: str | Path, out_dir: str | Path | None = None, around_advice: bool = False) -> SweepSpec:
    """Read a sweep file; check its [sweep] table (keys, grid lists without repeats, a size axis the report can
    use, an lr grid to centre). ``around_advice``: as ``sweep.around_advice = true``; the centres measured so far
    are read from ``out_dir/lr_centres.json``. Raises UserError naming the first bad key."""
    path = Path(path)
    raw = read_toml(path)
    sweep = raw.pop("sweep", None)
    if not isinstance(sweep, dict):
        raise UserError(f"{path} has no [sweep] table")
    unknown = sorted(set(sweep) - set(SWEEP_KEYS))
    if unknown:
        raise UserError(f"unknown sweep key 'sweep.{unknown[0]}'; valid keys in sweep: {list(SWEEP_KEYS)}")
    base: dict[str, Any] = {}
    if "base" in sweep:
        base = read_toml(path.parent / sweep["base"])
    for section, table in raw.items():
        base.setdefault(section, {}).update(table)
    grid = sweep.get("grid", {})
    if not grid:
        raise UserError("sweep.grid is empty: name at least one key and its list of values")
    for key, values in grid.items():
        _dotted(key)
        if not isinstance(values, list) or not values:
            raise UserError(f"sweep.grid.{key!r} must be a non-empty list of values, got {values!r}")
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            raise UserError(f"sweep.grid.{key!r} lists {repeated[0]!r} more than once; each value must differ")
    size = sweep.get("size")
    if size is None:
        size = next((k for k in SIZE_KEYS if len(grid.get(k, [])) > 1), None)
    elif not isinstance(size, str) or size not in grid:
        raise UserError(f"sweep.size={size!r} must be one of the grid's keys {list(grid)}")
    if size is not None:
        check_size(size, grid[size])
    fixed = sweep.get("set", {})
    for key in fixed:
        _dotted(key)
    out = Path(out_dir if out_dir is not None else sweep.get("out_dir", "runs/sweep"))
    around = around_advice or sweep.get("around_advice", False)
    if not isinstance(around, bool):
        raise UserError(f"sweep.around_advice={around!r} must be true or false")
    if around:
        lrs = grid.get(LR, [])
        if not lrs or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in lrs):
            raise UserError(f"sweep.around_advice needs sweep.grid.{LR!r} as a list of positive numbers (the shape of "
                            f"every group's lr grid), got {lrs!r}")
    elif (out / CENTRES).exists():
        raise UserError(f"{out} is a sweep centred on advice ({CENTRES}); pass --around-advice (or set "
                        "sweep.around_advice = true) to resume or report it")
    centres = json.loads((out / CENTRES).read_text()) if around and (out / CENTRES).exists() else {}
    return SweepSpec(base, grid, out, size, fixed, around, {g: c["lr"] for g, c in centres.items()})


def resolve(spec: SweepSpec) -> list[tuple[dict[str, Any], RunConfig]]:
    """(point, validated RunConfig) for every point: raises UserError naming the first bad key or value."""
    out = []
    for point in spec.points():
        raw = point_tables(spec, point)
        train = {**POINT_DEFAULTS, **raw.get("train", {})}
        train.setdefault("diag_every", train.get("steps", 1000))      # attention logits/entropy at 0 and the end
        raw["train"] = {**train, "progress": False, "out_dir": str(spec.out_dir / "points" / point_id(spec, point))}
        try:
            cfg = from_mapping(RunConfig, raw)
        except UserError as e:
            raise UserError(f"sweep point {point}: {e}") from e
        out.append((point, cfg))
    return out


def _tokenizer_key(cfg: RunConfig) -> str:
    d = cfg.data
    return json.dumps([d.source, d.pattern, d.text_column, d.max_chars, d.val_fraction])


def pin_tokenizers(spec: SweepSpec, resolved: list[tuple[dict[str, Any], RunConfig]]
                   ) -> list[tuple[dict[str, Any], RunConfig]]:
    """Train one tokenizer per distinct text source (the smallest vocabulary its points use, on the first
    point's train split) into ``out_dir`` unless it exists, and pin it as every point's ``data.tokenizer``."""
    text = [c for _, c in resolved if c.objective != "digits" and not c.data.tokenizer]
    paths: dict[str, Path] = {}
    for key in dict.fromkeys(_tokenizer_key(c) for c in text):
        group = [c for c in text if _tokenizer_key(c) == key]
        vocab = min(c.model.vocab_size for c in group)
        path = spec.out_dir / f"tokenizer-{hashlib.sha1(f'{key}{vocab}'.encode()).hexdigest()[:8]}.json"
        if not path.exists():
            c = group[0]
            docs = load_documents(c.data.source, c.data.pattern, c.data.text_column, c.data.max_chars)
            BPETokenizer.train(split_documents(docs, c.data.val_fraction, c.train.seed)[0], vocab).save(path)
        paths[key] = path
    out = []
    for p, c in resolved:
        if c.objective != "digits" and not c.data.tokenizer:
            raw = c.to_dict()
            raw["data"]["tokenizer"] = str(paths[_tokenizer_key(c)])
            c = from_mapping(RunConfig, raw)
        out.append((p, c))
    return out


def run_point(pid: str, point: dict[str, Any], cfg_dict: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """Train one point and return its JSON line: with ``resume``, from the last checkpoint its folder holds (the
    folder's name carries the hash of the point's run tables, so the checkpoint is this point's); otherwise, or
    with none, from scratch in a cleared folder.

    Raises `sigprop.console.stopping.Stopped` if the run was stopped by a signal (the point is then not
    finished)."""
    run_dir = Path(cfg_dict["train"]["out_dir"])
    if resume and list_checkpoints(run_dir / "checkpoints"):
        cfg_dict = {**cfg_dict, "train": {**cfg_dict["train"], "resume": True}}
    else:
        clear(run_dir)
    cfg = from_mapping(RunConfig, cfg_dict)
    run = {k: v for k, v in run_once(cfg).items() if k not in CURVES}
    return {"id": pid, "point": point, "config": cfg.to_dict(), **run}


def finished_records(path: Path) -> dict[str, dict[str, Any]]:
    """id -> record of every complete line of ``sweep.jsonl`` (a torn last line is ignored)."""
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[r["id"]] = r
    return out


def logged_records(spec: SweepSpec) -> tuple[list[dict[str, Any]], int]:
    """The finished points of ``spec`` in its ``sweep.jsonl`` (grid order) and the number of points in its grid.

    Lines of other configs (another id) are left out. Raises UserError if no point of ``spec`` is finished."""
    log = spec.out_dir / "sweep.jsonl"
    done = finished_records(log)
    ids = [point_id(spec, p) for p in spec.points()]
    records = [done[i] for i in ids if i in done]
    if not records:
        raise UserError(f"{log} holds no finished point of this sweep (a changed config gives its points new ids); "
                        "run the sweep first")
    return records, len(ids)


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that a kill left without its newline, so the next append starts a fresh line."""
    if path.exists():
        text = path.read_text()
        if text and not text.endswith("\n"):
            path.write_text(text[: text.rfind("\n") + 1])


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _worker_threads(threads: int) -> None:
    torch.set_num_threads(threads)


class _InProcess(cf.Executor):
    """An executor that runs each call in this process when it is submitted."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:
            future.set_exception(e)
        return future


def worker_pool(jobs: int) -> cf.Executor:
    """``jobs`` worker processes that share the CPU (for ``jobs`` <= 1: this process, each call run as it is
    submitted). Each worker runs torch on cores/jobs threads (at least 1), so ``jobs`` workers do not
    oversubscribe the cores torch would use in one process. The workers stop with the command
    (`sigprop.console.workers.WorkerPool`: fork, so a worker starts with the parent's imports; spawn re-imports
    torch in every worker, bench/RESULTS.md times both)."""
    if jobs <= 1:
        return _InProcess()
    return WorkerPool(jobs, _worker_threads, (max(1, torch.get_num_threads() // jobs),))


Centre = Callable[[RunConfig], tuple[float, dict[str, Any]]]     # a group's config -> (centre lr, what decided it)


def measure_centres(spec: SweepSpec, resolved: Sequence[tuple[dict[str, Any], RunConfig]], centre: Centre,
                    progress: bool = True) -> SweepSpec:
    """``spec`` with a centre for every group (``around_advice``): ``centre`` of the config of each group's first
    point in ``resolved`` (the grid's own lrs, tokenizers pinned) not yet in ``out_dir/lr_centres.json``, which
    gets each one as it is measured ({group: {"lr", "detail"}})."""
    path = spec.out_dir / CENTRES
    stored = json.loads(path.read_text()) if path.exists() else {}
    firsts: dict[str, RunConfig] = {}
    for p, c in resolved:
        firsts.setdefault(group_label(p), c)
    todo = [(g, c) for g, c in firsts.items() if g not in stored]
    for g, c in progress_bar(todo, desc="advice", enabled=progress):
        lr, detail = centre(c)
        if not (math.isfinite(lr) and lr > 0):
            raise UserError(f"sweep.around_advice: the advised lr of group {g!r} is {lr!r}, not a positive number")
        stored[g] = {"lr": lr, "detail": detail}
        write_atomic(path, json.dumps(stored, indent=1))
    return replace(spec, centres={g: c["lr"] for g, c in stored.items()})


def run_sweep(spec: SweepSpec, jobs: int = 1, resume: bool = False, progress: bool = True,
              centre: Centre | None = None) -> list[dict[str, Any]]:
    """Run every unfinished point (``jobs`` worker processes, or in-process for 1); returns all records in grid
    order. Under ``around_advice`` the groups' centres come first (`measure_centres` with ``centre``; without it
    every centre must be stored already)."""
    resolved = resolve(replace(spec, around_advice=False))    # every point validated before anything runs
    log = spec.out_dir / "sweep.jsonl"
    done = finished_records(log)
    if done and not resume:
        raise UserError(f"{log} already holds {len(done)} finished point(s); pass --resume to continue it "
                        "(--report-only to rebuild its report), or choose another sweep.out_dir")
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    _drop_torn_tail(log)
    resolved = pin_tokenizers(spec, resolved)
    if spec.around_advice:
        spec = measure_centres(spec, resolved, centre, progress) if centre else spec
        resolved = pin_tokenizers(spec, resolve(spec))
    todo = [(p, c) for p, c in resolved if point_id(spec, p) not in done]
    bar = {"desc": "sweep", "total": len(resolved), "initial": len(resolved) - len(todo), "enabled": progress}
    if jobs <= 1:
        for p, c in progress_bar(todo, **bar):
            r = run_point(point_id(spec, p), p, c.to_dict(), resume)
            _append(log, r)
            done[r["id"]] = r
    else:
        with worker_pool(jobs) as pool:
            futures = [pool.submit(run_point, point_id(spec, p), p, c.to_dict(), resume) for p, c in todo]
            for fut in progress_bar(cf.as_completed(futures), **bar):
                r = fut.result()
                _append(log, r)
                done[r["id"]] = r
    return [done[point_id(spec, p)] for p, _ in resolved]
