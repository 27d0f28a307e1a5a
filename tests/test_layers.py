"""The layers of the house: no module of sigprop imports from a layer above its own.

Every ``import`` and ``from ... import`` statement of every module under ``src/sigprop`` is read with `ast`,
those inside functions included (a lazy import is still a dependency). The order, lowest first, derived from what
each package needs:

  console → fields, extras, table, records → theory → nn → schemes → models, hf (the family adapters) →
  diagnostics, simulate → train → the hf facade → advice → experiments → demo → cli, sweep_command, __main__, sigprop

``theory`` is pure maths; ``schemes`` read modules and maps but never build a model; ``models`` holds the adapter
interface, sigprop's own models and, with ``hf``'s family files, every model family. The ``sigprop.hf`` package's
facade (its ``__init__``, `diagnose` and `param_groups`) re-exports the tools for `transformers` models and so sits
above ``train``; a module is placed by its dotted name.
"""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = (
    ("console",),
    ("fields", "extras", "table", "records"),
    ("theory",),
    ("nn",),
    ("schemes",),
    ("models", "hf"),
    ("diagnostics", "simulate"),
    ("train",),
    ("hf facade",),
    ("advice",),
    ("experiments",),
    ("demo",),
    ("cli", "sweep_command", "__main__", "sigprop"),
)
FACADE = {"sigprop.hf", "sigprop.hf.diagnose", "sigprop.hf.optim"}
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "sigprop").rglob("*.py"))}


def layer(module: str) -> str:
    """The layer of a sigprop module (or package) by its dotted name."""
    if module in FACADE:
        return "hf facade"
    parts = module.split(".")
    return "sigprop" if len(parts) == 1 else parts[1]


def imported(module: str, path: Path) -> set[str]:
    """The sigprop modules ``module`` imports anywhere in its body: a ``from X import name`` that names a
    submodule counts as that submodule."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "sigprop"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "sigprop":
                continue
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target)
    return found


def test_every_package_has_a_layer():
    assert {layer(m) for m in MODULES} <= set(RANK), {layer(m) for m in MODULES} - set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_from_a_higher_layer(module):
    own = RANK[layer(module)]
    upward = sorted(t for t in imported(module, MODULES[module]) if RANK[layer(t)] > own)
    assert not upward, f"{module} ({layer(module)}) imports from higher layers: {upward}"


def test_the_check_sees_lazy_imports():
    """A function-level import is read: ``sigprop.models.adapter`` finds the HF families inside `adapter_of`."""
    assert "sigprop.hf.apply" in imported("sigprop.models.adapter", MODULES["sigprop.models.adapter"])
