"""Entry point behind ``sigprop simulate sde`` and ``sigprop simulate ensemble``.

* ``sde``: Euler–Maruyama paths of a neural covariance SDE (`sigprop.theory.sde.simulate`; Noci et al.,
  "The Shaped Transformer", NeurIPS 2023, Thm 3.2, 4.2, Cor. 4.3; derivations in docs/sde.md).
* ``ensemble``: token covariances V_l = X_l X_lᵀ/n of random finite networks at initialization, built from
  sigprop's modules (`sigprop.simulate.networks`), one per depth l (`sigprop.simulate.ensemble.simulate`), on
  the SDE's time axis t = l / width.

``--kind attention`` (sde), ``--block attention`` and ``--method gram`` (ensemble) are deprecated names of
``shaped_attention``, ``shaped_attention`` and ``gaussian``: a warning on stderr, then the run under the new name.

Both start from m tokens with V0 = s·((1 − ρ0) I + ρ0 11ᵀ) and write, into ``--out``, NAME.json (the
resolved options, the command line and per-time quantiles of the correlation ρ¹² = V¹²/√(V¹¹V²²) and the
variance V¹¹ of the first two tokens — the tokens are exchangeable, so any pair has the same law) and
NAME.png (the median with 25–75 % and 5–95 % bands, both quantities against t). Paths or networks run in
``--chunk``-sized batches behind a progress bar; chunk i is seeded from (seed, i), so a run is
reproducible from its seed and chunk. Exit codes (`sigprop.console.errors`): 0 done, 2 bad option (one line
on stderr naming it). The command imports only the theory, the simulators and `sigprop.console`;
matplotlib is imported when the PNG is written.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..console import EXIT_OK, Parser, UserError, add_progress_flag, fail, progress
from ..theory import sde
from . import ensemble
from .networks import BLOCKS, DEPRECATED_BLOCKS, SHAPED_BLOCKS

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
DEFAULT_GAMMA = 0.3


def _integer(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    return parse


def _real(low: float, high: float = math.inf, open_low: bool = True, open_high: bool = False
          ) -> Callable[[str], float]:
    """A finite float in (low, high] (brackets as given by ``open_low`` / ``open_high``)."""
    allowed = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high or high == math.inf else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = (math.isfinite(value) and (value > low if open_low else value >= low)
              and (value < high if open_high else value <= high))
        if not ok:
            raise argparse.ArgumentTypeError(f"must be a finite number in {allowed}, got {text!r}")
        return value
    return parse


def initial_covariance(tokens: int, rho0: float, scale: float) -> torch.Tensor:
    """V0 = scale·((1 − ρ0) I + ρ0 11ᵀ), (tokens, tokens) float64; PSD iff −1/(tokens − 1) ≤ ρ0 ≤ 1."""
    eye = torch.eye(tokens, dtype=torch.float64)
    return scale * ((1 - rho0) * eye + rho0 * torch.ones_like(eye))


def chunk_seed(seed: int, index: int) -> int:
    """The seed of chunk ``index`` of a run seeded with ``seed`` (independent streams per chunk)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def path_statistics(V: torch.Tensor, times: Sequence[float]) -> dict[str, Any]:
    """Per time, over paths, the quantiles `QUANTILES` of ρ¹² and V¹¹ of V (paths, T, m, m), ignoring
    non-finite entries (overflowed networks): {"t", "corr": {q: [...]}, "var": {q: [...]}, "finite": [...]}."""
    corr = (V[..., 0, 1] / (V[..., 0, 0] * V[..., 1, 1]).sqrt()).numpy()
    var = V[..., 0, 0].numpy()
    finite = np.isfinite(corr) & np.isfinite(var)

    def q(x: np.ndarray) -> dict[str, list[float | None]]:
        x = np.where(finite, x, np.nan)
        with np.errstate(all="ignore"):
            cols = [np.nanquantile(x[:, j], QUANTILES) if finite[:, j].any() else [math.nan] * len(QUANTILES)
                    for j in range(x.shape[1])]
        return {f"q{round(100 * p):02d}": [None if not math.isfinite(c[i]) else float(c[i]) for c in cols]
                for i, p in enumerate(QUANTILES)}
    return {"t": [float(t) for t in times], "corr": q(corr), "var": q(var),
            "finite_fraction": finite.mean(0).tolist()}


