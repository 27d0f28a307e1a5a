"""Entry points behind ``sigprop train | eval | generate``; each takes argv and returns an exit code.

Exit codes (`sigprop.console.errors`): 0 done, 1 NaN/Inf loss, 2 bad configuration, data or checkpoint (one line
on stderr), 130 / 143 stopped by SIGINT / SIGTERM after the step it was in, with a checkpoint saved
(`sigprop.console.stopping`).
"""
from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Sequence

import torch

from ..console import EXIT_FAILED, EXIT_OK, USER_ERRORS, Parser, UserError, add_set_option, fail
from ..console.stopping import die_with_parent, exit_code, stopped_by
from .config import load_config
from .data import prepare_data
from .distributed import exit_rank, in_torchrun
from .generation import sample
from .run import load_run, train
from .sampler import generator
from .tokenizer import BPETokenizer
from .trainer import NonFiniteLossError, Trainer


def resume_command(argv: Sequence[str], checkpoint: Path, lr: float) -> str:
    """The ``sigprop train`` command line that resumes ``argv``'s run from ``checkpoint`` with learning rate
    ``lr`` (``argv``'s own --resume/--resume-from/--fresh-if-none are replaced)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume-from":
            skip = True
        elif arg not in ("--resume", "--fresh-if-none") and not arg.startswith("--resume-from="):
            kept.append(arg)
    return shlex.join(["sigprop", "train", *kept, "--set", f"optim.lr={lr:.3g}", "--resume-from", str(checkpoint)])


def train_main(argv: Sequence[str]) -> int:
    """``sigprop train --config FILE [--set k=v ...] [--resume]``; as one of several torchrun ranks the process
    gets SIGTERM when torchrun ends (it checkpoints and stops, as on torchrun's own SIGTERM) and ends here,
    with the exit status (`sigprop.train.distributed.exit_rank`)."""
    if in_torchrun():
        die_with_parent(os.getppid(), signal.SIGTERM)
    code = _train(argv)
    if in_torchrun():
        exit_rank(code)
    return code


def _train(argv: Sequence[str]) -> int:
    p = Parser(prog="sigprop train", description="Train a sigprop model.")
    p.add_argument("--config", help="TOML run config (see configs/)")
    add_set_option(p)
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in train.out_dir "
                   "(an error if there is none, unless --fresh-if-none)")
    p.add_argument("--resume-from", metavar="CHECKPOINT", help="continue from this checkpoint JSON of "
                   "train.out_dir/checkpoints (e.g. the last good one a NaN stop names); newer ones are set aside")
    p.add_argument("--fresh-if-none", action="store_true", help="with --resume: start from step 0 when "
                   "train.out_dir has no checkpoint yet")
    try:
        args = p.parse_args(list(argv))
        sets = list(args.set)
        if args.resume or args.resume_from:
            sets.append("train.resume=true")
        if args.resume_from:
            sets.append(f"train.resume_from={json.dumps(args.resume_from)}")
        if args.fresh_if_none:
            sets.append("train.fresh_if_none=true")
        if args.config is not None and not Path(args.config).is_file():
            raise UserError(f"--config {args.config}: no such file (or not a file)")
        cfg = load_config(args.config, sets)
        trainer = train(cfg, argv=list(argv))
    except NonFiniteLossError as e:
        fail("sigprop train", e, EXIT_FAILED)
        if e.checkpoint is not None:
            print("sigprop train: to continue, lower the learning rate and resume from the last good checkpoint:\n  "
                  + resume_command(argv, e.checkpoint, cfg.optim.lr / 10), file=sys.stderr)
        else:
            print("sigprop train: no checkpoint is good to resume from; lower optim.lr (or raise "
                  "optim.warmup_steps) and start again in a new train.out_dir", file=sys.stderr)
        return EXIT_FAILED
    except USER_ERRORS as e:
        return fail("sigprop train", e)
    if trainer.dist.is_main:
        done = f"stopped ({trainer.stop_reason})" if trainer.stop_reason else "finished"
        print(f"sigprop train: {done} at step {trainer.state.step}; checkpoint: {trainer.last_checkpoint}",
              file=sys.stderr)
        if trainer.stop_reason:
            print("sigprop train: continue with --resume", file=sys.stderr)
    return exit_code(stopped_by(trainer.stop_reason, "")) if trainer.stop_reason else EXIT_OK


def _run_args(p: Parser) -> None:
    p.add_argument("--run", required=True, help="run folder (train.out_dir of a training)")
    p.add_argument("--checkpoint", help="checkpoint JSON (default: the newest in RUN/checkpoints)")
    add_set_option(p)


def eval_main(argv: Sequence[str]) -> int:
    """``sigprop eval --run DIR [--checkpoint FILE] [--set k=v ...]``: validation metrics as JSON."""
    p = Parser(prog="sigprop eval", description="Evaluate a trained run on its validation split.")
    _run_args(p)
    try:
        args = p.parse_args(list(argv))
        cfg, model, path = load_run(args.run, args.checkpoint, args.set)
        if cfg.train.eval_batches < 1:
            raise UserError("train.eval_batches=0 in this run: there is no validation set to evaluate; "
                            "pass --set train.eval_batches=N (N >= 1)")
        data = prepare_data(cfg, path.parent.parent, save_tokenizer=False)
        metrics = Trainer(cfg, model, data, path.parent.parent).evaluate()
    except USER_ERRORS as e:
        return fail("sigprop eval", e)
    print(json.dumps({"checkpoint": str(path), **metrics}))
    return EXIT_OK


def generate_main(argv: Sequence[str]) -> int:
    """``sigprop generate --run DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]``."""
    p = Parser(prog="sigprop generate", description="Sample text from a trained decoder.")
    _run_args(p)
    p.add_argument("--prompt", default="", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50, help="0 = all tokens")
    p.add_argument("--seed", type=int, default=0)
    try:
        args = p.parse_args(list(argv))
        if args.max_new_tokens < 0 or args.top_k < 0 or not (math.isfinite(args.temperature) and args.temperature >= 0):
            raise UserError(f"--max-new-tokens ({args.max_new_tokens}) and --top-k ({args.top_k}) must be "
                            f"integers >= 0 and --temperature ({args.temperature}) a finite number >= 0")
        cfg, model, _ = load_run(args.run, args.checkpoint, args.set)
        if cfg.model.arch != "decoder":
            raise UserError(f"generate needs model.arch='decoder', this run has {cfg.model.arch!r}")
        if not Path(cfg.data.tokenizer).is_file():
            raise UserError(f"run {args.run} has no tokenizer.json (data.tokenizer={cfg.data.tokenizer!r}); "
                            "generate needs the run's tokenizer")
        tok = BPETokenizer.load(cfg.data.tokenizer)
        ids = torch.tensor([[tok.eos_id] + tok.encode(args.prompt)])
        out = sample(model, ids, args.max_new_tokens, cfg.model.max_seq_len, args.temperature,
                     args.top_k, generator(args.seed))
    except USER_ERRORS as e:
        return fail("sigprop generate", e)
    print(tok.decode(out[0, 1:].tolist()))
    return EXIT_OK
