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
walk all the requests alive so far, for nothing: reference counting frees that garbage all the same.
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
        self.callbacks: list[Any] = []  # typed here too: the compiled build type-checks without simpy installed
        self._value = None
        self._delay = at - env._now  # type: ignore[attr-defined]
        self._ok = True
        heappush(env._queue, (at, priority, next(env._eid), self))  # type: ignore[attr-defined,misc]


class Clock(simpy.Environment):
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
