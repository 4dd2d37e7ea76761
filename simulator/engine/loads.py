"""A server's loads from the KV cache's host tier (`simulator.engine.offload` has the rules): after a
step took its blocks, the waiting requests the policy passed over for their host hits start loading,
one after another on the server's host link; when a load ends, its request rejoins the waiting
queue."""

from __future__ import annotations

from collections import deque

from simulator.engine.kv import KVBlocks
from simulator.engine.offload import HostLink
from simulator.engine.queues import FcfsQueue, PriorityQueue
from simulator.engine.request import Request


class HostLoads:
    """The loads of one server in flight, in order of their ends."""

    def __init__(self, kv: KVBlocks, waiting: FcfsQueue | PriorityQueue) -> None:
        self.kv, self.waiting = kv, waiting
        self.link = HostLink(kv.host) if kv.offload is not None and kv.host is not None else None
        """With a KV host tier: its link's load direction."""
        self.loads: deque[tuple[float, Request]] = deque()
        """(end, request) of each load in flight."""

    def wake_at(self, wake_at: float | None) -> float | None:
        """The policy's `wake_at`, or the next load's end if sooner (a load is in flight)."""
        end = self.loads[0][0]
        return end if wake_at is None or end < wake_at else wake_at

    def start(self, clock: float) -> None:
        """The requests the policy passed over for their host hits start loading at `clock`, in
        order, until one does not fit (`KVBlocks.start_load`)."""
        kv, link, waiting = self.kv, self.link, self.waiting
        assert link is not None
        for request in kv.host_reads:
            if request.blocks:  # passed over twice, loading already
                continue
            started = kv.start_load(request)
            if started < 0:
                break
            if started:
                waiting.remove(request)
                self.loads.append((link.load(clock, request.host_loaded), request))
        kv.host_reads.clear()

    def end(self, clock: float) -> None:
        """The loads ended by `clock`: their requests release their blocks, cached, and rejoin the
        waiting queue at its front in the order they loaded."""
        loads, kv = self.loads, self.kv
        ended: list[Request] = []
        while loads and loads[0][0] <= clock:
            request = loads.popleft()[1]
            kv.release(request)
            ended.append(request)
        for request in reversed(ended):
            self.waiting.requeue(request)
