"""The compiled build (setup.py): what it installs where it cannot compile, the line that names it,
and the same tables as the pure modules, digest for digest (benchmarks/table_digests.py)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from setuptools import Distribution, Extension

from simulator.cli.main import run as simulate_cli
from simulator.engine import decoders
from simulator.engine.build import build_line

ROOT = Path(__file__).resolve().parents[1]


def load_setup() -> Any:
    spec = importlib.util.spec_from_file_location("servesim_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_ext(tmp_path: Path, **options: object) -> Any:
    """setup.py's build_ext, ready to build one tiny C extension into `tmp_path`."""
    source = tmp_path / "tiny.c"
    source.write_text("#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"tiny\"};\n"
                      "PyMODINIT_FUNC PyInit_tiny(void) { return PyModule_Create(&m); }\n")
    distribution = Distribution({"name": "tiny", "ext_modules": [Extension("tiny", [str(source)])]})
    command = load_setup().OptionalBuildExt(distribution)
    command.initialize_options()
    command.build_lib, command.build_temp = str(tmp_path / "lib"), str(tmp_path / "temp")
    for name, value in options.items():
        setattr(command, name, value)
    command.finalize_options()
    return command


def test_without_a_working_compiler_the_install_goes_on_pure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    command = build_ext(tmp_path)
    command.run()
    assert not list((tmp_path / "lib").rglob("*.so")) and command.get_outputs() == []
    assert "installing pure Python" in capfd.readouterr().err


def test_with_a_compiler_the_extension_is_built(tmp_path: Path) -> None:
    """The same command as above, with the machine's compiler: the fallback is not taken."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here: the install is pure Python (the test above)")
    command = build_ext(tmp_path)
    command.run()
    assert [path.name.split(".")[0] for path in (tmp_path / "lib").rglob("*.so")] == ["tiny"]


def test_an_editable_install_and_servesim_pure_compile_nothing(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    command = build_ext(tmp_path, editable_mode=True)
    command.run()
    assert not (tmp_path / "lib").exists() and not (tmp_path / "temp").exists()
    monkeypatch.setattr(sys, "argv", ["setup.py", "bdist_wheel"])
    monkeypatch.setenv("SERVESIM_PURE", "1")
    assert load_setup().ext_modules() == []


def test_version_and_summary_name_the_build_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Compiled functions are not Python functions: that tells the build apart independently of
    `simulator.engine.build`."""
    compiled = not inspect.isfunction(decoders.Decoders.join)
    assert ("compiled" in build_line()) is compiled
    with pytest.raises(SystemExit) as stop:
        simulate_cli(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip().endswith(f"engine: {build_line()}")
    out = tmp_path / "run"
    simulate_cli(["--num-requests", "20", "--out", str(out), "--quiet"], exit=lambda code: None)
    assert json.loads((out / "summary.json").read_text())["provenance"] == {"engine_build": build_line()}


def installed_build(cwd: Path) -> str:
    """The build line of the servesim a fresh process imports outside the checkout."""
    command = [sys.executable, "-c", "from simulator.engine.build import build_line; print(build_line())"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def table_digests(cwd: Path, pythonpath: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "table_digests.py")], cwd=cwd, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout


def test_the_compiled_and_the_pure_build_give_identical_tables(tmp_path: Path) -> None:
    """benchmarks/table_digests.py's 14 varied runs and the compare rerun, each run's tables as digests:
    the installed build (from outside the checkout) against the checkout's pure modules."""
    installed = installed_build(tmp_path)
    if "compiled" not in installed:
        pytest.skip(f"the installed servesim is {installed}: no compiled build to compare (setup.py)")
    compiled = table_digests(tmp_path, None)
    pure = table_digests(tmp_path, str(ROOT))
    assert compiled.count("\n") >= 13 and "error" not in compiled
    assert compiled == pure


def test_no_compiled_module_hands_out_a_generator_expression() -> None:
    # mypyc builds a generator expression's whole list where it stands
    # (mypyc.readthedocs.io, "Differences from Python"): one returned or kept as an iterator would
    # be computed whole, however little of it the caller reads (a policy reads the head of the
    # waiting queue). Passed straight to a consumer (sum, any, tuple, ...) it is read whole anyway.
    import ast

    handed_out = []
    for name in load_setup().COMPILED:
        tree = ast.parse((ROOT / name).read_text(), name)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Return, ast.Assign, ast.AnnAssign, ast.Yield)) and \
                    isinstance(node.value, ast.GeneratorExp):
                handed_out.append(f"{name}:{node.lineno}")
    assert handed_out == []
