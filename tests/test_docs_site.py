"""The documentation site's reference stays whole: every package with an `__all__` has its API page
(docs/api/), every exported name reaches that page with a docstring, and the Getting started page's
`[model]`-only config is the run config's model. `mkdocs build --strict` (CI) renders the pages; these checks
need no mkdocs."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import tomllib
from pathlib import Path

import pytest

import sigprop

ROOT = Path(__file__).resolve().parents[1]


def public_packages() -> list[str]:
    """sigprop, its packages and its top-level modules, those with an `__all__`."""
    names = ["sigprop"] + [m.name for m in pkgutil.walk_packages(sigprop.__path__, "sigprop.") if m.ispkg]
    here = Path(sigprop.__file__).parent
    names += [f"sigprop.{m.name}" for m in pkgutil.iter_modules(sigprop.__path__)    # not importing __main__
              if not m.ispkg and "\n__all__ = " in (here / f"{m.name}.py").read_text(encoding="utf8")]
    return [n for n in names if hasattr(importlib.import_module(n), "__all__")]


def page(package: str) -> Path:
    return ROOT / "docs" / "api" / f"{package.removeprefix('sigprop.').replace('.', '_')}.md"


def documented_constants(package: str) -> set[str]:
    """Names assigned at module level in ``package``'s files and followed by a string (an attribute docstring,
    which the API page renders) or commented on their line."""
    found = set()
    module = importlib.import_module(package)
    files = Path(module.__file__).parent.glob("*.py") if hasattr(module, "__path__") else [Path(module.__file__)]
    for path in files:
        source = path.read_text(encoding="utf8")
        lines, body = source.splitlines(), ast.parse(source).body
        for stmt, nxt in zip(body, body[1:] + [None]):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
                if isinstance(stmt, ast.AnnAssign) else []
            docstring = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                and isinstance(nxt.value.value, str)
            if docstring or "  # " in lines[stmt.end_lineno - 1]:
                found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return found


def test_packages_are_found() -> None:
    """The discovery below can fail: it finds the packages and modules the README names."""
    expected = {"sigprop", "sigprop.models", "sigprop.nn", "sigprop.theory.moments", "sigprop.hf", "sigprop.records"}
    assert expected <= set(public_packages())


@pytest.mark.parametrize("package", public_packages())
def test_api_page_renders_every_export(package: str) -> None:
    """The page renders the package (``::: package``), and each exported name that a submodule of the same
    name shadows (``sigprop.hf.apply``, the module and the function) by its full path, as the handler would
    otherwise render the module."""
    text = page(package).read_text(encoding="utf8")
    assert f"::: {package}\n" in text
    module = importlib.import_module(package)
    submodules = {m.name for m in pkgutil.iter_modules(getattr(module, "__path__", []))}
    for name in set(module.__all__) & submodules:
        assert f"::: {package}.{name}.{name}\n" in text, name


@pytest.mark.parametrize("package", public_packages())
def test_every_export_has_a_docstring(package: str) -> None:
    module = importlib.import_module(package)
    attributes = documented_constants(package)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj):      # a dataclass without a docstring gets its signature as one
            doc = vars(obj).get("__doc__") or ""
            documented = bool(doc) and not doc.startswith(f"{obj.__name__}(")
        elif callable(obj):
            documented = bool(obj.__doc__)
        else:
            documented = name in attributes or name == "__version__"
        if not documented:
            missing.append(name)
    assert not missing


def test_getting_started_diagnose_config_is_the_run_model() -> None:
    read = lambda p: tomllib.loads((ROOT / p).read_text(encoding="utf8"))["model"]
    assert read("configs/diagnose/tiny_decoder.toml") == read("configs/tiny_decoder.toml")
