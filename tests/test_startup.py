"""Start-up: a verb imports only what it needs, and the command list is the one click would print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click_default_group import DefaultGroup

from benchmarks.startup import CASES, time_once
from simulator.cli.main import VERBS, main

ROOT = Path(__file__).resolve().parents[1]

# What a run never needs: the plotting stack, PyTorch, Ray, calibration and the other verbs; and what a
# synthetic run on the roofline that writes its folder does not: polars (its tables stay numpy
# columns until a caller asks for frames), the measured cost model and the trace readers.
NOT_FOR_A_RUN = ("plotly", "torch", "ray", "polars", "simulator.cost.measured", "workloads.traces",
                 "calibration", "calibration.measure", "calibration.validate",
                 "simulator.report", "simulator.report.page", "simulator.report.figures",
                 "simulator.report.run_figures", "simulator.sweep", "simulator.sweep.grid",
                 "simulator.cli.sweep_command", "simulator.sweep.executors", "simulator.cli.batch_table_command",
                 "simulator.cli.report_command")


def modules_after(args: list[str], cwd: Path) -> tuple[int, set[str]]:
    """The exit status of `simulate ARGS` in a fresh interpreter, and every module it had imported by the end."""
    script = ("import json, sys; from simulator.cli.main import run; codes = []; run(sys.argv[1:], exit=codes.append); "
              "print(json.dumps([codes[0], sorted(sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=cwd, check=True,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    code, modules = json.loads(done.stdout.splitlines()[-1])
    return code, set(modules)


@pytest.mark.parametrize("verb", [["run"], []], ids=["simulate run", "simulate (the default verb)"])
def test_a_run_imports_no_plotting_calibration_ray_or_other_verb(verb: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, modules = modules_after([*verb, "--num-requests", "5", "--rate", "4", "--out", str(out)], tmp_path)
    assert code == 0 and (out / "summary.json").is_file()
    assert "simulator.run.simulate" in modules and "simulator.cli.run_command" in modules  # it did run
    loaded = sorted(name for name in modules if name.split(".")[0] in ("plotly", "torch", "ray", "polars")
                    or name in NOT_FOR_A_RUN)
    assert loaded == []


def test_the_command_list_imports_no_verb_and_no_numerical_library(tmp_path: Path) -> None:
    """`simulate --help` stays fast by what it does not load (deterministic, unlike a timing)."""
    code, modules = modules_after(["--help"], tmp_path)
    assert code == 0
    heavy = {"numpy", "polars", "pyarrow", "scipy", "simpy", "plotly", "tqdm", "policies", "workloads"}
    verbs = {target.split(":")[0] for target in VERBS}
    assert sorted(name for name in modules if name.split(".")[0] in heavy or name in verbs) == []


@pytest.mark.parametrize("width", [80, 60, 120])
def test_the_lazy_command_list_is_what_click_prints_with_every_verb_imported(width: int) -> None:
    """The group's help, its short helps read from source, against click's own help of the same group
    built the ordinary way, every command imported and registered."""
    eager = DefaultGroup("simulate", help=main.help, params=list(main.params), default="run", default_if_no_args=True)
    for name in VERBS:
        eager.add_command(main.load(name), name)
    lazy_help = main.get_help(click.Context(main, info_name="simulate", terminal_width=width))
    assert lazy_help == eager.get_help(click.Context(eager, info_name="simulate", terminal_width=width))
    assert "run*" in lazy_help and all(name in lazy_help for name in VERBS)


def test_every_verb_is_found_where_the_registry_says() -> None:
    for name in VERBS:
        command = main.get_command(click.Context(main), name)
        assert isinstance(command, click.Command) and command.name == name


def test_the_benchmarks_import_phase_imports_the_run_verb_and_stops_before_simulating(tmp_path: Path) -> None:
    code, modules = modules_after(CASES["import phase of run"][2:], tmp_path)
    assert code == 2 and {"simulator.cli.run_command", "simulator.run.simulate", "simulator.metrics.summary"} <= modules
    for case in CASES:  # each process ends as the benchmark expects, or time_once raises
        assert time_once(ROOT, case) > 0


def test_a_verbs_imports_are_frozen_and_the_collector_left_on(tmp_path: Path) -> None:
    # The first import of a verb's module runs with the collector paused and then freezes what the
    # process holds (simulator.cli.main.import_settled): later full collections skip those objects.
    script = ("import gc, json, sys; from simulator.cli.main import run; before = gc.get_freeze_count(); "
              "codes = []; run(sys.argv[1:], exit=codes.append); "
              "print(json.dumps([codes, before, gc.get_freeze_count(), gc.isenabled()]))")
    done = subprocess.run([sys.executable, "-c", script, "--num-prompts", "3", "--no-tokens", "--quiet",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path, check=True,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    codes, before, after, enabled = json.loads(done.stdout.splitlines()[-1])
    assert codes in ([], [0]) and before == 0 and enabled
    assert after > 50_000  # numpy, polars, pyarrow and the simulator's modules


def threads_after(script: str, env: dict[str, str]) -> int:
    """The threads of a fresh interpreter after `script` (Linux: its /proc/self/status)."""
    probe = (script + "; print(next(line for line in open('/proc/self/status') "
                      "if line.startswith('Threads:')).split()[1])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="counts threads in /proc (Linux)")
def test_a_command_runs_numpy_on_one_thread_unless_the_user_set_it() -> None:
    """numpy's OpenBLAS would start a busy-waiting thread per core; a command keeps it on one."""
    env = {name: value for name, value in os.environ.items() if name not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    assert threads_after("import simulator.cli.main, numpy", env) == 1
    if (os.cpu_count() or 1) > 1:  # the control: without the command line, OpenBLAS starts more
        assert threads_after("import numpy", env) > 1
        assert threads_after("import simulator.cli.main, numpy", env | {"OPENBLAS_NUM_THREADS": "2"}) == 2
