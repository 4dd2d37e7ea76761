"""Imports point down the layers: nothing below the command line imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "policies", "workloads", "calibration")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


BELOW_CLI = sorted(str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                   if p != ROOT / "simulator" / "cli.py")


@pytest.mark.parametrize("path", BELOW_CLI)
def test_no_module_imports_the_command_line(path: str) -> None:
    assert "simulator.cli.main" not in imported_modules(ROOT / path), f"{path} imports simulator.cli.main"
