"""The clients of multi-turn sessions (`workloads.sessions`): each sends its session's next turn
`think_time` after the last token of the previous one.

Closed loop (`concurrency` clients): each client runs sessions one after another, the next starting
when its last one's final answer is done. Open loop: sessions start at their arrival times. The
engine and the test oracle drive their servers through the same clients.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from simulator.engine.request import Request
from workloads import Workload


class SessionClients:
    def __init__(self, env: simpy.Environment, workload: Workload, send: Callable[[int, float], Request],
                 arrival_timeout: Callable[[float], simpy.Event]) -> None:
        """`send(index, arrival)` submits the workload's request `index` as arriving at `arrival`."""
        self.env = env
        self.workload = workload
        self.send = send
        self.arrival_timeout = arrival_timeout
        self.turns = workload.turns
        self.index: dict[int, int] = {}
        """Request id -> its index in the workload (turns of different sessions interleave)."""
        self.next_session = 0
        self.num_sessions = -(-workload.num_requests // self.turns)

    def start(self) -> None:
        if self.workload.arrival is None:
            assert self.workload.concurrency is not None
            for _ in range(min(self.workload.concurrency, self.num_sessions)):
                self._start_session(0.0)
        else:
            self.env.process(self._session_arrivals())

    def _session_arrivals(self) -> Generator[simpy.Event, Any, None]:
        assert self.workload.arrival is not None
        starts = self.workload.arrival[:: self.turns].tolist()
        for t in starts:
            if t > self.env.now:
                yield self.arrival_timeout(t - self.env.now)
            self._start_session(t)

    def _start_session(self, at: float) -> None:
        index = self.next_session * self.turns
        self.next_session += 1
        self._send(index, at)

    def _send(self, index: int, at: float) -> None:
        self.index[self.send(index, at).id] = index

    def on_finish(self, request: Request, at: float) -> None:
        index = self.index.pop(request.id)
        if (index + 1) % self.turns and index + 1 < self.workload.num_requests:
            think = self.workload.think_time
            if think and at + think > self.env.now:
                self.env.process(self._after_thinking(index + 1, at + think))
            else:
                self._send(index + 1, at + think)
        elif self.workload.arrival is None and self.next_session < self.num_sessions:
            self._start_session(at)

    def _after_thinking(self, index: int, at: float) -> Generator[simpy.Event, Any, None]:
        yield self.arrival_timeout(at - self.env.now)
        self._send(index, at)
