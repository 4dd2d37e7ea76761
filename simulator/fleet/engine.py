"""A fleet in one SimPy clock: pools of servers behind routers, and the KV link between two pools.
A run's clients send to a `Fleet` as they would to one `Server` (`simulator.run.driver` runs both).

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
(`Server.stretch_kv`), and, under output lag, the blocks of a decode step being launched as the
last step's finishes are told (`Server.launching`): an overlap scheduler launches the next step,
its KV taken, before it processes the last one's outputs (`simulator.engine.delivery`).
Closed-loop clients send from any server's finish, and transfers land from prefill servers'
steps, so closed-loop servers and decode servers keep the clock's next event.
tests/test_fleet.py checks a fleet against a one-event-per-step fleet of oracle servers bit for bit.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from simpy.events import NORMAL

from simulator.cost import CostModel
from simulator.engine.clock import Clock
from simulator.engine.kv import KVBlocks
from simulator.engine.offload import HostTier
from simulator.engine.request import Request
from simulator.engine.server import Process, Server
from simulator.engine.speculation import Speculation
from simulator.engine.step import Policy
from simulator.engine.steplog import RUN, TOKEN, StepLog
from simulator.fleet.routers import Router, planned_routes
from simulator.fleet.transfer import KVLink, links


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
    host: HostTier | None = None
    """Its servers' KV host tier (`--kv-offload-gb`; one server only: `simulator.config`)."""
    speculation: Speculation | None = None
    """Its servers' speculative decoding (`simulator.engine.speculation`), or None: every server
    verifies with the same settings, each request drawing from its own stream wherever it runs."""
    async_scheduling: bool = False
    """Its servers plan each step while the one before it runs (`simulator.engine.server`)."""
    output_lag: bool = False
    """Its servers' outputs wait for the next step when it computes prompt tokens (`simulator.engine.delivery`)."""


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
    """A server as a router reads it: waiting (planned or not yet) + running, and KV in use at the
    clock's instant."""

    def __init__(self, server: Server) -> None:
        self.server = server

    @property
    def num_requests(self) -> int:
        return len(self.server.waiting) + len(self.server.unplanned) + self.server.num_running

    @property
    def kv_share(self) -> float:
        kv = self.server.kv
        return (kv.num_used + self._taken_mid_stretch()) / kv.num_blocks

    def cached_tokens(self, request: Request) -> int:
        return self.server.kv.cached_tokens(request, self._taken_mid_stretch())

    def _taken_mid_stretch(self) -> int:
        """Blocks the steps of a decode stretch in flight that started before now took already, or
        those of a decode step being launched (`Server.launching`)."""
        server = self.server
        if server.stretch_kv is None:
            return server.launching
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


