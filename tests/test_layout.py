"""The layout holds: imports point down the layers, no import circle (function-local and type-checking
imports count), no module over ~400 lines, at most ~12 modules directly in `simulator/`, and each
package says in its docstring what it owns."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "policies", "workloads", "calibration")
MAX_MODULE_LINES = 400
MAX_TOP_MODULES = 12

LAYERS: tuple[tuple[str, ...], ...] = (
    ("simulator.errors", "simulator.progress", "simulator.ranges"),
    ("workloads",),
    ("simulator.deploy",),
    ("simulator.cost",),
    ("simulator.engine",),
    ("simulator.fleet",),
    ("policies",),
    ("simulator.config",),
    ("simulator.run",),
    ("simulator.metrics",),
    ("simulator.outputs",),
    ("simulator.sim2real", "simulator.sweep"),
    ("simulator.plan",),
    ("simulator.report",),
    ("simulator.cli", "calibration"),
)
"""Bottom to top: a module may import its own layer and the layers below it, never one above."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """Every project module `path` imports, wherever the import stands (a function body and an
    `if TYPE_CHECKING:` block included), resolved to the modules that exist."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` imports the module; `from module import name` the module.
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


GRAPH = {name: imports(path) - {name} for name, path in MODULES.items()}


def layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise LookupError(module)


def test_no_import_circle() -> None:
    try:
        tuple(graphlib.TopologicalSorter(GRAPH).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_a_circle_is_found_when_there_is_one() -> None:
    """The check above can fail: two modules importing each other are reported."""
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter({**GRAPH, "simulator.errors": {"simulator.config"}}).static_order())


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        if name != "simulator":
            layer(name)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module: str) -> None:
    if module == "simulator":
        return
    upward = sorted(name for name in GRAPH[module] if name != "simulator" and layer(name) > layer(module))
    assert upward == [], f"{module} (layer {layer(module)}) imports a layer above it: {upward}"


@pytest.mark.parametrize("path", sorted(MODULES.values()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


def test_few_modules_directly_in_simulator() -> None:
    top = sorted(p.name for p in (ROOT / "simulator").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


@pytest.mark.parametrize("package", sorted(name for name, path in MODULES.items() if path.name == "__init__.py"))
def test_each_package_says_what_it_owns(package: str) -> None:
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text()))
    assert docstring and len(docstring.split()) >= 10, f"{package} has no docstring saying what it owns"
