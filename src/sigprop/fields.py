"""One checker for every typed, frozen config dataclass: types from the annotations, finiteness, ranges.

A config's ``__post_init__`` calls `check_fields(self, prefix, ranges)`: every field is checked
against its type hint (``int`` widens to ``float``; ``bool`` is never an ``int``; a float must be
finite), then against its `Range` from the table, so a field added later is covered by its
annotation alone. Every failure is a `FieldError` (a `UserError`, so a ``ValueError``) naming the field,
the value and what is allowed. This module imports only the bottom layer (`sigprop.console`), so every
layer may use it.

Renamed spellings stay accepted, with a ``DeprecationWarning`` naming the new one: a value through
`current_value`, a field through the class's ``RENAMED_KEYS`` table (`Renamed`), which `from_mapping`
(config files, ``--set``, sweep grids) and the keyword arguments of a class decorated with
`accepts_renamed_keys` apply before anything else.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Hashable, Literal, Mapping, Sequence

from .console.errors import UserError


class FieldError(UserError):
    """A config field (or key) holds a value that is not allowed; the message names it."""


@dataclass(frozen=True)
class Range:
    """The interval ``lo … hi`` with open or closed ends (``lo_open``/``hi_open``)."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    label: str = ""               # how messages say it, e.g. "a positive integer" (default: the interval)

    def __contains__(self, v: float) -> bool:
        above = v > self.lo if self.lo_open else v >= self.lo
        below = v < self.hi if self.hi_open else v <= self.hi
        return above and below

    def __str__(self) -> str:
        if self.label:
            return self.label
        lo, hi = _number(self.lo), _number(self.hi)
        if self.hi == math.inf:
            return f"{'>' if self.lo_open else '>='} {lo}"
        if self.lo == -math.inf:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"


