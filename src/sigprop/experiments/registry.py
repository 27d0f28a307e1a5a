"""Every ``sigprop reproduce NAME``, in one table: NAME → "module:attribute" under `sigprop.experiments`.

The attribute is a `sigprop.experiments.claim.Claim` (a training claim: run by `run_claim`, judged from
its summary, collected into RESULTS.md) or a `Figures` runner (a paper's figures: no verdict). Both carry
``full`` and ``quick`` sizes; ``--set key=value`` overrides one key (`parse_sets`). This module imports
nothing heavy, so the command line can list the names without loading torch's models or matplotlib.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..console import UserError, parse_value

EXPERIMENTS = {
    "dslm-moments": "dslm_moments:FIGURES",
    "fig1": "shaped_figs:FIG1",
    "fig2": "shaped_figs:FIG2",
    "fig4": "shaped_figs:FIG4",
    "fig5": "shaped_figs:FIG5",
    "shaped-vs-preln": "shaped_vs_preln:CLAIM",
    "entropy-collapse": "entropy_collapse:CLAIM",
    "dslm-depth": "dslm_depth:CLAIM",
    "dslm-postln-horizon": "postln_horizon:CLAIM",
    "deep-thin": "deep_thin:CLAIM",
    "depth-transfer": "depth_transfer:CLAIM",
    "growth": "growth:CLAIM",
}


@dataclass(frozen=True)
class Figures:
    """A figure runner: ``run(out_dir, sizes, show_progress) -> summary`` at ``full`` or ``quick`` sizes."""

    name: str
    full: Mapping[str, Any]
    quick: Mapping[str, Any]
    run: Callable[[Path, Mapping[str, Any], bool], dict[str, Any]]


def entry(name: str) -> Any:
    """The `Claim` or `Figures` registered as ``name``; ValueError naming the valid names."""
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {name!r}; valid: {', '.join(EXPERIMENTS)}")
    module, attribute = EXPERIMENTS[name].split(":")
    return getattr(importlib.import_module(f"sigprop.experiments.{module}"), attribute)


def is_claim(name: str) -> bool:
    """Whether ``name`` is a training claim (has a verdict rule)."""
    return EXPERIMENTS[name].endswith(":CLAIM")


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``["steps=100", "seeds=[0, 1]"]`` → {"steps": 100, "seeds": [0, 1]} (values as TOML literals,
    `sigprop.console.parse_value`); UserError for an item without ``=``."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r} must look like key=value, e.g. --set steps=100")
        out[key.strip()] = parse_value(text.strip())
    return out


def reproduce(name: str, out: str | Path, quick: bool = False, sets: Sequence[str] = (),
              show_progress: bool = True) -> dict[str, Any]:
    """Run experiment ``name`` into ``out`` at its full (or ``quick``) sizes with ``sets`` laid over them;
    returns its summary."""
    from ..console.overrides import resolve_sizes
    from .claim import run_claim

    e, sizes = entry(name), parse_sets(sets)
    if is_claim(name):
        return run_claim(e, out, quick, sizes, show_progress)
    return e.run(Path(out), resolve_sizes(e.quick if quick else e.full, sizes), show_progress)
