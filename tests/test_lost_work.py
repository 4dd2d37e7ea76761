"""Work is never lost or blocked: concurrent sweeps, Ctrl-C, SIGKILL, sweeps that only fail.

The signal tests wait for state they can see (worker processes, a scratch folder) rather than for
a time, with generous limits, so a loaded machine slows them down without failing them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from test_cli import simulate_cli

SMALL = ["--num-requests", "40", "--input-len", "300", "--output-len", "20"]
# A configuration that takes seconds, so a signal lands while it runs.
SLOW = ["--num-requests", "100000"]


def start(args: list[str]) -> subprocess.Popen[bytes]:
    """`simulate ARGS` in its own process group, as a shell runs a command."""
    command = [sys.executable, "-c", "from simulator.cli.main import run; run()", *args]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie waits for whoever adopted it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what} after {timeout} s"
        time.sleep(0.02)


def stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def test_a_second_sweep_into_the_same_out_is_refused_and_loses_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    first = start(["sweep", "--rate", "4,8", "--num-requests", "20000", "--jobs", "2", "--out", str(out)])
    try:
        wait_until(lambda: len(children(first.pid)) >= 2, 120, "the first sweep's workers")
        second = ["sweep", "--rate", "12,16", *SMALL, "--jobs", "1", "--out", str(out)]
        code, _, err = simulate_cli(second, capsys)
        assert first.poll() is None, "the first sweep ended before the second started: no clash was tested"
        assert code == 2 and "another sweep" in err and f"{out.parent.name}/{out.name}'" in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert first.wait(timeout=300) == 0
    finally:
        stop(first)
    assert pl.read_parquet(out)["rate"].to_list() == [4.0, 8.0]
    # Rerun once the first has ended, as the refusal says: both sweeps' rows, none lost.
    code, stdout, err = simulate_cli(second, capsys)
    assert code == 0, err
    assert "2 run now, 0 already done" in stdout
    assert sorted(pl.read_parquet(out)["rate"].to_list()) == [4.0, 8.0, 12.0, 16.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.parquet"]


def test_ctrl_c_before_any_row_leaves_nothing_a_rerun_refuses(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    sweep = start(["sweep", "--rate", "4,8", *SLOW, "--jobs", "2", "--out", str(out)])
    try:
        wait_until(lambda: len(children(sweep.pid)) >= 2, 120, "the sweep's workers")
        os.killpg(sweep.pid, signal.SIGINT)  # Ctrl-C: the sweep and its workers
        assert sweep.wait(timeout=120) != 0
    finally:
        stop(sweep)
    assert list(tmp_path.iterdir()) == []  # no 0-row file, no parts, no lock
    # The documented way on: run the sweep again (smaller here, for time) into the same --out.
    code, _, err = simulate_cli(["sweep", "--rate", "4,8", *SMALL, "--jobs", "1", "--out", str(out)], capsys)
    assert code == 0, err
    assert pl.read_parquet(out).height == 2


def test_killing_a_sweep_ends_its_workers_and_resource_tracker(tmp_path: Path) -> None:
    sweep = start(["sweep", "--rate", "4,8", *SLOW, "--jobs", "2", "--out", str(tmp_path / "sweep.parquet")])
    try:
        wait_until(lambda: len(children(sweep.pid)) >= 3, 120, "two workers and the resource tracker")
        orphans = children(sweep.pid)
        os.kill(sweep.pid, signal.SIGKILL)  # the parent alone, which can then stop nothing
        sweep.wait()
        wait_until(lambda: not any(alive(pid) for pid in orphans), 30, f"the orphaned processes {orphans} to end")
    finally:
        stop(sweep)


def test_a_run_killed_while_writing_leaves_a_scratch_folder_the_next_run_removes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 12M output tokens: writing tokens.parquet takes a good fraction of a second.
    run = start(["run", "--rate", "inf", "--num-requests", "12000", "--input-len", "100", "--output-len", "1000",
                 "--out", str(tmp_path / "run")])

    def hidden() -> list[Path]:
        return [p for p in tmp_path.iterdir() if p.name.startswith(".")]

    try:
        # The scratch folder (.run.*.scratch), not the probe of whether --out can be written at all,
        # nor the folder in the instant before it is locked and renamed to that name.
        wait_until(lambda: any(p.name.startswith(".run.") and p.name.endswith(".scratch") for p in hidden()), 300,
                   "the run to start writing")
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    finally:
        stop(run)
    assert hidden() and not (tmp_path / "run").exists(), "the kill came after the write: nothing was tested"
    code, _, err = simulate_cli(["run", *SMALL, "--out", str(tmp_path / "again")], capsys)
    assert code == 0, err
    assert hidden() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]


def test_a_sweep_in_which_every_configuration_failed_exits_non_zero(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    # Without chunking a 1000-token prompt never fits a 256- or 512-token step.
    args = ["sweep", "--policy", "continuous", "--max-num-batched-tokens", "256,512", "--max-num-seqs", "64",
            "--input-len", "1000", *SMALL[:2], "--rate", "8", "--jobs", "1", "--out", str(out)]
    code, stdout, err = simulate_cli(args, capsys)
    assert code == 1 and "every configuration failed" in err and "2 failed" in stdout, err
    assert pl.read_parquet(out)["error"].null_count() == 0  # the rows, with their errors, are kept
    # One good configuration among them and the sweep succeeds.
    code, stdout, _ = simulate_cli([*args[:4], "256,512,4096", *args[5:]], capsys)
    assert code == 0 and "1 run now, 2 already done, 0 failed" in stdout


@pytest.mark.parametrize(("axis", "named"), [
    (["--policy", "continuous,foo"], "--policy lists 'foo'"),
    (["--model", "llama-3.1-8b,no-such-model"], "--model lists 'no-such-model'"),
    (["--gpu", "h100_sxm,b999"], "--gpu lists 'b999'"),
    (["--cost", "roofline,guess"], "--cost lists 'guess'"),
    (["--kv-cache-dtype", "auto,fp4"], "--kv-cache-dtype lists 'fp4'"),
    (["--input-len-dist", "fixed,zipf"], "--input-len-dist lists 'zipf'"),
    (["--trace", "none,no/such.csv"], "--trace lists 'no/such.csv'"),
])
def test_unknown_names_in_an_axis_are_refused_before_anything_runs(
        axis: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate_cli(["sweep", *axis, *SMALL, "--jobs", "1", "--out", str(tmp_path / "s.parquet")], capsys)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
