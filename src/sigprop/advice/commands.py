"""``sigprop advise``: the init report and lr advice of a run config, or the LR range test on it."""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from ..console import EXIT_OK, USER_ERRORS, Parser, UserError, add_progress_flag, add_set_option, fail
from ..train.config import load_config

PROG = "sigprop advise"


def advise_main(argv: Sequence[str]) -> int:
    """``sigprop advise --config RUN.toml [--set k=v ...] [--lrs LR ...] [--budget B] [--method M] [--out DIR]
    [--json PATH] [--range-test]``: with a budget (default 0.5 of one training run), successive halving on the run
    itself over a bracket centred on the rule's lr at init (`sigprop.advice.halving`; ``--method proxy``: a small
    proxy trained over a short lr grid, `sigprop.advice.proxy`), its cost stated before it runs; ``--budget 0``: the
    report and rule at init alone (a few forward/backward passes, no training)."""
    p = Parser(prog=PROG, description="The learning rate to use: the run itself trained briefly at a bracket of lrs "
               "around the rule's lr at init, the best kept going (successive halving; the survivor is the training "
               "run, to continue); --method proxy: a small proxy trained over a short lr grid, its optimum carried "
               "to the run by the ratio of their first-step lr scales; with --budget 0, the signal-propagation "
               "report and rule at init alone (no training).")
    p.add_argument("--config", required=True, help="run config (TOML), as for sigprop train")
    add_set_option(p)
    p.add_argument("--lrs", type=float, nargs="+", default=None, help="peak lrs to predict (default: optim.lr)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the advice as JSON")
    p.add_argument("--range-test", action="store_true",
                   help="run the LR range test instead (one short run with an exponential lr ramp)")
    p.add_argument("--steps", type=int, default=None, help="range test: ramp steps (default train.steps)")
    p.add_argument("--budget", type=float, default=0.5, help="compute spent choosing, as a fraction of one training "
                   "run of the config (default 0.5; halving: besides the run it leaves); 0: the rule at init alone, "
                   "no training")
    p.add_argument("--method", choices=("halving", "proxy"), default="halving",
                   help="with a budget: successive halving on the run itself (default) or a small proxy")
    p.add_argument("--out", default=None, help="folder of the arms' or the proxy's runs (a rerun reuses them; "
                   "default runs/advise-halving or runs/advise-proxy)")
    add_progress_flag(p)
    try:
        args = p.parse_args(list(argv))
        cfg = load_config(args.config, args.set)
        if args.range_test:
            return _range_test(cfg, args)
        if args.budget < 0:
            raise UserError(f"--budget {args.budget}: must be 0 (no training) or a positive fraction of one run")
        if args.budget > 0:
            return _halving(cfg, args) if args.method == "halving" else _proxy(cfg, args)
        from .advise import advise, write_json

        advice = advise(cfg, lrs=args.lrs)
    except (*USER_ERRORS, NotImplementedError) as e:     # NotImplementedError: a model advise cannot judge
        return fail(PROG, e)
    print(advice.table())
    if args.json:
        write_json(advice, args.json)
    return EXIT_OK


def _halving(cfg, args: argparse.Namespace) -> int:
    """Successive halving's schedule and cost first, then its rungs, the survivor and what it says of the run."""
    from .halving import advise_by_halving, schedule_for

    s = schedule_for(args.budget)
    print(f"successive halving: {s}; at most {s.extra:.2g} of one training run besides the run it leaves, "
          f"{cfg.train.steps} steps each", flush=True)
    a = advise_by_halving(cfg, args.budget, lrs=args.lrs, out=args.out or "runs/advise-halving",
                          progress=args.progress)
    print(a.table())
    if args.json:
        Path(args.json).write_text(json.dumps(a.to_json(), indent=2) + "\n")
    return EXIT_OK


def _proxy(cfg, args: argparse.Namespace) -> int:
    """The proxy's advice: its plan and cost first, then its grid and what it says of the run."""
    from .proxy import advise_by_proxy, plan

    print(f"{plan(cfg, args.budget).text(cfg)}", flush=True)
    a = advise_by_proxy(cfg, args.budget, lrs=args.lrs, out=args.out or "runs/advise-proxy", progress=args.progress)
    print(a.table(plan=False))
    if args.json:
        Path(args.json).write_text(json.dumps(a.to_json(), indent=2) + "\n")
    return EXIT_OK


def _range_test(cfg, args: argparse.Namespace) -> int:
    """``--range-test``: the LR range test's picks on the terminal (and ``--json``)."""
    from .range_test import run_range_test

    t = run_range_test(cfg, steps=args.steps)
    print(f"LR range test: {len(t.lrs)} steps, lr {t.lrs[0]:.3g} .. {t.lrs[-1]:.3g}")
    print(f"  steepest descent  {t.steepest:.3g}\n  min loss / 10     {t.min_over_10:.3g}\n"
          f"cost: {t.cost_s:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"steepest": t.steepest, "min_over_10": t.min_over_10,
                                               "lrs": t.lrs, "smoothed": t.smoothed, "cost_s": t.cost_s},
                                              indent=2) + "\n")
    return EXIT_OK
