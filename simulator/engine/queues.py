"""The waiting queue and the running set's preemption order, as `--scheduling-policy` names them.

fcfs (vLLM's default): waiting in arrival order, a preempted request back at the front; the victim
of a preemption is the most recently admitted running request. priority: waiting ordered by
(priority, arrival, id), lower first, a preempted request back in its place; the victim is the
running request with the largest (priority, arrival, id), the waiting queue's order reversed
(vLLM's `max(running, key=(priority, arrival_time))`, with ties broken by arrival order: vLLM's first
maximum, the earliest admitted, would let two requests that arrived at once preempt each other in
turn for ever when the KV cache holds only one of them).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterator
from typing import Any

from mypy_extensions import mypyc_attr

from simulator.engine.kv import KVBlocks
from simulator.engine.request import Request
from simulator.engine.step import Scheduling


@mypyc_attr(native_class=False)  # a compiled class cannot subclass deque (setup.py)
class FcfsQueue(deque[Request]):
    """A deque, so that a policy iterating it and the engine counting it make no Python call."""

    def first(self) -> Request:
        return self[0]

    def push(self, request: Request) -> None:
        self.append(request)

    def requeue(self, request: Request) -> None:
        self.appendleft(request)

    def remove(self, request: Request) -> None:
        if self[0] is request:
            self.popleft()
        else:
            super().remove(request)


@mypyc_attr(native_class=False)  # a compiled class cannot subclass deque (setup.py)
class Unplanned(deque[tuple[float, Request]]):
    """Under async scheduling, (arrival, request) of the requests that arrived after the plan of the
    step under way (`simulator.engine.server`), in order of arrival."""

    def plan(self, waiting: FcfsQueue | PriorityQueue, before: float = math.inf) -> None:
        """Into `waiting`, in order, those that arrived before `before` (every one by default)."""
        while self and self[0][0] < before:
            waiting.push(self.popleft()[1])


def _order(request: Request) -> tuple[int, float, int]:
    return (request.priority, request.arrival, request.id)


class PriorityQueue:
    """Kept sorted, first at the end of the list (so taking the first is O(1))."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, float, int]] = []  # negated `_order`, ascending
        self._requests: dict[int, Request] = {}

    def __iter__(self) -> Iterator[Request]:
        # A generator function, not a generator expression: mypyc builds a generator expression's
        # whole list up front, and a policy reads only the head of a long queue.
        requests = self._requests
        for key in reversed(self._keys):
            yield requests[-key[2]]

    def __len__(self) -> int:
        return len(self._keys)

    def first(self) -> Request:
        return self._requests[-self._keys[-1][2]]

    def push(self, request: Request) -> None:
        priority, arrival, rid = _order(request)
        insort(self._keys, (-priority, -arrival, -rid))
        self._requests[rid] = request

    def requeue(self, request: Request) -> None:
        self.push(request)

    def remove(self, request: Request) -> None:
        priority, arrival, rid = _order(request)
        key = (-priority, -arrival, -rid)
        if self._keys[-1] == key:
            self._keys.pop()
        else:
            i = bisect_left(self._keys, key)
            if i == len(self._keys) or self._keys[i] != key:
                raise ValueError(f"request {rid} is not waiting")
            del self._keys[i]
        del self._requests[rid]


class AdmissionOrder:
    """The running set in admission order, finished and preempted ones dropped lazily."""

    def __init__(self) -> None:
        self._order: deque[tuple[int, Request]] = deque()
        self._compact_at = 64

    def add(self, request: Request) -> None:
        self._order.append((request.admitted, request))
        if len(self._order) > self._compact_at:
            self._order = deque(e for e in self._order if e[0] == e[1].admitted)
            self._compact_at = 2 * len(self._order) + 64

    def youngest(self) -> Request:
        order = self._order
        while order[-1][0] != order[-1][1].admitted:
            order.pop()
        return order[-1][1]

    def victim(self) -> Request:
        return self.youngest()


class PriorityVictims(AdmissionOrder):
    """Admission order as above, plus a heap of the lowest-priority running request."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, float, int, int, Request]] = []

    def add(self, request: Request) -> None:
        super().add(request)
        heap = self._heap
        heapq.heappush(heap, (-request.priority, -request.arrival, -request.id, request.admitted, request))
        if len(heap) > self._compact_at:
            self._heap = [e for e in heap if e[3] == e[4].admitted]
            heapq.heapify(self._heap)

    def victim(self) -> Request:
        heap = self._heap
        while heap[0][3] != heap[0][4].admitted:
            heapq.heappop(heap)
        return heap[0][4]


def make_queues(scheduling: Scheduling) -> tuple[FcfsQueue | PriorityQueue, AdmissionOrder]:
    if scheduling == "priority":
        return PriorityQueue(), PriorityVictims()
    return FcfsQueue(), AdmissionOrder()


class WaitingWithHits:
    """A waiting queue as a policy reads it under prefix caching: each request it hands over is
    looked up first (`KVBlocks.look_up`), so its `computed` and `num_pending` count its hit. One
    whose hit has a host part it passes over (recorded in `KVBlocks.host_reads`): it loads before
    it can be admitted (`simulator.engine.offload`)."""

    def __init__(self, queue: Any, kv: KVBlocks) -> None:
        self._queue = queue
        self._kv = kv

    def __iter__(self) -> Iterator[Request]:
        kv = self._kv
        look_up, host_reads = kv.look_up, kv.host_reads
        if kv.offload is None:
            for request in self._queue:
                look_up(request)
                yield request
            return
        for request in self._queue:
            passed = len(host_reads)
            look_up(request)
            if len(host_reads) == passed:
                yield request

    def __len__(self) -> int:
        return len(self._queue)

    def first(self) -> Request:
        for request in self:
            return request
        raise IndexError("no waiting request the policy may admit")
