"""Config input of every command: TOML files and ``--set section.key=value`` overrides.

A value is a TOML literal (``1e-3``, ``true``, ``[1, 2]``, ``"x"``) or else the bare string; a key is
``section.key``. Overrides apply to raw nested tables before the config is validated, so an unknown key or a
wrong type is refused by the config's own checker, the same way for a file and for the command line.
"""
from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import UserError


def add_set_option(parser: argparse.ArgumentParser, example: str = "optim.lr=3e-4") -> None:
    """Add the repeatable ``--set SECTION.KEY=VALUE`` (``args.set``, a list of strings)."""
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=f"override a config value (repeatable), e.g. --set {example}")


def read_toml(path: str | Path) -> dict[str, Any]:
    """The tables of the TOML file ``path``; UserError naming the file if it is not valid TOML (OSError if it
    cannot be read)."""
    with open(path, "rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{path} is not valid TOML: {e}") from e


def parse_value(text: str) -> Any:
    """A TOML literal (``1e-3``, ``true``, ``[1, 2]``, ``"x"``) or else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def split_key(key: str, what: str = "override") -> tuple[str, str]:
    """``"section.key"`` -> (section, key); UserError naming ``what`` for any other shape."""
    section, sep, name = key.strip().partition(".")
    if not sep or not section or not name or "." in name:
        raise UserError(f"{what} {key!r} must look like section.key (e.g. optim.lr)")
    return section, name


def set_dotted(tables: dict[str, Any], key: str, value: Any, what: str = "override") -> None:
    """Set ``tables[section][name] = value`` in place (the section created if missing)."""
    section, name = split_key(key, what)
    table = tables.setdefault(section, {})
    if not isinstance(table, dict):
        raise UserError(f"{what} {key!r}: {section!r} is not a table")
    table[name] = value


def apply_sets(raw: Mapping[str, Any], items: Sequence[str]) -> dict[str, Any]:
    """A copy of the nested tables ``raw`` with every ``section.key=value`` of ``items`` set."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise UserError(f"override {item!r} must look like section.key=value, e.g. optim.lr=1e-3")
        set_dotted(out, key, parse_value(text.strip()), f"override {item!r}: key")
    return out


def resolve_sizes(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """An experiment's sizes: ``base`` (its FULL or QUICK table) with ``overrides`` laid over it; an override
    that names no key of ``base`` raises UserError listing the valid ones."""
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise UserError(f"unknown size(s) {unknown}; valid: {sorted(base)}")
    return {**base, **overrides}