def _number(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and float(x).is_integer() else f"{x:g}"


POSITIVE_INT = Range(1, label="a positive integer")
POSITIVE = Range(0.0, lo_open=True)          # > 0
NONNEGATIVE = Range(0.0)                     # >= 0
UNIT_OPEN = Range(0.0, 1.0, True, True)      # (0, 1)
UNIT_CLOSED = Range(0.0, 1.0)                # [0, 1]
# A scale that enters squared (a temperature τ₀ in 1/τ₀², a slope offset c in c²): |x| ≤ 2^63 keeps x² ≤ 2^126
# and |x| ≥ 2^-63 keeps x² ≥ 2^-126, inside the normal range of float32 (the dtype models train in) and so of
# float64; outside it the square overflows or vanishes (a division by zero in the theory, NaN in a forward).
SQUARABLE_POSITIVE = Range(2.0 ** -63, 2.0 ** 63, label="in [2^-63, 2^63] = [1.08e-19, 9.22e18] (its square a "
                           "normal float32)")
SQUARABLE = Range(-2.0 ** 63, 2.0 ** 63, label="in [-2^63, 2^63] = [-9.22e18, 9.22e18] (its square a finite float32)")


def invalid(name: str, value: Any, allowed: Any) -> str:
    """The one wording of a refused value: ``{name}={value!r} is invalid: {field} must be {allowed}``."""
    return f"{name}={value!r} is invalid: {name.rsplit('.', 1)[-1]} must be {allowed}"


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def check_value(value: Any, hint: Any, name: str) -> Any:
    """Return ``value`` as type ``hint`` or raise FieldError naming ``name``.

    ``int`` (any integral number but ``bool``) widens to ``float``; floats must be finite; a nested
    dataclass is built from a mapping with `from_mapping`; ``Literal``, unions, ``list``/``tuple`` as usual.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        if dataclasses.is_dataclass(value) and isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise FieldError(f"{name} must be a table of keys, got {value!r}")
        return from_mapping(hint, value, f"{name}.")
    if origin is Literal:
        if value not in args:
            raise FieldError(f"{name}={value!r} is invalid; allowed values: {list(args)}")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in args:
            try:
                return check_value(value, arg, name)
            except FieldError as e:
                errors.append(e)
        finite = [e for e in errors if "finite" in str(e)]
        raise finite[0] if finite else FieldError(
            f"{name}={value!r} has the wrong type; expected {' or '.join(_type_name(a) for a in args)}")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise FieldError(f"{name}={value!r} has the wrong type; expected a list")
        item = args[0] if args else Any
        return origin(check_value(v, item, f"{name}[{i}]") for i, v in enumerate(value))
    if hint is Any:
        return value
    if hint is type(None) and value is None:
        return None
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if hint is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise FieldError(invalid(name, value, "a finite number"))
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    if hint not in (bool, int, float, str, type(None)) and isinstance(hint, type) and isinstance(value, hint):
        return value
    raise FieldError(f"{name}={value!r} has the wrong type; expected {_type_name(hint)}")


def check_fields(obj: Any, prefix: str, ranges: Mapping[str, Range] = {},
                 int_range: Range | None = None, float_range: Range | None = None) -> None:
    """Check (and normalise, e.g. 1 → 1.0) every field of the frozen dataclass ``obj`` in place.

    ``ranges``: allowed interval per field name (None values skip it); ``int_range``/``float_range``: the
    interval of every ``int``/``float`` field without its own entry. Errors are worded by `invalid`.
    """
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        name, value = prefix + f.name, getattr(obj, f.name)
        value = check_value(value, hints[f.name], name)
        object.__setattr__(obj, f.name, value)
        allowed = ranges.get(f.name, _default_range(hints[f.name], int_range, float_range))
        if allowed is not None and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and value not in allowed:
            raise FieldError(invalid(name, value, allowed))


def _default_range(hint: Any, int_range: Range | None, float_range: Range | None) -> Range | None:
    kinds = {hint} | set(typing.get_args(hint))
    return float_range if float in kinds else int_range if int in kinds else None


def current_value(name: str, value: Any, allowed: Sequence[Any], deprecated: Mapping[Any, Any],
                  stacklevel: int = 3) -> Any:
    """``value`` if it is one of ``allowed``; the new spelling of a deprecated one (``deprecated``: old -> new),
    with a DeprecationWarning naming both; otherwise FieldError naming ``name`` and the allowed values."""
    if isinstance(value, Hashable) and value in deprecated:
        new = deprecated[value]
        warnings.warn(f"{name}={value!r} is deprecated; it is called {new!r}", DeprecationWarning,
                      stacklevel=stacklevel)
        return new
    if value not in allowed:
        raise FieldError(invalid(name, value, f"one of {tuple(allowed)}"))
    return value


@dataclass(frozen=True)
class Renamed:
    """The new name of a deprecated field, and the new spelling of each old value (``values``: old -> new, one to
    one; a value not listed passes unchanged, for the new field's own check)."""

    new: str
    values: Mapping[Any, Any] = dataclasses.field(default_factory=dict)

    def old_value(self, value: Any) -> Any:
        """The old spelling of the new field's ``value``."""
        return {v: k for k, v in self.values.items()}.get(value, value)


def renamed_keys(raw: Mapping[str, Any], renamed: Mapping[str, Renamed], prefix: str = "",
                 stacklevel: int = 3) -> dict[str, Any]:
    """A copy of ``raw`` with each deprecated key of ``renamed`` under its new name and value spelling, with a
    DeprecationWarning naming both; FieldError if ``raw`` holds a field under both names."""
    out = dict(raw)
    for old in [k for k in raw if k in renamed]:
        r = renamed[old]
        if r.new in raw:
            raise FieldError(f"{prefix}{old} and {prefix}{r.new} are one field (the first is its deprecated name); "
                             f"give only {prefix}{r.new}")
        value = out.pop(old)
        spelled = f" (values {', '.join(f'{k!r} → {v!r}' for k, v in r.values.items())})" if r.values else ""
        warnings.warn(f"{prefix}{old} is deprecated; it is called {prefix}{r.new}{spelled}", DeprecationWarning,
                      stacklevel=stacklevel)
        out[r.new] = r.values.get(value, value) if isinstance(value, Hashable) else value
    return out


def accepts_renamed_keys(cls: type) -> type:
    """Class decorator of a dataclass with a ``RENAMED_KEYS`` table (old name -> `Renamed`): its constructor takes
    each old keyword as the new field (`renamed_keys`), and reading the old attribute gives the new field's
    value in the old spelling; both warn (DeprecationWarning)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **renamed_keys(kwargs, cls.RENAMED_KEYS, f"{cls.__name__}."))

    def old_attribute(old: str, r: Renamed) -> property:
        def get(self: Any) -> Any:
            warnings.warn(f"{cls.__name__}.{old} is deprecated; read {cls.__name__}.{r.new}", DeprecationWarning,
                          stacklevel=2)
            return r.old_value(getattr(self, r.new))
        return property(get, doc=f"Deprecated: {r.new} in its old spelling.")

    cls.__init__ = __init__
    for old, r in cls.RENAMED_KEYS.items():
        setattr(cls, old, old_attribute(old, r))
    return cls


def from_mapping(cls: type, raw: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys, missing required keys and wrong types; a
    deprecated key of the class's ``RENAMED_KEYS`` is read as its new one (`renamed_keys`)."""
    raw = renamed_keys(raw, getattr(cls, "RENAMED_KEYS", {}), prefix)
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in fields]
    unknown = [k for k in raw if k not in names]
    if unknown:
        raise FieldError(f"unknown config key '{prefix}{unknown[0]}'; valid keys"
                         f"{' in ' + prefix[:-1] if prefix else ''}: {sorted(names)}")
    missing = [f.name for f in fields if f.name not in raw and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise FieldError(f"missing config key '{prefix}{missing[0]}' (it has no default)")
    return cls(**{k: check_value(v, hints[k], prefix + k) for k, v in raw.items()})
