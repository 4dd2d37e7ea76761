"""Which servesim the tests import: the checkout's modules (pure Python), or with `--installed` the
installed build, compiled where `pip install .` compiled it (setup.py); and `--oracle`, the tests
that hold the engine to the oracle bit for bit.

`python -m pytest` puts the checkout first on the import path, so by default the tests run the
checkout's pure modules. With `--installed` the servesim packages are imported from the
installation instead (their modules are the checkout's, checked file by file, so a stale install
stops the run rather than testing old code); the tests themselves, the benchmarks and the
reference data still come from the checkout. The README's test command runs the whole suite with
`--installed`, then again on the checkout (tests/README.md); `--oracle` alone is a quick check of
the engine.
Commands the tests start in a subprocess import what their working directory and path give them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "policies", "workloads", "calibration")
ORACLE_TESTS = ("test_engines.py", "test_fleet.py", "test_prefix_cache.py", "test_sessions.py",
                "test_disaggregation.py", "test_policies.py", "test_policy_registry.py", "test_one_engine.py")
"""The engine against the oracle, the block-by-block prefix cache and hand-computed cases, table for table."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--installed", action="store_true",
                     help="import servesim from its installation (the compiled build where it was compiled), "
                          "not from the checkout")
    parser.addoption("--oracle", action="store_true",
                     help=f"only the engine's bit-for-bit tests ({', '.join(ORACLE_TESTS)})")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("--oracle") and collection_path.suffix == ".py" and collection_path.parent == ROOT / "tests":
        return collection_path.name not in ORACLE_TESTS or None
    return None


def installed_location(package: str) -> Path | None:
    """Where the installation holds `package` (None: not installed there, or an editable install)."""
    paths = sorted({sysconfig.get_paths()["platlib"], sysconfig.get_paths()["purelib"]})
    spec = importlib.machinery.PathFinder.find_spec(package, paths)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def stale_files(installed: Path, package: str) -> list[str]:
    """The checkout's modules of `package` that the installation lacks or holds different."""
    return [str(source.relative_to(ROOT)) for source in sorted((ROOT / package).rglob("*.py"))
            if "__pycache__" not in source.parts
            and not ((copy := installed / source.relative_to(ROOT / package)).is_file()
                     and copy.read_bytes() == source.read_bytes())]


def import_installed() -> None:
    """Import the servesim packages from the installation (see the module docstring)."""
    for package in PACKAGES:
        if package in sys.modules:
            raise pytest.UsageError(f"{package} was imported before the tests chose where from")
        location = installed_location(package)
        if location is None or location == ROOT / package:
            continue  # an editable install: the checkout is the installation
        stale = stale_files(location, package)
        if stale:
            more = " ..." if len(stale) > 3 else ""
            raise pytest.UsageError(f"the installed servesim ({location.parent}) differs from the checkout in "
                                    f"{', '.join(stale[:3])}{more}: run `pip install .` again")
        spec = importlib.util.spec_from_file_location(package, location / "__init__.py",
                                                      submodule_search_locations=[str(location)])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--installed"):
        import_installed()


def pytest_report_header(config: pytest.Config) -> str:
    from simulator.engine.build import build_line

    where = Path(sys.modules["simulator"].__file__ or "").parent.parent
    return f"servesim from {'the checkout' if where == ROOT else where}, engine: {build_line()}"
