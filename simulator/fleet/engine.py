"""A fleet in one SimPy clock: pools of servers behind routers, and the KV link between two pools.

Colocated replicas are one pool: each arrival is routed (`simulator.fleet.routers`) from the servers'
state at that instant and served there whole. Disaggregated serving is two pools: a prefill server
computes the prompt and emits the first token (the request runs there with one output token, as
vLLM's P/D connectors send it with `max_tokens=1`), then the decode pool's router picks a server,
the KV crosses the prefill server's link (`simulator.fleet.transfer`), and the request waits in that
decode server's queue, holding no KV there, until the decode server's policy admits it with its
one pending token (it computes the first token's KV and emits the second) when its KV has room.
The client has the first token when the transfer ends (vLLM's proxy streams the decode side), so
a request's `first_token` is then: TTFT = queue + prefill + wait for the link + transfer, each a
column (`scheduled`, `prefill_end`, `transfer_start`, `transfer_end`). The tokens table and ITLs
time every token when it was computed, the first one at the prefill step's end. The prefill server
frees the request's KV when its prefill ends (the transfer, well under a step, is not held there).

What another process can see, and so when a server must stop and wait on the clock: a server runs
steps without a timeout (`Server.clock` ahead of the clock) or prices k decode steps as one only up
to `Server.horizon`. Alone, that is the clock's next event. In an open-loop fleet, the other
servers' step ends are events that neither read nor change this server, so the servers routed to
at arrival time wait only for the next arrival (`NextArrival`; under round robin or random, which
read no state, only for their own next arrival); a router then reads each server at
the arrival instant: every step it carried out without a timeout ended before it, and a step or
stretch still waited for shows the state a step-by-step engine shows mid-step, except the KV blocks
a decode stretch takes step by step, which `ServerLoad` reads from the stretch's plan
(`Server.stretch_kv`). Closed-loop clients send from any server's finish, and transfers land from
prefill servers' steps, so closed-loop servers and decode servers keep the clock's next event.
tests/test_fleet.py checks a fleet against a one-event-per-step fleet of oracle servers bit for bit.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from simulator.cost import CostModel
from simulator.engine.clock import Clock
from simulator.engine.kv import KVBlocks
from simulator.engine.request import Request, RequestColumns
from simulator.engine.server import Process, Server
from simulator.engine.step import Policy
from simulator.engine.steplog import StepLog
from simulator.fleet.routers import Router, planned_routes
from simulator.fleet.transfer import KVLink, links
from workloads import Workload
from workloads.prefixes import request_content


@dataclass
class Pool:
    """Identical servers: one policy instance and KV cache each, one cost model shared (a function
    of the step's shape), one router in front."""

    role: str
    """"replica", "prefill" or "decode"."""
    policies: list[Policy]
    cost: CostModel
    kv_blocks: int
    block_size: int
    router: Router
    prefix_caching: bool = False
    """Its servers keep a prefix cache (`simulator.engine.kv`)."""


@dataclass
class FleetResult:
    roles: list[str]
    """Each server's role, by server index (the prefill pool first)."""
    step_server: np.ndarray
    """The server of each step of the merged step log."""
    request_columns: dict[str, np.ndarray]
    """Per request (id order): the server(s) that served it, and for P/D the transfer's times."""
    kv_blocks: list[int]
    """KV blocks of each server."""


class ServerLoad:
    """A server as a router reads it: waiting + running, and KV in use at the clock's instant."""

    def __init__(self, server: Server) -> None:
        self.server = server

    @property
    def num_requests(self) -> int:
        return len(self.server.waiting) + self.server.num_running

    @property
    def kv_share(self) -> float:
        kv = self.server.kv
        return (kv.num_used + self._taken_mid_stretch()) / kv.num_blocks

    def cached_tokens(self, request: Request) -> int:
        return self.server.kv.cached_tokens(request, self._taken_mid_stretch())

    def _taken_mid_stretch(self) -> int:
        """Blocks the steps of a decode stretch in flight that started before now took already."""
        server = self.server
        if server.stretch_kv is None:
            return 0
        ends, taken = server.stretch_kv
        return int(taken[min(bisect_left(ends, server.env.now), len(ends) - 1)])


class NextArrival:
    """When the next request that may be routed to a server arrives (inf once none will): an open
    loop server's horizon. Under a router that reads state that is any request; under one that
    does not (round robin, random), only the server's own."""

    def __init__(self, times: list[float]) -> None:
        self.times = times
        self.index = 0
        self.at = times[0] if times else math.inf

    def __call__(self) -> float:
        return self.at

    def passed(self) -> None:
        """The request at `at` was routed: look to the next."""
        self.index += 1
        self.at = self.times[self.index] if self.index < len(self.times) else math.inf


FleetEngine = Callable[[list[Pool], KVLink | None, Workload, float | None, Callable[[int, float], None] | None],
                       tuple[RequestColumns, StepLog, float, FleetResult]]


def run_fleet(pools: list[Pool], link: KVLink | None, workload: Workload, time_limit: float | None,
              on_step: Callable[[int, float], None] | None = None
              ) -> tuple[RequestColumns, StepLog, float, FleetResult]:
    """`pools` in one clock: one pool of replicas, or a prefill pool and a decode pool joined by `link`."""
    env = Clock()
    n = workload.num_requests
    prompts, outputs = workload.prompt_tokens.tolist(), workload.output_tokens.tolist()
    priorities = workload.priority.tolist() if workload.priority is not None else [0] * n
    requests: list[Request] = []
    contents = workload.content
    entry = pools[0]
    served = [[-1] * n for _ in pools]
    prefill_end, transfer_start, transfer_end = [math.nan] * n, [math.nan] * n, [math.nan] * n
    first_index = [0, len(entry.policies)]

    def progress(_finished: int, at: float) -> None:
        if on_step is not None:
            on_step(sum(server.num_finished for server in servers[-1]), at)

    servers = [[Server(env, policy, pool.cost, KVBlocks(pool.kv_blocks, pool.block_size, pool.prefix_caching),
                       StepLog(), time_limit,
                       on_step=progress if on_step is not None else None) for policy in pool.policies]
               for pool in pools]
    for index, server in enumerate(server for pool_servers in servers for server in pool_servers):
        server.priority = NORMAL + index
    loads = [[ServerLoad(server) for server in pool_servers] for pool_servers in servers]

    def make_request(arrival: float) -> Request:
        i = len(requests)
        request = Request(i, arrival, prompts[i], 1 if link is not None else outputs[i], priorities[i])
        request.content = request_content(contents, i, outputs[i])
        requests.append(request)
        return request

    def route(pool: int, request: Request, at: float | None = None, source: int = -1) -> int:
        """The pool's router picks a server; the entry pool's gets the request (sent at `at` from
        the finish of server `source`, when a closed-loop client sends it)."""
        i = pools[pool].router(loads[pool], request)
        served[pool][request.id] = first_index[pool] + i
        if pool == 0:
            if at is not None and source > i:
                # Sent from a later server's step end at the instant one of server i's priced
                # steps ends: processed after that step, so counted in the next one's queue.
                at = math.nextafter(at, math.inf)
            servers[0][i].submit(request, at)
        return i

    def next_client(finished: Request, at: float) -> None:
        if workload.arrival is None and len(requests) < n:
            # The server it finished on: its decode server, or its prefill server for one token.
            route(0, make_request(at), at, max(served[0][finished.id], served[-1][finished.id]))

    def prefilled(request: Request, at: float) -> None:
        if outputs[request.id] == 1:
            next_client(request, at)
            return
        request.output_tokens = outputs[request.id]
        request.finish = request.first_token = math.nan  # the client has it when its KV has crossed
        prefill_end[request.id] = at
        target = route(1, request)
        env.process(ship(request, served[0][request.id], target))

    def ship(request: Request, source: int, target: int) -> Process:
        assert link is not None
        with wires[source].request() as slot:
            yield slot
            transfer_start[request.id] = env.now
            yield env.timeout(link.transfer_time(request.prompt_tokens))
            transfer_end[request.id] = env.now
        request.first_token = env.now  # the client has it with the KV, from the decode side
        servers[1][target].submit(request)

    wires = links(env, len(entry.policies)) if link is not None else []
    for server in servers[0]:
        server.on_finish = prefilled if link is not None else next_client
    if link is not None:
        for server in servers[1]:
            server.on_finish = next_client
    if workload.arrival is None:
        assert workload.concurrency is not None
        for server in servers[-1]:
            server.finish_seen_elsewhere = True
        for _ in range(min(workload.concurrency, n)):
            route(0, make_request(0.0))
    else:
        arrivals = workload.arrival.tolist()
        plan = planned_routes(entry.router, len(servers[0]), n)
        if plan is None:
            watchers = [NextArrival(arrivals)] * len(servers[0])
            watched = [watchers[0]] * n
        else:
            chosen = plan.tolist()
            watchers = [NextArrival([t for t, c in zip(arrivals, chosen, strict=True) if c == i])
                        for i in range(len(servers[0]))]
            watched = [watchers[c] for c in chosen]
        for server, watcher in zip(servers[0], watchers, strict=True):
            server.horizon = watcher
        env.process(_arrive(env, arrivals, watched, lambda t: route(0, make_request(t))))
    env.run(until=time_limit)
    for pool_servers in servers:
        for server in pool_servers:
            server.close()
    for request in requests:
        request.output_tokens = outputs[request.id]  # those still prefilling at the time limit
    log, step_server = merge_logs([server.log for pool_servers in servers for server in pool_servers])
    columns: dict[str, np.ndarray] = {}
    if link is None:
        columns["replica"] = np.array(served[0][:len(requests)], dtype=np.int64)
    else:
        columns["prefill_server"] = np.array(served[0][:len(requests)], dtype=np.int64)
        columns["decode_server"] = np.array(served[1][:len(requests)], dtype=np.int64)
        columns["prefill_end"] = np.array(prefill_end[:len(requests)])
        columns["transfer_start"] = np.array(transfer_start[:len(requests)])
        columns["transfer_end"] = np.array(transfer_end[:len(requests)])
    fleet = FleetResult([pool.role for pool in pools for _ in pool.policies], step_server, columns,
                        [pool.kv_blocks for pool in pools for _ in pool.policies])
    return RequestColumns.from_requests(requests), log, env.now, fleet


def _arrive(env: Clock, arrivals: list[float], watched: list[NextArrival],
            route: Callable[[float], Any]) -> Generator[simpy.Event, Any, None]:
    """Each arrival routed at its time; `watched[i]` is the horizon that waited for arrival i."""
    for i, t in enumerate(arrivals):
        if t > env.now:
            yield env.arrival_timeout(t - env.now)
        route(t)
        # Said before the clock moves on, so no server runs past an arrival it has not seen.
        watched[i].passed()


def merge_logs(logs: list[StepLog]) -> tuple[StepLog, np.ndarray]:
    """One step log of several servers' (their steps one server after another; token steps and
    runs renumbered to match) and the server of each step."""
    merged = StepLog()
    step_offset = lazy_offset = 0
    servers = []
    for index, log in enumerate(logs):
        merged.times.extend(log.times)
        merged.counts.extend(log.counts)
        merged.token_request.extend(log.token_request)
        merged.run_request.extend(log.run_request)
        merged.run_count.extend(log.run_count)
        _extend_shifted(merged.cache_step, log.cache_step, step_offset)
        merged.cache_queried.extend(log.cache_queried)
        merged.cache_hit.extend(log.cache_hit)
        _extend_shifted(merged.token_step, log.token_step, step_offset)
        _extend_shifted(merged.lazy_step, log.lazy_step, step_offset)
        _extend_shifted(merged.run_first, log.run_first, lazy_offset)
        servers.append(np.full(len(log), index, dtype=np.int64))
        step_offset += len(log)
        lazy_offset += len(log.lazy_step)
    return merged, np.concatenate(servers) if servers else np.zeros(0, dtype=np.int64)


def _extend_shifted(target: array, values: array, offset: int) -> None:
    target.frombytes((np.frombuffer(values, dtype=np.int32) + np.int32(offset)).astype(np.int32).tobytes()
                     if len(values) else b"")
