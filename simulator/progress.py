"""Progress on stderr for long work: a run's requests, a sweep's configurations, a table write.

A bar (done/total, elapsed<ETA, rate, and what else the work knows, such as simulated time) is
drawn by tqdm's formatter, only on a terminal and never with --quiet, only once the work has
lasted `MIN_SECONDS` (short work prints nothing), and at most every `REDRAW_SECONDS`. Callers
may report every step: between looks at the clock a bar only counts calls.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

MIN_SECONDS = 1.5
REDRAW_SECONDS = 0.2
CHECKS_PER_REDRAW = 4
"""How often, per redraw interval, a bar reads the clock; it learns how many calls that takes."""

Clock = Callable[[], float]


def progress_enabled(quiet: bool, stream: TextIO | None = None) -> bool:
    """Progress is for a person watching: stderr must be a terminal, and --quiet not given."""
    stream = sys.stderr if stream is None else stream
    return not quiet and stream.isatty()


def _tqdm() -> Any:
    """tqdm's class, imported when a bar or a status line is first drawn (a quiet run never loads it)."""
    from tqdm import tqdm

    return tqdm


class Bar:
    """A progress bar over `total` units (`scale`: shown as 1.2M), drawn from `delay` seconds on;
    `advance(done)` is cheap enough to call at every step."""

    def __init__(self, total: int, *, desc: str, unit: str, enabled: bool, initial: int = 0, scale: bool = False,
                 delay: float | None = None, file: TextIO | None = None, clock: Clock = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.initial, self.scale = total, desc, unit, initial, scale
        self.delay = MIN_SECONDS if delay is None else delay
        self.enabled = enabled
        self.file = sys.stderr if file is None else file
        self.clock = clock
        self.start = clock()
        self.done = initial
        self.calls_between_checks = 1
        self.countdown = 1
        self.last_check = self.start
        self.last_draw: float | None = None
        self.print_status: Callable[[str], None] | None = None

    def advance(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        self.countdown -= 1
        if self.countdown <= 0:
            self.check_clock()

    def check_clock(self) -> None:
        now = self.clock()
        # Aim the next look at the clock a fraction of a redraw interval away, at the call rate seen.
        interval = now - self.last_check
        target = REDRAW_SECONDS / CHECKS_PER_REDRAW
        calls = self.calls_between_checks
        self.calls_between_checks = max(1, min(100_000, int(calls * target / interval) if interval > 0 else calls * 2))
        self.countdown = self.calls_between_checks
        self.last_check = now
        if now - self.start >= self.delay and (self.last_draw is None or now - self.last_draw >= REDRAW_SECONDS):
            self.draw(now)

    def line(self, now: float) -> str:
        width = shutil.get_terminal_size().columns
        return _tqdm().format_meter(self.done, self.total, now - self.start, ncols=width, prefix=self.desc,
                                    unit=self.unit, unit_scale=self.scale, postfix=self.detail() or None,
                                    initial=self.initial)

    def detail(self) -> str:
        """What else the bar shows, beside counts and times."""
        return ""

    def draw(self, now: float) -> None:
        if self.print_status is None:
            self.print_status = _tqdm().status_printer(self.file)
        self.print_status(self.line(now))
        self.last_draw = now

    def close(self) -> None:
        """Draw the final state and end the line, if anything was drawn."""
        if self.last_draw is not None:
            self.draw(self.clock())
            self.file.write("\n")
            self.file.flush()
            self.last_draw = None


class RunProgress(Bar):
    """A run's progress: requests completed of `total_requests`, and the simulated clock."""

    def __init__(self, total_requests: int, *, enabled: bool, file: TextIO | None = None,
                 clock: Clock = time.monotonic) -> None:
        super().__init__(total_requests, desc="run", unit="req", enabled=enabled, file=file, clock=clock)
        self.sim_time = 0.0

    def update(self, completed: int, sim_time: float) -> None:
        # Bar.advance inlined: this runs once per engine step.
        self.done, self.sim_time = completed, sim_time
        if self.enabled:
            self.countdown -= 1
            if self.countdown <= 0:
                self.check_clock()

    def detail(self) -> str:
        return f"sim {self.sim_time:,.1f} s"


@contextmanager
def working(desc: str, *, enabled: bool, file: TextIO | None = None, clock: Clock = time.monotonic
            ) -> Iterator[None]:
    """Elapsed time for work that cannot say how far along it is (one long library call), drawn by
    a background thread once it has lasted `MIN_SECONDS`."""
    if not enabled:
        yield
        return
    stream = sys.stderr if file is None else file
    start = clock()
    finished = threading.Event()
    printer = _tqdm().status_printer(stream)
    drawn = False

    def tick() -> None:
        nonlocal drawn
        while not finished.wait(REDRAW_SECONDS):
            elapsed = clock() - start
            if elapsed >= MIN_SECONDS:
                printer(f"{desc}: {_tqdm().format_interval(elapsed)}")
                drawn = True

    ticker = threading.Thread(target=tick, name=f"progress: {desc}", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        finished.set()
        ticker.join()
        if drawn:
            printer(f"{desc}: {_tqdm().format_interval(clock() - start)}")
            stream.write("\n")
            stream.flush()
