"""The test oracle: the straightforward engine, one SimPy event per step, every request touched.

It serves the same policies through the same view (`simulator.engine.step`), computing every view property
by walking the running set, and carries out each step literally: the running rows in admission order
(the decoders with one token each), each growing its KV and, when it cannot, preempting the victim
(most recently admitted, or the lowest-priority latest arrival) until it can or is itself the victim;
then the admissions; then one timeout for the step. `simulator.engine.server` must give the same tables to
the last bit (tests/test_engines.py).

With prefix caching every waiting request is looked up before every step; the rows' blocks are
taken from the free queue once the step's victims are known (a row preempted later in the walk
never took any), then the admissions take their hits and blocks, then the step's prefill rows
register their full blocks.

With a host tier, requests whose hit has a host part are hidden from the policy; after the step's
blocks are taken, unless it preempted, those the policy came to start loading in that order until one does not fit
(`KVBlocks.start_load`), leaving the queue; a list of (end, request) is the link, each load starting
when the one before ended. Before each step, the requests whose loads ended by then release their
blocks (cached) and rejoin the queue at its front; an idle server sleeps until the next load's end
at the latest.

With speculative decoding every decoding row grows its KV for k + 1 tokens and is priced as a
single-token row verifying k draft tokens; at the step's end it draws its verify step's uniform
afresh from its own stream (the j-th of `SeedSequence(seed, spawn_key=(6, id))`), accepts the
draft tokens whose cumulative acceptance exceeds it and emits them and one more, at most what its
output has left.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL, URGENT, Timeout

from simulator.cost import CostModel, StepShape
from simulator.engine.kv import KVBlocks
from simulator.engine.offload import HostTier
from simulator.engine.request import Request, RequestColumns
from simulator.engine.server import PolicyStalledError
from simulator.engine.speculation import Speculation
from simulator.engine.step import Policy, PolicyError, Step
from simulator.engine.steplog import StepLog
from simulator.fleet.engine import FleetResult, Pool, merge_logs
from simulator.fleet.transfer import KVLink
from simulator.run.sessions import SessionClients
from workloads import Workload
from workloads.prefixes import request_content


class ArrivalTimeout(Timeout):
    """Processed before ordinary events at the same instant (an arrival at a step's end is seen then);
    with a `priority` past NORMAL, after them (a fleet's servers' step ends, in server order)."""

    def __init__(self, env: simpy.Environment, delay: float, priority: int = URGENT) -> None:
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = delay
        self._ok = True
        env.schedule(self, priority, delay)


class Waiting:
    """The waiting queue: FCFS (preempted first) or sorted by (priority, arrival, id). The policy
    does not see the `hidden` requests (hits with a host part): those it would have come to, in
    order, are `passed`."""

    def __init__(self, priority: bool) -> None:
        self.items: list[Request] = []
        self.priority = priority
        self.hidden: set[Request] = set()
        self.passed: list[Request] = []

    def __iter__(self) -> Any:
        for request in self.items:
            if request in self.hidden:
                self.passed.append(request)
            else:
                yield request

    def __len__(self) -> int:
        return len(self.items)

    def first(self) -> Request:
        return next(iter(self))

    def push(self, request: Request, front: bool = False) -> None:
        if front and not self.priority:
            self.items.insert(0, request)
        else:
            self.items.append(request)
        if self.priority:
            self.items.sort(key=lambda r: (r.priority, r.arrival, r.id))


class OracleServer:
    def __init__(self, env: simpy.Environment, policy: Policy, cost: CostModel, kv: KVBlocks,
                 on_finish: Callable[[Request, float], None] | None = None,
                 speculation: Speculation | None = None, async_scheduling: bool = False,
                 output_lag: bool = False) -> None:
        self.env, self.policy, self.cost, self.kv, self.on_finish = env, policy, cost, kv, on_finish
        self.async_scheduling = async_scheduling
        # Output lag: the last step's first tokens and finishes (with their time), told to the
        # clients once the next step is known: at its end if it computes prompt tokens.
        self.output_lag = output_lag
        self.held: tuple[list[Request], list[tuple[Request, float]]] = ([], [])
        self.undecided = False  # the last step's outputs wait for the next step to be known
        self.unplanned: list[tuple[float, Request]] = []  # arrived after the plan of the step under way
        self.last_step = (-math.inf, -math.inf)  # (start, end) of the last step taken
        self.draft_tokens = 0 if speculation is None else speculation.num_tokens
        self.speculation = speculation
        self.verify_steps: dict[int, int] = {}
        self.waiting = Waiting(policy.scheduling == "priority")
        self.run_list: list[Request] = []  # admission order; a padded batch's finished rows stay
        self.batch: list[Request] | None = None
        self.batch_prompt = 0
        self.log = StepLog()
        if speculation is not None:
            self.log.spec_accepted = array("q", [0] * (speculation.num_tokens + 1))
        self.loads: list[tuple[float, Request]] = []  # host-tier loads in flight: (end, request)
        self.link_free = 0.0  # when the host link has carried every load asked of it
        self._wakeup = simpy.Store(env)
        self._sleeping = False
        self.priority = NORMAL
        self.process = env.process(self._serve())

    # The view, every property computed by walking.
    @property
    def now(self) -> float:
        return self.env.now

    @property
    def prefilling(self) -> Sequence[Request]:
        return [r for r in self.run_list if not r.is_decoding and not r.is_finished]

    @property
    def num_decoding(self) -> int:
        return sum(1 for r in self.run_list if r.is_decoding and not r.is_finished)

    @property
    def decode_blocks(self) -> int:
        return sum(self.kv.extra_blocks(r, r.computed + 1 + self.draft_tokens) for r in self.run_list
                   if r.is_decoding and not r.is_finished and not r.reserved_tokens)

    @property
    def num_running(self) -> int:
        return len(self.run_list)

    def is_youngest(self, request: Request) -> bool:
        return self.run_list[-1] is request

    def running(self) -> Sequence[Request]:
        return list(self.run_list)

    def blocks_to_finish(self) -> int:
        return sum(self.kv.extra_blocks(r, r.prompt_tokens + r.output_tokens) for r in self.run_list
                   if not r.is_finished)

    def submit(self, request: Request) -> None:
        if self.async_scheduling and not self._sleeping:
            self.unplanned.append((self.env.now, request))
            return
        self.waiting.push(request)
        if self._sleeping:
            self._sleeping = False
            self._wakeup.put(request.id)

    def _serve(self) -> Generator[simpy.Event, Any, None]:
        kv = self.kv
        while True:
            # Async scheduling: this step was planned when the last one started, if one ran up to now
            # with requests in flight; else it is planned now.
            start, end = self.last_step
            planned_at = start if end == self.env.now and self.run_list else math.inf
            while self.unplanned and self.unplanned[0][0] < planned_at:
                self.waiting.push(self.unplanned.pop(0)[1])
            ended = [request for end, request in self.loads if end <= self.env.now]
            self.loads = [(end, request) for end, request in self.loads if end > self.env.now]
            for request in ended:
                kv.release(request)
            for request in reversed(ended):
                self.waiting.push(request, front=True)
            if kv.caching:
                for request in self.waiting.items:
                    kv.look_up(request)
                self.waiting.hidden = set(kv.host_reads)
                kv.host_reads.clear()
            self.waiting.passed = []
            step = self.policy(self)
            rows = [(r, 1 if r.is_decoding and step.decode else step.tokens[r]) for r in self.run_list
                    if (step.decode and r.is_decoding and not r.is_finished) or r in step.tokens]
            rows = [(r, n + self.draft_tokens if r.is_decoding else n) for r, n in rows]
            admits = [(r, n) for r, n in step.tokens.items() if r not in self.run_list]
            if not rows and not admits:
                self._tell(self.held)
                self.undecided = False
                if self.unplanned:  # an idle scheduler plans with them now
                    for _, request in self.unplanned:
                        self.waiting.push(request)
                    self.unplanned = []
                    continue
                self._start_loads()
                wake_at = min(([step.wake_at] if step.wake_at is not None else []) + [end for end, _ in self.loads],
                              default=None)
                if wake_at is None and (self.waiting.items or self.run_list):
                    raise PolicyStalledError(
                        f"the policy scheduled nothing at t={self.env.now:.6f} s while {len(self.waiting)} requests "
                        f"waited and {len(self.run_list)} ran")
                self._sleeping = True
                get = self._wakeup.get()
                if wake_at is None:
                    yield get
                else:
                    yield get | self.env.timeout(wake_at - self.env.now)
                    if not get.triggered:
                        get.cancel()
                self._sleeping = False
                continue
            num_preempted = self._allocate(rows)
            queried, hit, host_hit = kv.queried_tokens, kv.hit_tokens, kv.host_hit_tokens
            for request, n in admits:
                self._admit(request, n, step)
            all_rows = rows + admits
            if kv.caching:
                for request, n in all_rows:
                    if not request.is_decoding:
                        kv.register(request, request.computed + n)
            if num_preempted:  # no load starts in a step that preempted
                self.waiting.passed = []
            self._start_loads()
            cache_stats = (kv.queried_tokens - queried, kv.hit_tokens - hit, kv.host_hit_tokens - host_hit)
            if step.batch is not None:
                self.batch, self.batch_prompt = [r for r, _ in admits], step.batch.prompt_len
                shape = StepShape.from_rows([(self.batch_prompt, self.batch_prompt)] * len(admits))
            elif self.batch is not None:
                live = [r for r in self.batch if not r.is_finished]
                position = self.batch_prompt + live[0].emitted
                shape = StepShape.from_rows([(1, position)] * len(self.batch))
            elif self.speculation is not None:
                verify = [r.computed + n for r, n in all_rows if r.is_decoding]
                shape = StepShape.from_rows([(n, r.computed + n) for r, n in all_rows if not r.is_decoding],
                                            len(verify), sum(verify), self.draft_tokens * len(verify))
            else:
                shape = StepShape.from_rows([(n, r.computed + n) for r, n in all_rows])
            start = self.env.now
            duration = self.cost.step_time(shape)
            carried, held_step = self.held, len(self.log) - 1
            lagged = self.undecided and sum(n for r, n in all_rows if not r.is_decoding) > 0  # prompt tokens
            self.held, self.undecided = ([], []), False
            if not lagged:  # the last step's outputs reach their clients at its end
                self._tell(carried)
            yield ArrivalTimeout(self.env, duration, self.priority)
            self.last_step = (start, self.env.now)
            if cache_stats[0]:
                self.log.cache_queries(len(self.log), *cache_stats)
            self._advance(all_rows, start, duration, shape, num_preempted)
            self.undecided = self.output_lag
            if lagged:  # at the end of this step
                self.log.held.append(held_step)
                for request in carried[0]:
                    request.first_token = self.env.now
                for request, _ in carried[1]:
                    request.finish = self.env.now
                self._tell(([], [(r, self.env.now) for r, _ in carried[1]]))

    def _tell(self, held: tuple[list[Request], list[tuple[Request, float]]]) -> None:
        """Finishes held back by output lag reach their clients, each at its time."""
        if held is self.held:
            self.held = ([], [])
        for request, at in held[1]:
            if self.on_finish is not None:
                self.on_finish(request, at)

    def _start_loads(self) -> None:
        """The hidden requests the policy came to load from the host tier in that order, until one
        does not fit, one after another on the link: blocks x block bytes / bandwidth each."""
        for request in self.waiting.passed:
            if request.blocks:
                continue
            started = self.kv.start_load(request)
            if started < 0:
                break
            if started:
                assert self.kv.host is not None
                self.waiting.items.remove(request)
                self.link_free = max(self.env.now, self.link_free) + (
                    request.host_loaded * self.kv.host.block_bytes / self.kv.host.bandwidth)
                self.loads.append((self.link_free, request))
        self.waiting.passed = []

    def _allocate(self, rows: list[tuple[Request, int]]) -> int:
        num_preempted = 0
        dropped: set[Request] = set()
        counted: dict[Request, int] = {}  # blocks set aside for a row; taken once the victims are known
        num_counted = 0
        for request, n in rows:
            if request in dropped:
                continue
            while (self.kv.extra_blocks(request, max(request.computed + n, request.reserved_tokens))
                   > self.kv.num_free - num_counted):
                victim = self._victim()
                self.run_list.remove(victim)
                num_counted -= counted.pop(victim, 0)
                self.kv.release(victim)
                victim.computed = 0
                victim.preemptions += 1
                self.waiting.push(victim, front=True)
                dropped.add(victim)
                num_preempted += 1
                if victim is request:
                    break
            else:
                counted[request] = self.kv.extra_blocks(request, request.computed + n)
                num_counted += counted[request]
        rows[:] = [(r, n) for r, n in rows if r not in dropped]
        for request, n in rows:
            self.kv.grow(request, request.computed + n)
        return num_preempted

    def _victim(self) -> Request:
        if self.waiting.priority:
            return max(self.run_list, key=lambda r: (r.priority, r.arrival, r.id))
        return self.run_list[-1]

    def _admit(self, request: Request, n: int, step: Step) -> None:
        if request not in self.waiting.items:
            raise PolicyError(f"request {request.id} is neither waiting nor running")
        self.waiting.items.remove(request)
        if self.kv.caching:
            self.kv.take_hit(request)
        needed = request.computed + n
        if step.batch is not None:
            request.reserved_tokens = step.batch.reserve_tokens
            needed = max(needed, request.reserved_tokens)
        self.kv.grow(request, needed)
        if math.isnan(request.scheduled):
            request.scheduled = self.env.now
        self.run_list.append(request)

    def _advance(self, rows: list[tuple[Request, int]], start: float, duration: float, shape: StepShape,
                 num_preempted: int) -> None:
        now, log = self.env.now, self.log
        index = len(log)
        decode = sum(1 + self.draft_tokens for r, _ in rows if r.is_decoding)
        for request, n in rows:
            if self.speculation is not None and request.is_decoding:
                self._verify(request, index)
                continue
            request.computed += n
            if request.num_pending == 0:
                request.emitted += 1
                log.token(request.id, index)
                if request.emitted == 1:
                    request.first_token = now
                    if self.output_lag:
                        self.held[0].append(request)
                if request.is_finished:
                    request.finish = now
                    self._finish(request)
        real = sum(n for _, n in rows)
        log.append(start, duration, len(rows), real - decode, decode, shape.num_tokens - real, self.kv.num_used,
                   len(self.waiting) + len(self.unplanned), len(self.run_list), num_preempted)

    def _verify(self, request: Request, index: int) -> None:
        assert self.speculation is not None
        step = self.verify_steps.get(request.id, 0)
        self.verify_steps[request.id] = step + 1
        stream = np.random.default_rng(np.random.SeedSequence(self.speculation.seed, spawn_key=(6, request.id)))
        uniform = stream.random(step + 1)[step]
        accepted = int(np.sum(uniform < np.cumprod(self.speculation.acceptance)))
        self.log.spec_accepted[accepted] += 1
        for _ in range(min(accepted + 1, request.output_tokens - request.emitted)):
            request.computed += 1
            request.emitted += 1
            self.log.token(request.id, index)
        if request.is_finished:
            request.finish = self.env.now
            self._finish(request)

    def _finish(self, request: Request) -> None:
        if self.batch is None:
            self.run_list.remove(request)
            self.kv.release(request)
        elif all(r.is_finished for r in self.batch):
            for member in self.batch:
                self.run_list.remove(member)
                self.kv.release(member)
            self.batch = None
        if self.output_lag:
            self.held[1].append((request, self.env.now))
        elif self.on_finish is not None:
            self.on_finish(request, self.env.now)


def run_oracle(policy: Policy, cost: CostModel, kv_blocks: int, block_size: int, workload: Workload,
               time_limit: float | None, prefix_caching: bool = False, speculation: Speculation | None = None,
               host: HostTier | None = None, async_scheduling: bool = False, output_lag: bool = False
               ) -> tuple[RequestColumns, StepLog, float]:
    env = simpy.Environment()
    requests: list[Request] = []
    priorities = workload.priority.tolist() if workload.priority is not None else [0] * workload.num_requests

    def make_request(arrival: float, i: int | None = None) -> Request:
        i = len(requests) if i is None else i
        requests.append(Request(len(requests), arrival, int(workload.prompt_tokens[i]),
                                int(workload.output_tokens[i]), priorities[i]))
        requests[-1].content = request_content(workload.content, i, int(workload.output_tokens[i]))
        return requests[-1]

    if workload.turns > 1:
        def send(i: int, at: float) -> Request:
            request = make_request(at, i)
            server.submit(request)
            return request

        clients = SessionClients(env, workload, send, lambda delay: ArrivalTimeout(env, delay))
        server = OracleServer(env, policy, cost, KVBlocks(kv_blocks, block_size, prefix_caching, host),
                              on_finish=clients.on_finish, speculation=speculation,
                              async_scheduling=async_scheduling, output_lag=output_lag)
        clients.start()
    elif workload.arrival is None:
        def next_client(_finished: Request, at: float) -> None:
            if len(requests) < workload.num_requests:
                server.submit(make_request(at))

        server = OracleServer(env, policy, cost, KVBlocks(kv_blocks, block_size, prefix_caching, host),
                              on_finish=next_client, speculation=speculation,
                              async_scheduling=async_scheduling, output_lag=output_lag)
        assert workload.concurrency is not None
        for _ in range(min(workload.concurrency, workload.num_requests)):
            server.submit(make_request(0.0))
    else:
        server = OracleServer(env, policy, cost, KVBlocks(kv_blocks, block_size, prefix_caching, host),
                              speculation=speculation,
                              async_scheduling=async_scheduling, output_lag=output_lag)

        def arrive() -> Generator[simpy.Event, Any, None]:
            for t in workload.arrival.tolist():  # type: ignore[union-attr]
                if t > env.now:
                    yield ArrivalTimeout(env, t - env.now)
                server.submit(make_request(t))

        env.process(arrive())

    env.run(until=time_limit)
    return RequestColumns.from_requests(requests), server.log, env.now


class OracleLoad:
    """An oracle server as a router reads it, every count by walking."""

    def __init__(self, server: OracleServer) -> None:
        self.server = server

    @property
    def num_requests(self) -> int:
        return len(self.server.waiting) + len(self.server.unplanned) + len(self.server.run_list)

    @property
    def kv_share(self) -> float:
        return sum(r.blocks for r in self.server.run_list) / self.server.kv.num_blocks

    def cached_tokens(self, request: Request) -> int:
        return self.server.kv.cached_tokens(request)


def run_oracle_fleet(pools: list[Pool], link: KVLink | None, workload: Workload, time_limit: float | None,
                     on_step: Callable[[int, float], None] | None = None
                     ) -> tuple[RequestColumns, StepLog, float, FleetResult]:
    """Colocated replicas of oracle servers, each arrival (or closed-loop client's next request)
    routed by the pool's router from the servers' walked state; each speculating as the pool says."""
    assert link is None and len(pools) == 1, "the oracle fleet is colocated replicas"
    pool = pools[0]
    env = simpy.Environment()
    requests: list[Request] = []
    replica: list[int] = []
    priorities = workload.priority.tolist() if workload.priority is not None else [0] * workload.num_requests

    def route(arrival: float) -> None:
        i = len(requests)
        request = Request(i, arrival, int(workload.prompt_tokens[i]), int(workload.output_tokens[i]), priorities[i])
        request.content = request_content(workload.content, i, int(workload.output_tokens[i]))
        requests.append(request)
        chosen = pool.router(loads, request)
        replica.append(chosen)
        servers[chosen].submit(request)

    def next_client(_finished: Request, at: float) -> None:
        if workload.arrival is None and len(requests) < workload.num_requests:
            route(at)

    servers = [OracleServer(env, policy, pool.cost, KVBlocks(pool.kv_blocks, pool.block_size, pool.prefix_caching),
                            on_finish=next_client, speculation=pool.speculation,
                            async_scheduling=pool.async_scheduling, output_lag=pool.output_lag)
               for policy in pool.policies]
    for index, server in enumerate(servers):
        server.priority = NORMAL + index
    loads = [OracleLoad(server) for server in servers]
    if workload.arrival is None:
        assert workload.concurrency is not None
        for _ in range(min(workload.concurrency, workload.num_requests)):
            route(0.0)
    else:
        def arrive() -> Generator[simpy.Event, Any, None]:
            for t in workload.arrival.tolist():  # type: ignore[union-attr]
                if t > env.now:
                    yield ArrivalTimeout(env, t - env.now)
                route(t)

        env.process(arrive())
    env.run(until=time_limit)
    log, step_server = merge_logs([server.log for server in servers])
    fleet = FleetResult([pool.role] * len(servers), step_server, {"replica": np.array(replica, dtype=np.int64)},
                        [pool.kv_blocks] * len(servers))
    return RequestColumns.from_requests(requests), log, env.now, fleet
