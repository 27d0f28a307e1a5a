"""``sigprop sweep``: the command line of `sigprop.train.sweep`, with ``--around-advice`` (each group's lr grid
centred on the lr `sigprop.advice.advise` recommends for it)."""
from __future__ import annotations

import shlex
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from .console import EXIT_FAILED, EXIT_INVALID, EXIT_OK, USER_ERRORS, Parser, add_progress_flag, exit_code, fail
from .train.config import RunConfig
from .train.sweep import SweepSpec, load_spec, logged_records, run_sweep
from .train.sweep_report import write_report


def advised_centre(cfg: RunConfig) -> tuple[float, dict[str, Any]]:
    """A group's centre for ``--around-advice``: advise's recommended lr for ``cfg``, with its interval, its
    largest stable lr, the limit that decides it and its cost."""
    from .advice import advise

    a = advise(cfg)
    return a.recommended_lr, {"lr_interval": list(a.lr_interval), "max_stable_lr": a.max_stable_lr,
                              "decided_by": a.decided_by, "cost_s": round(a.cost_s, 3)}


def _write_report(spec: SweepSpec, records: list[dict[str, Any]], rebuild: str) -> int:
    """Write the report; on failure say that the points are kept and how to rebuild (exit 2 for an OSError, such
    as a full disk, else 1 after the traceback: a failing report is a bug)."""
    try:
        summary = write_report(records, spec.size, spec.out_dir)
    except Exception as e:
        if not isinstance(e, OSError):
            traceback.print_exc()
        print(f"sigprop sweep: error: the report failed ({type(e).__name__}: {' '.join(str(e).split())}); the "
              f"{len(records)} finished points are kept in {spec.out_dir / 'sweep.jsonl'}; rebuild the report with: "
              f"{rebuild}", file=sys.stderr)
        return EXIT_INVALID if isinstance(e, OSError) else EXIT_FAILED
    print(summary["table"])
    return EXIT_OK


def sweep_main(argv: Sequence[str]) -> int:
    """``sigprop sweep --config FILE [--jobs N] [--resume | --report-only] [--out DIR] [--around-advice]``: run,
    then write plots and the summary; ``--report-only`` writes them from ``sweep.jsonl`` without running a point."""
    p = Parser(prog="sigprop sweep", description="Train a grid of run configs (see configs/sweep/).")
    p.add_argument("--config", required=True, help="TOML file with a [sweep] table")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (1 = in this process)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="skip the points already in sweep.jsonl")
    mode.add_argument("--report-only", action="store_true",
                      help="run nothing: rebuild the plots and summary from the points in sweep.jsonl")
    p.add_argument("--out", default=None, help="output folder (overrides sweep.out_dir)")
    p.add_argument("--around-advice", action="store_true",
                   help="centre each group's lr grid (the grid's optim.lr values as its shape) on the lr that "
                        "sigprop advise recommends for it (as sweep.around_advice = true)")
    add_progress_flag(p)
    try:
        args = p.parse_args(list(argv))
        extra = [*(["--out", args.out] if args.out else []), *(["--around-advice"] if args.around_advice else [])]
        rebuild = shlex.join(["sigprop", "sweep", "--config", args.config, *extra, "--report-only"])
        spec = load_spec(args.config, args.out, args.around_advice)
        if args.report_only:
            records, total = logged_records(spec)
        else:
            records = run_sweep(spec, args.jobs, args.resume, args.progress, centre=advised_centre)
            total = len(records)
    except USER_ERRORS as e:
        return fail("sigprop sweep", e)
    except KeyboardInterrupt as e:
        print("sigprop sweep: interrupted; finished points are in sweep.jsonl, rerun with --resume", file=sys.stderr)
        return exit_code(e)
    code = _write_report(spec, records, rebuild)
    if code == EXIT_OK:
        unfinished = f" ({total - len(records)} not finished: --resume runs them)" if total > len(records) else ""
        print(f"sigprop sweep: {len(records)} points{unfinished}, results in {spec.out_dir}")
    return code
