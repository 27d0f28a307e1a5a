"""``sigprop grow``: a trained run, deeper, as a new run folder that ``sigprop train --resume`` continues.

The newest checkpoint of ``--run`` is grown by `sigprop.models.grow.grow` and written as the checkpoint of
the same step in ``--out``, with its config.toml (``train.out_dir`` = ``--out``, the new ``model.n_layers``),
tokenizer and command line; the grown run trains to ``train.steps`` (a stage's ``train.stop_at`` and a
growth already done, ``train.grow_at``, are cleared). Optimizer state: AdamW moments are mapped by parameter
name (`sigprop.train.growth.grown_optimizer_state`: an existing block's parameters follow it to its new index)
and kept for every existing parameter; new blocks' parameters get fresh state (zero moments, step 0). The data
position and RNG states are the checkpoint's; the health tracker (`sigprop.train.health`) starts afresh. The
validation loss is measured before and after growth (at least one validation batch, as ``sigprop eval`` does
it), printed, and kept in the checkpoint's ``grown_from``.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from torch import nn

from ..console import EXIT_OK, USER_ERRORS, Parser, UserError, fail
from ..models.grow import MODES, grow, plan
from .checkpoint import read_states, save_checkpoint
from .config import RunConfig, dump_toml
from .data import prepare_data
from .growth import grown_optimizer_state
from .run import load_run, seed_everything
from .run_dir import check_run_dir, claim
from .trainer import Trainer

PROG = "sigprop grow"




def validation_loss(cfg: RunConfig, model: nn.Module, data: Any, run_dir: Path) -> float:
    """Loss on the run's fixed validation examples (at least one batch)."""
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_batches=max(1, cfg.train.eval_batches)))
    return Trainer(cfg, model, data, run_dir).evaluate()["loss"]


def grow_run(run: str | Path, out: str | Path, n_layers: int, mode: str, every: int | None = None,
             at: str | None = None, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Grow ``run``'s newest checkpoint to ``n_layers`` blocks into the new run folder ``out`` (module
    docstring); returns the summary (old and new depth, step, checkpoint, validation loss before and after).
    Raises UserError (CheckpointError among them) or OSError for bad input, naming it."""
    run_dir, out_dir = Path(run), Path(out)
    if not (run_dir / "config.toml").is_file():
        raise UserError(f"--run {run}: not a sigprop run folder (no config.toml)")
    cfg, model, path = load_run(run_dir)
    if n_layers <= cfg.model.n_layers:
        raise UserError(f"--to must be greater than the run's depth model.n_layers={cfg.model.n_layers}, "
                        f"got {n_layers}")
    train = dataclasses.replace(cfg.train, out_dir=str(out_dir), resume=False, resume_from="", fresh_if_none=False,
                                stop_at=0, grow_at=0, grow_to=0)
    check_run_dir(train)
    slots = plan(cfg.model.n_layers, n_layers, every, at)
    record, _, old_state = read_states(path, cfg.model.to_dict())
    seed_everything(cfg.train.seed + record["step"])              # the draws of mode "dslm"'s new blocks
    grown = grow(model, n_layers, mode, every, at)
    text = (run_dir / "tokenizer.json").is_file()
    data = dataclasses.replace(cfg.data, tokenizer=str(out_dir / "tokenizer.json")) if text else cfg.data
    new_cfg = dataclasses.replace(cfg, model=grown.cfg, data=data, train=train)
    state = grown_optimizer_state(model, old_state, grown, cfg, new_cfg, slots)
    bundle = prepare_data(cfg, run_dir, save_tokenizer=False)
    before = validation_loss(cfg, model, bundle, run_dir)
    after = validation_loss(new_cfg, grown, bundle, run_dir)
    claim(out_dir)
    (out_dir / "config.toml").write_text(dump_toml(new_cfg.to_dict()))
    if text:
        shutil.copyfile(run_dir / "tokenizer.json", out_dir / "tokenizer.json")
    if argv is not None:
        with open(out_dir / "command.txt", "a", encoding="utf-8") as f:
            f.write(f"{PROG} " + shlex.join(argv) + "\n")
    summary = {"run": str(run_dir), "checkpoint": path.name, "step": record["step"], "mode": mode,
               "n_layers_before": cfg.model.n_layers, "n_layers": n_layers,
               "val_loss_before": before, "val_loss_after": after, "loss_jump": after - before}
    meta = {"data_position": record["data_position"], "config": new_cfg.to_dict(),
            "model_config": new_cfg.model.to_dict(), "grown_from": summary}     # no health record: it starts afresh
    written = save_checkpoint(out_dir / "checkpoints", record["step"], grown, state, meta, record["rng"],
                              new_cfg.train.keep_last)
    return {**summary, "out": str(out_dir), "new_checkpoint": str(written)}


def _int(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:                 # int() of a non-integer
        raise UserError(f"{flag} must be an integer, got {text!r}") from None


def grow_main(argv: Sequence[str]) -> int:
    """``sigprop grow --run RUN --to N [--every J | --at top] --mode identity|copy|dslm --out NEWRUN``."""
    p = Parser(prog=PROG, description="Make a trained run deeper: a new run folder that "
                "`sigprop train --config NEWRUN/config.toml --resume` continues (docs/grow.md).")
    p.add_argument("--run", required=True, help="run folder (train.out_dir of a training); its newest checkpoint grows")
    p.add_argument("--to", required=True, metavar="N", help="blocks after growth (more than the run has)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--every", metavar="J", help="insert new blocks after every J-th existing block")
    where.add_argument("--at", metavar="top", help="append the new blocks on top (the default)")
    p.add_argument("--mode", required=True, metavar="|".join(MODES), help="identity: zeroed output projections "
                   "(function unchanged); copy: duplicated blocks; dslm: DSLM init of the new depth")
    p.add_argument("--out", required=True, metavar="NEWRUN", help="the new run folder (must be new or empty)")
    try:
        args = p.parse_args(list(argv))
        summary = grow_run(args.run, args.out, _int("--to", args.to), args.mode, _int("--every", args.every),
                           args.at, list(argv))
    except USER_ERRORS as e:
        return fail(PROG, e)
    print(json.dumps(summary))
    print(f"{PROG}: {summary['n_layers_before']} -> {summary['n_layers']} blocks ({summary['mode']}) at step "
          f"{summary['step']}; validation loss {summary['val_loss_before']:.4f} -> {summary['val_loss_after']:.4f} "
          f"(jump {summary['loss_jump']:+.4g}); continue with: sigprop train --config "
          f"{shlex.quote(str(Path(summary['out']) / 'config.toml'))} --resume", file=sys.stderr)
    return EXIT_OK
