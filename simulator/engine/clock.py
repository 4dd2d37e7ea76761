"""The SimPy environment the engine runs in, with the two kinds of timeout it needs.

- `timeout_at(t)`: a timeout that fires at exactly `t`. A server that prices k steps at once
  computes their ends as the same sequence of additions k one-step timeouts would have made, and
  must land on those bits; `env.timeout(t - now)` lands on `now + (t - now)`, which need not be `t`.
  In a fleet each server's timeouts carry its own priority, so step ends at one instant are
  processed in server order however they were scheduled.
- `arrival_timeout(delay)`: processed before any ordinary event at the same instant, so a request
  arriving exactly when a step ends is seen by the scheduler at that step boundary.

`run` pauses Python's cycle collector while the clock runs. A run's garbage is acyclic (steps,
events and tuples are freed by reference counting; tests/test_one_engine.py checks that the
collectable garbage a run leaves does not grow with its requests), and every full collection would
walk all the requests alive so far: 0.09-0.19 s of a 100k-request run of the speed benchmark's
cases, timed with `gc.callbacks`. The peak RSS of 30k-request runs with prefix caching, sessions
and a fleet is the same with the collector on and off.
"""

from __future__ import annotations

import gc
from heapq import heappush
from typing import Any

import simpy
from simpy.events import NORMAL, URGENT, Timeout


class _At(Timeout):
    def __init__(self, env: Clock, at: float, priority: int) -> None:
        # Timeout.__init__ without the relative delay (simpy inlines the same fields there).
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = at - env._now  # type: ignore[attr-defined]
        self._ok = True
        heappush(env._queue, (at, priority, next(env._eid), self))  # type: ignore[attr-defined,misc]


class Clock(simpy.Environment):
    def schedule_at(self, event: simpy.Event, priority: int, at: float) -> None:
        """`schedule` at an absolute time (simpy's own heap entry, with `at` for `now + delay`)."""
        assert at >= self.now, f"cannot schedule at {at}, before now ({self.now})"
        heappush(self._queue, (at, priority, next(self._eid), event))  # type: ignore[attr-defined,misc]

    def timeout_at(self, at: float, priority: int = NORMAL) -> Timeout:
        """`priority` orders events at the same instant (a fleet's servers' step ends by server)."""
        return _At(self, at, priority)

    def arrival_timeout(self, delay: float) -> Timeout:
        return _At(self, self._now + delay, URGENT)  # type: ignore[attr-defined]

    def run(self, until: Any = None) -> Any:
        """simpy's `run`, the cycle collector paused meanwhile (see the module docstring)."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return super().run(until)
        finally:
            if was_enabled:
                gc.enable()
