"""``sigprop advise``: the init report and lr advice of a run config, or the LR range test on it."""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from ..console import EXIT_OK, USER_ERRORS, Parser, add_set_option, fail
from ..train.config import load_config

PROG = "sigprop advise"


def advise_main(argv: Sequence[str]) -> int:
    """``sigprop advise --config RUN.toml [--set k=v ...] [--lrs LR ...] [--json PATH] [--range-test]``."""
    p = Parser(prog=PROG, description="Signal propagation at init and the learning rate to use, from a few "
               "forward/backward passes on the run's data (no training).")
    p.add_argument("--config", required=True, help="run config (TOML), as for sigprop train")
    add_set_option(p)
    p.add_argument("--lrs", type=float, nargs="+", default=None, help="peak lrs to predict (default: optim.lr)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the advice as JSON")
    p.add_argument("--range-test", action="store_true",
                   help="run the LR range test instead (one short run with an exponential lr ramp)")
    p.add_argument("--steps", type=int, default=None, help="range test: ramp steps (default train.steps)")
    try:
        args = p.parse_args(list(argv))
        cfg = load_config(args.config, args.set)
        if args.range_test:
            return _range_test(cfg, args)
        from .advise import advise, write_json

        advice = advise(cfg, lrs=args.lrs)
    except (*USER_ERRORS, NotImplementedError) as e:     # NotImplementedError: a model advise cannot judge
        return fail(PROG, e)
    print(advice.table())
    if args.json:
        write_json(advice, args.json)
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