def plot_paths(stats: dict[str, Any], title: str, path: Path) -> Path:
    """Two panels against t: ρ¹² and V¹¹ (log axis), median line with 25–75 % and 5–95 % bands."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.asarray(stats["t"])
    arr = lambda v: np.array([math.nan if x is None else x for x in v])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "corr", "correlation ρ¹²"), (axes[1], "var", "variance V¹¹")):
        s = stats[key]
        ax.fill_between(t, arr(s["q05"]), arr(s["q95"]), alpha=0.2, color="C0", label="5–95 %")
        ax.fill_between(t, arr(s["q25"]), arr(s["q75"]), alpha=0.35, color="C0", label="25–75 %")
        ax.plot(t, arr(s["q50"]), color="C0", label="median")
        ax.set(xlabel="t = layer / width", ylabel=label)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _chunks(total: int, size: int) -> list[int]:
    return [min(size, total - lo) for lo in range(0, total, size)]


def run_sde(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Simulate the SDE in chunks of paths; return (statistics and stopping summary, plot title)."""
    V0 = initial_covariance(args.tokens, args.rho0, args.scale)
    runs = [sde.simulate(args.kind, V0, t=args.t, steps=args.steps, paths=n, seed=chunk_seed(args.seed, i),
                         gamma=args.gamma, tau0=args.tau0, blowup=args.blowup)
            for i, n in progress(list(enumerate(_chunks(args.paths, args.chunk))), f"sde {args.kind}",
                                 enabled=args.progress)]
    V = torch.cat([r.V for r in runs])
    stopped, exploded = torch.cat([r.stopped for r in runs]), torch.cat([r.exploded for r in runs])
    stats = path_statistics(V, runs[0].times.tolist())
    stats.update(stopped_fraction=float(stopped.double().mean()), exploded_fraction=float(exploded.double().mean()))
    return stats, f"{args.kind} SDE, γ = {args.gamma:g}, τ0 = {args.tau0:g}, {args.paths} paths, {args.steps} steps"


