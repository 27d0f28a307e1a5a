"""The ``sigprop`` command: a thin dispatcher; each subcommand lives with the code it runs, imported when it runs
(``sigprop --help`` imports no torch)."""
from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import warnings
from pathlib import Path

from .console import EXIT_OK, USER_ERRORS, Parser, UserError, add_progress_flag, fail, one_line
from .console.stopping import exit_code, restated, stop_on_signals

# subcommands that own their argument parsing: name -> (module, function(argv) -> exit code, help)
DELEGATED = {
    "train": ("sigprop.train.commands", "train_main", "train a model: --config FILE [--set key=value ...]"),
    "eval": ("sigprop.train.commands", "eval_main", "evaluate a run's checkpoint"),
    "generate": ("sigprop.train.commands", "generate_main", "sample text from a decoder run"),
    "predict": ("sigprop.diagnostics.commands", "predict_main", "predicted per-layer moments: --config FILE"),
    "diagnose": ("sigprop.diagnostics.commands", "diagnose_main", "measured moments with the prediction overlaid"),
    "sweep": ("sigprop.sweep_command", "sweep_main",
              "train a grid of configs: --config FILE [--jobs N] [--resume | --report-only] [--around-advice]"),
    "grow": ("sigprop.train.grow_command", "grow_main",
             "make a trained run deeper: --run RUN --to N [--every J | --at top] --mode MODE --out NEWRUN"),
    "advise": ("sigprop.advice.commands", "advise_main", "lr advice at init: --config FILE [--lrs ...] [--json P]"),
    "simulate": ("sigprop.simulate.commands", "simulate_main",
                 "covariance SDE paths or finite-network ensembles: sde|ensemble [options] -> JSON + PNG"),
    "check": ("sigprop.diagnostics.check", "check_main",
              "measure forward/gradient variance through depth at init, per scheme [--placements ...] [--qk-norm]"),
}

# `sigprop reproduce NAME`: the one registry of claims and figures (name -> "module:attribute")
from .experiments.registry import EXPERIMENTS  # noqa: E402  (a light module: names only)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sigprop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, _, text) in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)
    p = sub.add_parser("demo", help="the main job: rank collapse, DSLM moments, a training comparison -> report.html")
    p.add_argument("--out", default="runs/demo", help="output folder (report.html, demo.json, one folder per part)")
    p.add_argument("--quick", action="store_true", help="tiny smoke-size run (seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=None,
                   help="worker processes for the parts (default: 2, or 1 with --quick; 1 = in this process)")
    p.add_argument("--resume", action="store_true",
                   help="keep the parts an interrupted demo in --out finished (same size and seed) and run the rest")
    add_progress_flag(p)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("reproduce", help="run a paper claim's experiment (JSON + PNG + Markdown)")
    p.add_argument("name", choices=list(EXPERIMENTS) + ["all"])
    p.add_argument("--out", default="runs/reproduce", help="output folder (one subfolder per experiment)")
    p.add_argument("--quick", action="store_true", help="tiny smoke-size run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one of the experiment's sizes or seeds (repeatable), e.g. --set steps=100")
    p.add_argument("--docs", default=None, help="also write DOCS/RESULTS.md from every claim with results in --out "
                   "(+ figures in DOCS/img, summaries in DOCS/results/NAME.json)")
    add_progress_flag(p)
    p.set_defaults(func=cmd_reproduce)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo into ``args.out``."""
    from . import demo

    Path(args.out).mkdir(parents=True, exist_ok=True)     # an unwritable --out fails now, not after the work
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: must be at least 1")
    try:
        demo.run(args.out, quick=args.quick, seed=args.seed, show_progress=args.progress, jobs=args.jobs,
                 resume=args.resume)
    except KeyboardInterrupt as e:
        again = shlex.join(["sigprop", "demo", "--out", args.out, "--seed", str(args.seed), "--resume",
                            *(["--quick"] if args.quick else []), *(["--jobs", str(args.jobs)] if args.jobs else [])])
        raise restated(e, f"interrupted; the finished parts are kept in {Path(args.out) / demo.PARTS}; continue "
                          f"with: {again}") from None
    return EXIT_OK


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Run one experiment (or all) into ``args.out/NAME``; collect the claims' sections into RESULTS.md."""
    from .experiments.registry import reproduce
    from .experiments.results import collect

    if args.set and args.name == "all":
        raise UserError("--set needs one experiment NAME (each has its own sizes), not all")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    names = list(EXPERIMENTS) if args.name == "all" else [args.name]
    for name in names:
        out = Path(args.out) / name
        try:
            reproduce(name, out, args.quick, args.set, show_progress=args.progress)
        except KeyboardInterrupt as e:
            raise restated(e, f"interrupted in {name}; its finished training runs are kept in {out} and the same "
                              "command continues from them") from None
        print(f"{name}: wrote {out}")
    if collect(args.out, list(EXPERIMENTS), args.docs):
        print(f"results: {Path(args.out) / 'RESULTS.md'}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A user error (`sigprop.console.UserError`: a bad value, a bad command line, a missing
    optional package; or an OSError: a missing or unreadable file, an unwritable output) exits 2 with one line
    on stderr; SIGINT or SIGTERM stops the command as `sigprop.console.stopping` says (exit 130 or 143, with a
    line saying what was kept and how to continue); any other exception is a bug in sigprop and propagates with
    its traceback (exit 1). A deprecated
    name in a config file or ``--set`` (a DeprecationWarning raised inside sigprop) is shown on stderr, once."""
    warnings.filterwarnings("default", category=DeprecationWarning, module=r"sigprop(\.|$)")
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv else ""
    prog = f"sigprop {name}".rstrip()
    with stop_on_signals():
        try:
            if name in DELEGATED:
                module, function, _ = DELEGATED[name]
                return getattr(importlib.import_module(module), function)(argv[1:])
            args = build_parser().parse_args(argv)
            return args.func(args)
        except USER_ERRORS as e:
            return fail(prog, e)
        except KeyboardInterrupt as e:
            print(f"{prog}: {one_line(e) or 'interrupted'}", file=sys.stderr)
            return exit_code(e)


if __name__ == "__main__":
    sys.exit(main())