class Fleet:
    """The pools' servers on one clock, what clients send to: each request is routed into the entry
    pool and, for P/D, once prefilled, on across the KV link to the decode pool (the module
    docstring). `on_finish` is the clients' (None: none waits for a reply); `arrivals`, when given,
    are the instants the requests will be sent, in order: the entry servers' horizons."""

    def __init__(self, env: Clock, pools: list[Pool], link: KVLink | None, num_requests: int,
                 time_limit: float | None, on_step: Callable[[int, float], None] | None,
                 on_finish: Callable[[Request, float], None] | None, arrivals: list[float] | None) -> None:
        self.env, self.pools, self.link, self.on_step = env, pools, link, on_step
        progress = self._progress if on_step is not None else None
        self.servers = [[Server(env, policy, pool.cost, KVBlocks(pool.kv_blocks, pool.block_size, pool.prefix_caching),
                                StepLog(), time_limit, on_step=progress, speculation=pool.speculation,
                                async_scheduling=pool.async_scheduling, output_lag=pool.output_lag)
                        for policy in pool.policies]
                        for pool in pools]
        for index, server in enumerate(server for pool_servers in self.servers for server in pool_servers):
            server.priority = NORMAL + index
        self.loads = [[ServerLoad(server) for server in pool_servers] for pool_servers in self.servers]
        self.served = [[-1] * num_requests for _ in pools]
        """The server (fleet index) of each request id in each pool."""
        self.first_index = [0, len(pools[0].policies)]
        self.prefill_end, self.transfer_start, self.transfer_end = ([math.nan] * num_requests for _ in range(3))
        self.outputs: dict[Request, int] = {}
        """The output lengths of requests sent to a prefill pool, which computes one token of each."""
        self.wires = links(env, len(pools[0].policies)) if link is not None else []
        self.replying = -1
        """The server whose finish the clients are being told of (-1: none)."""
        self.clients_finish = on_finish
        reply = self._reply if on_finish is not None else None
        for server in self.servers[0]:
            server.on_finish = self._prefilled if link is not None else reply
        if link is not None:
            for server in self.servers[1]:
                server.on_finish = reply
        if on_finish is not None:
            for server in self.servers[-1]:
                server.stretch_stops_at_each_finish = True  # its finishes route the closed loop's next requests
        self.watched = self._watch(arrivals) if arrivals is not None else None
        """Arrival i's horizon, told when it has been routed."""

    def _watch(self, arrivals: list[float]) -> list[NextArrival]:
        """Each entry server's horizon: the next arrival, or under a router that reads no state,
        the next one routed to it."""
        entry = self.servers[0]
        plan = planned_routes(self.pools[0].router, len(entry), len(arrivals))
        if plan is None:
            watcher = NextArrival(arrivals)
            for server in entry:
                server.horizon = watcher
            return [watcher] * len(arrivals)
        chosen = plan.tolist()
        watchers = [NextArrival([t for t, c in zip(arrivals, chosen, strict=True) if c == i])
                    for i in range(len(entry))]
        for server, own in zip(entry, watchers, strict=True):
            server.horizon = own
        return [watchers[c] for c in chosen]

    def submit(self, request: Request, at: float | None = None) -> None:
        """The entry pool's router picks a server for `request` (sent at `at` from the finish of
        server `replying`, when a closed-loop client sends it)."""
        if self.link is not None:
            self.outputs[request] = request.output_tokens
            request.output_tokens = 1
        i = self._route(0, request)
        if at is not None and self.replying > i:
            # Sent from a later server's step end at the instant one of server i's priced steps
            # ends: processed after that step, so counted in the next one's queue.
            at = math.nextafter(at, math.inf)
        self.servers[0][i].submit(request, at)
        if self.watched is not None:
            # Said before the clock moves on, so no server runs past an arrival it has not seen.
            self.watched[request.id].passed()

    def _route(self, pool: int, request: Request) -> int:
        i = self.pools[pool].router(self.loads[pool], request)
        self.served[pool][request.id] = self.first_index[pool] + i
        return i

    def _progress(self, _finished: int, at: float) -> None:
        assert self.on_step is not None
        self.on_step(sum(server.num_finished for server in self.servers[-1]), at)

    def _reply(self, request: Request, at: float) -> None:
        """The clients are told of a finish on the server that served `request` last."""
        assert self.clients_finish is not None
        self.replying = max(self.served[0][request.id], self.served[-1][request.id])
        self.clients_finish(request, at)
        self.replying = -1

    def _prefilled(self, request: Request, at: float) -> None:
        output = self.outputs.pop(request)
        if output == 1:
            if self.clients_finish is not None:
                self._reply(request, at)
            return
        request.output_tokens = output
        request.finish = request.first_token = math.nan  # the client has it when its KV has crossed
        self.prefill_end[request.id] = at
        target = self._route(1, request)
        self.env.process(self._ship(request, self.served[0][request.id], target))

    def _ship(self, request: Request, source: int, target: int) -> Process:
        assert self.link is not None
        env = self.env
        with self.wires[source].request() as slot:
            yield slot
            self.transfer_start[request.id] = env.now
            yield env.timeout(self.link.transfer_time(request.prompt_tokens))
            self.transfer_end[request.id] = env.now
        request.first_token = env.now  # the client has it with the KV, from the decode side
        self.servers[1][target].submit(request)

    def close(self) -> None:
        """After the clock stopped: every server's requests brought up to date, and those still
        prefilling given back their output lengths."""
        for pool_servers in self.servers:
            for server in pool_servers:
                server.close()
        for request, output in self.outputs.items():
            request.output_tokens = output

    def result(self, num_requests: int) -> tuple[StepLog, FleetResult]:
        """The merged step log, and which servers served the first `num_requests` requests."""
        log, step_server = merge_logs([server.log for pool_servers in self.servers for server in pool_servers])
        served = [np.array(ids[:num_requests], dtype=np.int64) for ids in self.served]
        columns: dict[str, np.ndarray] = {}
        if self.link is None:
            columns["replica"] = served[0]
        else:
            columns["prefill_server"], columns["decode_server"] = served
            columns["prefill_end"] = np.array(self.prefill_end[:num_requests])
            columns["transfer_start"] = np.array(self.transfer_start[:num_requests])
            columns["transfer_end"] = np.array(self.transfer_end[:num_requests])
        pools = self.pools
        return log, FleetResult([pool.role for pool in pools for _ in pool.policies], step_server, columns,
                                [pool.kv_blocks for pool in pools for _ in pool.policies])


def merge_logs(logs: list[StepLog]) -> tuple[StepLog, np.ndarray]:
    """One step log of several servers' (their steps one server after another; token steps and
    runs renumbered to match) and the server of each step."""
    merged = StepLog()
    step_offset = decode_offset = 0
    servers = []
    for index, log in enumerate(logs):
        merged.rows += log.rows
        merged.tokens += _shifted(log.tokens, TOKEN, "token_step", step_offset)
        merged.runs += _shifted(log.runs, RUN, "run_first", decode_offset)
        _extend_shifted(merged.cache_step, log.cache_step, step_offset)
        merged.cache_queried.extend(log.cache_queried)
        merged.cache_hit.extend(log.cache_hit)
        merged.cache_host_hit.extend(log.cache_host_hit)
        _extend_shifted(merged.decode_step, log.decode_step, step_offset)
        _extend_shifted(merged.held, log.held, step_offset)
        _add_counts(merged.spec_accepted, log.spec_accepted)
        servers.append(np.full(len(log), index, dtype=np.int64))
        step_offset += len(log)
        decode_offset += len(log.decode_step)
    return merged, np.concatenate(servers) if servers else np.zeros(0, dtype=np.int64)


def _add_counts(total: array, counts: array) -> None:
    """`counts` added into `total` element by element (an empty `total` takes them as they are)."""
    if not len(total):
        total.extend(counts)
        return
    assert len(counts) in (0, len(total)), "every speculating server drafts the same k tokens"
    for i, count in enumerate(counts):
        total[i] += count


def _shifted(rows: bytearray, row: np.dtype, name: str, offset: int) -> bytes:
    """Packed `rows` of dtype `row` with `offset` added to their column `name`."""
    table = np.frombuffer(rows, dtype=row).copy()
    table[name] += np.int32(offset)
    return table.tobytes()


def _extend_shifted(target: array, values: array, offset: int) -> None:
    target.frombytes((np.frombuffer(values, dtype=np.int32) + np.int32(offset)).astype(np.int32).tobytes()
                     if len(values) else b"")
