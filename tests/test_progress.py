"""Progress bars: on a terminal only, never with --quiet, silent for short work, cheap per step."""

from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path

import pytest

import simulator.progress
from simulator.cli.main import run
from simulator.progress import RunProgress, progress_enabled, working

SMALL = ["--num-requests", "30", "--input-len", "200", "--output-len", "10"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """Seconds that pass only when the test says so; counts how often it is read."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_progress_only_on_a_terminal_and_never_with_quiet() -> None:
    assert progress_enabled(False, Terminal())
    assert not progress_enabled(True, Terminal())
    assert not progress_enabled(False, io.StringIO())


def test_a_run_shows_requests_done_simulated_time_and_eta() -> None:
    screen, clock = Terminal(), Clock()
    bar = RunProgress(1000, enabled=True, file=screen, clock=clock)
    for done in range(1, 501):
        clock.now = done * 0.004  # 250 requests a wall second
        bar.update(done, sim_time=done * 0.5)
    bar.close()
    assert screen.getvalue().endswith("\n")
    drawn = [re.search(r"(\d+)/1000 \[00:(\d\d)<00:(\d\d), 250.00req/s, sim ([\d.]+) s\]", line)
             for line in screen.getvalue().strip().split("\r") if line]
    assert len(drawn) >= 3 and all(drawn), screen.getvalue()
    for match in drawn:
        done, elapsed, left, sim = (float(g) for g in match.groups())  # type: ignore[union-attr]
        assert done * 0.004 >= 1.5  # nothing before the work has lasted 1.5 s
        assert elapsed == int(done * 0.004) and abs(left - (1000 - done) / 250) <= 1 and sim == done * 0.5
    assert drawn[-1].group(1) == "500"  # type: ignore[union-attr]  # close() shows where the run stopped


def test_short_work_and_disabled_bars_print_nothing() -> None:
    for enabled, seconds in ((True, 1.4), (False, 10.0)):
        screen, clock = Terminal(), Clock()
        bar = RunProgress(100, enabled=enabled, file=screen, clock=clock)
        for done in range(1, 101):
            clock.now = done * seconds / 100
            bar.update(done, sim_time=float(done))
        bar.close()
        assert screen.getvalue() == ""


def test_updates_read_the_clock_rarely_and_redraw_a_few_times_a_second() -> None:
    screen, clock = Terminal(), Clock()
    bar = RunProgress(1_000_000, enabled=True, file=screen, clock=clock)
    for done in range(1_000_000):  # 10 wall seconds at 100,000 steps a second
        clock.now = done * 1e-5
        bar.update(done, sim_time=done * 1e-3)
    assert clock.reads < 1_000  # a look every ~50 ms, not one per call
    redraws = screen.getvalue().count("\r")
    assert 20 <= redraws <= 10 / simulator.progress.REDRAW_SECONDS + 1


def test_work_that_cannot_count_shows_its_elapsed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Terminal()
    with working("building tables", enabled=True, file=screen):
        time.sleep(0.3)  # shorter than MIN_SECONDS: nothing
    assert screen.getvalue() == ""
    monkeypatch.setattr(simulator.progress, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(simulator.progress, "REDRAW_SECONDS", 0.01)
    with working("building tables", enabled=False, file=screen):
        time.sleep(0.3)
    assert screen.getvalue() == ""
    with working("building tables", enabled=True, file=screen):
        time.sleep(0.3)
    assert screen.getvalue().startswith("\rbuilding tables: 00:00") and screen.getvalue().endswith("\n")


def terminal_run(args: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """`simulate ARGS` with stderr a terminal and no delay before a bar appears; its stderr."""
    screen = Terminal()
    monkeypatch.setattr(simulator.progress, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(sys, "stderr", screen)
    codes: list[int] = []
    run(args, exit=codes.append)
    assert codes == [0], screen.getvalue()
    return screen.getvalue()


def test_table_writes_and_sweeps_show_progress_unless_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    shown = terminal_run(["run", *SMALL, "--out", str(tmp_path / "a")], monkeypatch)
    # 30 requests + 300 tokens + the steps: every row counted, ending at the total.
    assert "writing: 100%" in shown and "row" in shown
    assert terminal_run(["run", *SMALL, "--quiet", "--out", str(tmp_path / "b")], monkeypatch) == ""
    shown = terminal_run(["sweep", "--rate", "4,8", *SMALL, "--jobs", "1", "--out", str(tmp_path / "s.parquet")],
                         monkeypatch)
    assert "sweep: 100%" in shown and "2/2" in shown
    quiet = ["sweep", "--rate", "4,8,16", *SMALL, "--jobs", "1", "--quiet", "--out", str(tmp_path / "s.parquet")]
    assert terminal_run(quiet, monkeypatch) == ""
    # Not a terminal: nothing on stderr.
    monkeypatch.undo()
    codes: list[int] = []
    run(["run", *SMALL, "--out", str(tmp_path / "c")], exit=codes.append)
    assert codes == [0] and capsys.readouterr().err == ""