def run_ensemble(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Simulate finite networks in chunks; return (statistics on t = layer/width, plot title)."""
    V0 = initial_covariance(args.tokens, args.rho0, args.scale)
    kw = {"gamma": args.gamma, "tau0": args.tau0} if args.block in SHAPED_BLOCKS else {}
    V = torch.cat([ensemble.simulate(args.block, V0, args.width, args.depth, n, seed=chunk_seed(args.seed, i),
                                     method=args.method, **kw)
                   for i, n in progress(list(enumerate(_chunks(args.samples, args.chunk))), f"ensemble {args.block}",
                                        enabled=args.progress)])
    stats = path_statistics(V, [layer / args.width for layer in range(args.depth + 1)])
    shaped = f", γ = {args.gamma:g}, τ0 = {args.tau0:g}" if args.block in SHAPED_BLOCKS else ""
    return stats, f"{args.block} networks, width {args.width}, depth {args.depth}{shaped}, {args.samples} networks"


def _common(p: argparse.ArgumentParser, out: str) -> None:
    p.add_argument("--tokens", type=_integer(2), default=2, help="number of tokens m (default 2)")
    p.add_argument("--rho0", type=_real(-1.0, 1.0, open_low=False), default=0.2,
                   help="initial correlation between tokens, in [-1/(m-1), 1] (default 0.2)")
    p.add_argument("--scale", type=_real(0.0), default=1.0, help="initial variance s > 0 (default 1)")
    p.add_argument("--tau0", type=_real(0.0), default=1.0, help="shaped-attention temperature scale τ0 > 0 (default 1)")
    p.add_argument("--seed", type=_integer(0), default=0)
    p.add_argument("--chunk", type=_integer(1), default=256, help="paths or networks per batch (default 256)")
    p.add_argument("--out", default=out, help=f"output folder (default {out})")
    add_progress_flag(p)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sigprop simulate", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", metavar="{sde,ensemble}", required=True)
    p = sub.add_parser("sde", help="Euler–Maruyama paths of a neural covariance SDE")
    p.add_argument("--kind", choices=sde.KINDS + tuple(sde.DEPRECATED_KINDS), default="transformer",
                   help="SDE (sigprop.theory.sde); 'attention' is the deprecated name of 'shaped_attention'")
    p.add_argument("--gamma", type=_real(0.0, 1.0), default=DEFAULT_GAMMA,
                   help=f"residual branch weight γ in (0, 1] (default {DEFAULT_GAMMA})")
    p.add_argument("--t", type=_real(0.0), default=1.0, help="time horizon t = depth / width (default 1)")
    p.add_argument("--steps", type=_integer(1), default=200, help="Euler steps on [0, t] (default 200)")
    p.add_argument("--paths", type=_integer(1), default=1000, help="number of paths (default 1000)")
    p.add_argument("--blowup", type=_real(0.0), default=1e6, help="stop a path once ‖V‖_F ≥ this (default 1e6)")
    _common(p, "runs/simulate/sde")
    p.set_defaults(command_parser=p)
    p = sub.add_parser("ensemble", help="token covariances of random finite networks at initialization")
    p.add_argument("--block", choices=BLOCKS + tuple(DEPRECATED_BLOCKS), default="shaped",
                   help="network (sigprop.simulate.networks); 'attention' is the deprecated name of 'shaped_attention'")
    p.add_argument("--width", type=_integer(1), default=64, help="width n (default 64)")
    p.add_argument("--depth", type=_integer(1), default=64, help="number of blocks (default 64)")
    p.add_argument("--samples", type=_integer(1), default=200, help="number of networks (default 200)")
    p.add_argument("--gamma", type=_real(0.0, 1.0), default=None,
                   help=f"γ in (0, 1] for the shaped blocks {', '.join(SHAPED_BLOCKS)} (default {DEFAULT_GAMMA}); "
                        "not allowed for the others")
    p.add_argument("--method", choices=ensemble.METHODS + tuple(ensemble.DEPRECATED_METHODS), default="gaussian",
                   help="weight sampler (same law): gaussian (each weight on its input's row space, fast) or weights "
                        "(full matrices); 'gram' is deprecated and runs as gaussian")
    _common(p, "runs/simulate/ensemble")
    p.set_defaults(command_parser=p)
    return parser


def _check(args: argparse.Namespace) -> None:
    """Checks that involve more than one option; each failure names the option."""
    parser = args.command_parser
    low = -1.0 / (args.tokens - 1)
    if args.rho0 < low:
        parser.error(f"argument --rho0: must be in [{low:g}, 1] for --tokens {args.tokens} "
                     f"(V0 positive semi-definite), got {args.rho0:g}")
    deprecated = ((("block", DEPRECATED_BLOCKS), ("method", ensemble.DEPRECATED_METHODS)) if args.what == "ensemble"
                  else (("kind", sde.DEPRECATED_KINDS),))
    for option, renamed in deprecated:
        old = getattr(args, option)
        if old in renamed:
            setattr(args, option, renamed[old])
            sys.stderr.write(f"{parser.prog}: warning: --{option} {old} is deprecated; it runs as --{option} "
                             f"{renamed[old]}\n")
    if args.what == "ensemble":
        if args.width < args.tokens:
            parser.error(f"argument --width: must be >= --tokens ({args.tokens}), got {args.width}")
        if args.block in SHAPED_BLOCKS:
            args.gamma = DEFAULT_GAMMA if args.gamma is None else args.gamma
        elif args.gamma is not None:
            parser.error(f"argument --gamma: only the shaped blocks ({', '.join(SHAPED_BLOCKS)}) take γ, "
                         f"not --block {args.block}")


def simulate_main(argv: Sequence[str]) -> int:
    """``sigprop simulate sde|ensemble [options]``: write NAME.json and NAME.png into ``--out``."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
        _check(args)
    except SystemExit as e:            # --help
        return int(e.code or 0)
    except UserError as e:
        return fail("sigprop simulate", e)
    stats, title = (run_sde if args.what == "sde" else run_ensemble)(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {k: v for k, v in vars(args).items() if k not in ("what", "progress", "command_parser")}
    (out / f"{args.what}.json").write_text(json.dumps(
        {"command": "sigprop simulate " + " ".join(argv), "options": options, **stats}, indent=1))
    plot_paths(stats, title, out / f"{args.what}.png")
    c, v = stats["corr"], stats["var"]
    g = lambda x: "n/a" if x is None else f"{x:.4g}"
    print(f"{title}\nat t = {stats['t'][-1]:g}: median ρ¹² {g(c['q50'][-1])} (5–95 %: {g(c['q05'][-1])} to "
          f"{g(c['q95'][-1])}), median V¹¹ {g(v['q50'][-1])}")
    print(f"wrote {out / (args.what + '.json')} and {out / (args.what + '.png')}")
    return EXIT_OK
