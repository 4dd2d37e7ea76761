"""The SimPy engine: an arrival process feeding one GPU server process.

Each server is one process over its own state (queue, running set, KV blocks), so a fleet of
servers behind a router is more processes, not a rewrite. The server's loop is the whole engine:
ask the policy, charge the cost, advance the requests, log the step.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

from simulator.cost import CostModel, StepShape
from simulator.errors import InputError
from simulator.kv import BlockManager
from simulator.request import Request
from simulator.step import Policy, Step


class PolicyError(RuntimeError):
    """A policy returned a step the engine cannot carry out."""


class PolicyStalledError(InputError):
    """A policy scheduled nothing while work was waiting: its settings cannot serve this workload."""


@dataclass
class StepLog:
    """One entry per forward pass, plus where every output token was emitted.

    Tokens are kept as flat arrays, never per-token objects, in two forms: single tokens as
    (request, step), and runs of consecutive "lazy decode" steps as (request, first, count) over
    `lazy_step`, which lists the step index of each such step (the fast engine's decoders emit one
    token in every one of them without being touched). The reference engine logs singles only.
    """

    start: array = field(default_factory=lambda: array("d"))
    duration: array = field(default_factory=lambda: array("d"))
    num_seqs: array = field(default_factory=lambda: array("q"))
    prefill_tokens: array = field(default_factory=lambda: array("q"))
    decode_tokens: array = field(default_factory=lambda: array("q"))
    padded_tokens: array = field(default_factory=lambda: array("q"))
    kv_blocks_used: array = field(default_factory=lambda: array("q"))
    num_waiting: array = field(default_factory=lambda: array("q"))
    num_running: array = field(default_factory=lambda: array("q"))
    num_preempted: array = field(default_factory=lambda: array("q"))
    token_request: array = field(default_factory=lambda: array("q"))
    token_step: array = field(default_factory=lambda: array("q"))
    run_request: array = field(default_factory=lambda: array("q"))
    run_first: array = field(default_factory=lambda: array("q"))
    run_count: array = field(default_factory=lambda: array("q"))
    lazy_step: array = field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.start)

    def column(self, name: str) -> np.ndarray:
        """A column as a numpy array over the same memory (float64 or int64, as it is stored)."""
        values: array = getattr(self, name)
        dtype = np.float64 if values.typecode == "d" else np.int64
        return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype=dtype)


class Server:
    """One GPU: waiting queue, running set in admission order, KV blocks, a policy, a cost model."""

    def __init__(self, env: simpy.Environment, policy: Policy, cost: CostModel, kv: BlockManager,
                 on_finish: Callable[[Request], None] | None = None) -> None:
        self.env = env
        self.policy = policy
        self.cost = cost
        self._kv = kv
        self.on_finish = on_finish
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._groups: dict[int, int] = {}  # static batch id -> members not yet finished
        self.log = StepLog()
        self._wakeup = simpy.Store(env)
        self._sleeping = False
        self.process = env.process(self._serve())

    # The read-only view a policy gets.
    @property
    def now(self) -> float:
        return self.env.now

    @property
    def waiting(self) -> Sequence[Request]:
        return self._waiting

    @property
    def running(self) -> Sequence[Request]:
        return self._running

    @property
    def kv(self) -> BlockManager:
        return self._kv

    def submit(self, request: Request) -> None:
        self._waiting.append(request)
        if self._sleeping:
            self._sleeping = False
            self._wakeup.put(request.id)

    def _serve(self):  # type: ignore[no-untyped-def]
        while True:
            step = self.policy(self)
            if not step.tokens:
                yield from self._sleep(step.wake_at)
                continue
            num_preempted = self._allocate(step)
            shape = StepShape.from_rows(step.cost_rows if step.cost_rows is not None
                                        else [(n, r.computed + n) for r, n in step.tokens.items()])
            start = self.env.now
            duration = self.cost.step_time(shape)
            yield self.env.timeout(duration)
            self._advance(step, start, duration, shape, num_preempted)

    def _sleep(self, wake_at: float | None):  # type: ignore[no-untyped-def]
        if wake_at is None and (self._waiting or self._running):
            raise PolicyStalledError(
                f"the policy scheduled nothing at t={self.env.now:.6f} s while {len(self._waiting)} requests "
                f"waited and {len(self._running)} ran")
        self._sleeping = True
        get = self._wakeup.get()
        if wake_at is None:
            yield get
        else:
            if wake_at <= self.env.now:
                raise PolicyError(f"the policy asked to sleep until t={wake_at}, which is not after now "
                                  f"(t={self.env.now})")
            yield get | self.env.timeout(wake_at - self.env.now)
            if not get.triggered:
                get.cancel()
        self._sleeping = False

    def _allocate(self, step: Step) -> int:
        """Give every request in the step the KV blocks it needs, running ones first; when a running
        request cannot grow, preempt the most recently admitted one (possibly itself)."""
        tokens = step.tokens
        assert isinstance(tokens, dict), "a step's tokens must be a dict the engine may edit"
        running = set(self._running)
        admitting = False
        num_preempted = 0
        for request, n in list(tokens.items()):
            if request not in tokens:  # preempted earlier in this loop
                continue
            if not 1 <= n <= request.num_pending:
                raise PolicyError(f"request {request.id} was given {n} tokens with {request.num_pending} pending")
            needed = max(request.computed + n, request.reserved_tokens)
            if request not in running:
                admitting = True
                self._admit(request, needed, step)
                continue
            if admitting:
                raise PolicyError(f"running request {request.id} comes after a waiting one in the step")
            while not self._kv.can_hold(request.id, needed):
                victim = self._running[-1]
                self._preempt(victim)
                tokens.pop(victim, None)
                num_preempted += 1
                if victim is request:
                    break
            else:  # no break: the request keeps its place and grows
                self._kv.grow(request.id, needed)
        return num_preempted

    def _admit(self, request: Request, needed: int, step: Step) -> None:
        try:
            self._waiting.remove(request)
        except ValueError:
            raise PolicyError(f"request {request.id} is neither waiting nor running") from None
        if step.reserve is not None:
            request.reserved_tokens = step.reserve[request]
            needed = max(needed, request.reserved_tokens)
            request.group = len(self.log)
            self._groups[request.group] = self._groups.get(request.group, 0) + 1
        if not self._kv.can_hold(request.id, needed):
            raise PolicyError(f"request {request.id} was admitted needing {self._kv.extra_blocks(request.id, needed)}"
                              f" KV blocks with {self._kv.num_free} free")
        self._kv.grow(request.id, needed)
        if math.isnan(request.scheduled):
            request.scheduled = self.env.now
        self._running.append(request)

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop its KV; tokens already emitted stay emitted."""
        self._running.remove(request)
        self._kv.release(request.id)
        request.computed = 0
        request.preemptions += 1
        self._waiting.appendleft(request)

    def _advance(self, step: Step, start: float, duration: float, shape: StepShape, num_preempted: int) -> None:
        now = self.env.now
        log = self.log
        step_index = len(log)
        decode = sum(1 for request in step.tokens if request.is_decoding)
        for request, n in step.tokens.items():
            request.computed += n
            if request.num_pending == 0:
                request.emitted += 1
                log.token_request.append(request.id)
                log.token_step.append(step_index)
                if request.emitted == 1:
                    request.first_token = now
                if request.is_finished:
                    request.finish = now
                    self._finish(request)
        real_tokens = sum(step.tokens.values())
        log.start.append(start)
        log.duration.append(duration)
        log.num_seqs.append(len(step.tokens))
        log.decode_tokens.append(decode)
        log.prefill_tokens.append(real_tokens - decode)
        log.padded_tokens.append(shape.num_tokens - real_tokens)
        log.kv_blocks_used.append(self._kv.num_used)
        log.num_waiting.append(len(self._waiting))
        log.num_running.append(len(self._running))
        log.num_preempted.append(num_preempted)

    def _finish(self, request: Request) -> None:
        if request.group is None:
            self._running.remove(request)
            self._kv.release(request.id)
        else:
            self._groups[request.group] -= 1
            if self._groups[request.group] == 0:
                del self._groups[request.group]
                members = [r for r in self._running if r.group == request.group]
                for member in members:
                    self._running.remove(member)
                    self._kv.release(member.id)
        if self.on_finish is not None:
            self.on_finish(request)
