"""The whole input surface fuzzed (hypothesis): every option of run, batch-table, sweep, compare, fit,
validate and report read from its click command, sweep files, traces, model configs, GPU profiles and measured
results, malformed at random. Each call exits 0 with sane output or non-zero with one line starting
'error:'; never a traceback, a warning, a hang or a half-written output (fuzz_surface.check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzz_surface import Huge, Outcome, check, command_lines, fuzz_settings, in_folder, leftovers, simulate
from hypothesis import example, given
from hypothesis import strategies as st

TINY = ["--num-requests", "3", "--input-len", "40", "--output-len", "4"]
"""A workload small enough that a run takes a blink: drawn options come after it and override it."""
HELD = {
    "run": frozenset(),
    "batch-table": frozenset(),
    # Processes and a Ray cluster would make each example seconds long; --jobs is fuzzed on its own.
    "sweep": frozenset({"--jobs", "--executor", "--address"}),
    "compare": frozenset(),
    "fit": frozenset(),
    "validate": frozenset(),
    "report": frozenset({"--open"}),  # a browser
}


def fuzz_verb(args: list[str], files: dict[str, str] | None = None) -> None:
    """Run `simulate ARGS` in a fresh folder holding `files`; check the properties and that nothing
    is half-written."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        for name, text in (files or {}).items():
            (folder / name).write_text(text)
        outcome = simulate(args)
        check(outcome)
        assert not leftovers(folder), (args, leftovers(folder))


VLLM_RESULT = json.dumps({
    "model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 4, "request_rate": "inf", "burstiness": 1.0,
    "max_concurrency": 2, "completed": 4, "total_input_tokens": 400, "total_output_tokens": 40,
    "request_throughput": 4.0, "output_throughput": 40.0, "mean_ttft_ms": 20.0, "mean_tpot_ms": 9.0})
"""A small `vllm bench serve` result for compare to rerun."""


@pytest.fixture(scope="module")
def run_folder() -> Iterator[Path]:
    """A tiny run's folder for `simulate report` to read."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        assert simulate(["run", *TINY, "--out", "run"]).code == 0
        yield folder / "run"


HUGE = Huge("x" * 10**5)
PROCESS_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
"""A subprocess imports the checkout under test, wherever it runs."""


@fuzz_settings(ci_examples=60)
@given(drawn=command_lines("run", HELD["run"]))
@example(drawn=["--policy", HUGE])  # click quoted a bad choice whole: 10^5 characters on stderr
@example(drawn=["--input-len-dist", HUGE])  # the distribution's name echoed whole
def test_run_options(drawn: list[str]) -> None:
    fuzz_verb(["run", *TINY, *drawn])


@fuzz_settings(ci_examples=40)
@given(drawn=command_lines("batch-table", HELD["batch-table"]))
@example(drawn=["--batch", str(2**63)])  # an OverflowError traceback: the size check was not called
@example(drawn=["--context", str(2**63)])  # a table of 17-digit step times
@example(drawn=["--batch", HUGE])  # quoted whole
@example(drawn=["--gpu", HUGE])  # the file system's message quoted the path whole
def test_batch_table_options(drawn: list[str]) -> None:
    fuzz_verb(["batch-table", "--batch", "1,8", *drawn])


@fuzz_settings(ci_examples=30)
@given(drawn=command_lines("sweep", HELD["sweep"], at_most=3))
@example(drawn=["--policy", HUGE])  # quoted whole
def test_sweep_options(drawn: list[str]) -> None:
    fuzz_verb(["sweep", "--jobs", "1", "--out", "sweep.parquet", *TINY, *drawn])


@fuzz_settings(ci_examples=25)
@given(drawn=command_lines("compare", HELD["compare"], at_most=3))
def test_compare_options(drawn: list[str]) -> None:
    fuzz_verb(["compare", "result.json", *drawn], {"result.json": VLLM_RESULT})


SILICON_ROWS = "".join(
    f"p{i},vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,,,64,4,{c},{tp},30,{tpot}\n"
    for i, (tp, c, tpot) in enumerate([(2, 2, 15), (4, 2, 11), (8, 4, 9), (2, 4, 16), (4, 4, 12)]))
SILICON_POINTS = ("id,backend,backend_version,model_path,system,precision,gemm_quant_mode,isl,osl,concurrency,"
                  "tp_size,silicon_ttft_ms,silicon_tpot_ms\n" + SILICON_ROWS)
"""Five tiny measured points (Qwen3-32B on H100s at TP 2, 4 and 8) for fit to fit and hold out."""


@fuzz_settings(ci_examples=12)
@given(drawn=command_lines("fit", HELD["fit"], at_most=3))
@example(drawn=["--fit-tp", "2", "--disable-custom-all-reduce"])  # a RuntimeWarning: 2 points, 2 terms alike
def test_fit_options(drawn: list[str]) -> None:
    fuzz_verb(["fit", "points.csv", "--gpu", "h100_sxm", "--out", "profile", *drawn], {"points.csv": SILICON_POINTS})


@fuzz_settings(ci_examples=8)
@given(drawn=command_lines("validate", HELD["validate"], at_most=3))
@example(drawn=["--reference", HUGE])  # the file system's message quotes the path: cut from its start
def test_validate_options(drawn: list[str]) -> None:
    fuzz_verb(["validate", *drawn])


@fuzz_settings(ci_examples=15)
@given(drawn=command_lines("report", HELD["report"], at_most=2))
def test_report_options(drawn: list[str], run_folder: Path) -> None:
    fuzz_verb(["report", str(run_folder), *drawn])


HANG = 20
"""Seconds within which any one fuzzed command ends in its own process."""


@fuzz_settings(ci_examples=4)
@given(verb=st.sampled_from(["run", "batch-table"]), data=st.data())
def test_no_command_hangs(verb: str, data: st.DataObject) -> None:
    """A small sample in a process of its own, which a hang (a loop that never ends) cannot take down
    with the test run: it must end within HANG seconds, with the same properties."""
    drawn = data.draw(command_lines(verb, HELD[verb]))
    args = [verb, *(TINY if verb == "run" else []), *drawn]
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run([sys.executable, "-W", "error", "-c", "import sys; from simulator.cli.main import run; "
                               "run(sys.argv[1:])", *args], capture_output=True, text=True, cwd=scratch,
                              timeout=HANG, env=PROCESS_ENV)
    check(Outcome(args, done.returncode, done.stdout, done.stderr))


@pytest.mark.parametrize("jobs", ["0", "-1", str(2**31), str(2**63)])
def test_sweep_jobs_out_of_range(jobs: str) -> None:
    """--jobs past a C int was an OverflowError traceback from the worker pool's semaphore."""
    fuzz_verb(["sweep", "--jobs", jobs, "--out", "sweep.parquet", *TINY])
