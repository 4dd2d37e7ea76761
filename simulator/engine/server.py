"""One GPU server as a SimPy process: ask the policy, allocate KV, charge the cost, advance, log.

The running set is split in two: the decoders, one aggregate (`simulator.engine.decoders`) that no step
walks, and the explicit requests, which still have prompt to compute (`prefilling`). A step names the
explicit rows and admissions and says whether the decoders run (`simulator.engine.step`). The server

1. asks the policy for the step (`self` is the policy's view);
2. allocates KV: explicit rows grow, the decoders take the blocks their boundary crossings need,
   and when that does not fit the running set is preempted from its back (`simulator.engine.queues`:
   most recently admitted, or lowest priority) until it does. Walking the running set in admission
   order while preempting from the back always leaves a prefix, so the victims are the shortest
   such suffix and nobody is walked;
3. charges the step's cost and waits for it on the SimPy clock;
4. advances the requests: explicit rows compute their tokens, the decoders' step count goes up, those
   finishing leave; explicit requests that now decode join the aggregate;
5. logs the step.

With prefix caching (`simulator.engine.kv`) an admission first takes the cached prefix of its prompt, and
once the step's blocks are allocated its prefill rows register their full blocks in the cache.

A decode-only step (only the decoders, nothing admitted or preempted) is priced for the k steps it
repeats until the next event: a finish (the decoders' heap), a KV shortfall (blocks needed per step
by residue), the eviction of part of a prefix-cache hit the policy read, the time limit, or the next
event that could see it (`horizon`: the clock's next event, an arrival; in a fleet the next arrival
only, since other servers' step ends cannot); the k steps are one SimPy timeout
(`simulator.engine.stretch`). A step with no event before its end and no finish is carried out without
a timeout at all (the clock's next event is later, so nothing could see it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy
from simpy.events import NORMAL

from simulator.cost import CostModel, StepShape
from simulator.engine.clock import Clock
from simulator.engine.decoders import Decoders
from simulator.engine.kv import KVBlocks, WaitingWithHits
from simulator.engine.queues import make_queues
from simulator.engine.request import Request
from simulator.engine.step import PaddedBatch, Policy, Step
from simulator.engine.steplog import StepLog
from simulator.errors import InputError

Process = Generator[simpy.Event, Any, None]


class PolicyError(RuntimeError):
    """A policy returned a step the engine cannot carry out."""


class PolicyStalledError(InputError):
    """A policy scheduled nothing while work was waiting: its settings cannot serve this workload."""


@dataclass
class Batch:
    """A padded batch: every row computed as `prompt_len` long, all held until the last finishes."""

    members: list[Request]
    prompt_len: int
    last_step: int
    """The decoders' step count after the batch's last decode step."""
    decoding_since: int
    """The decoders' step count when the batch's decoding began."""
    live: int

    def position(self, steps: int) -> int:
        """Context after the next decode step, every row padded to the longest prompt."""
        return self.prompt_len + 1 + steps - self.decoding_since


class Server:
    """A GPU: waiting queue, running set, KV blocks, a policy and a cost model, as a SimPy process."""

    def __init__(self, env: Clock, policy: Policy, cost: CostModel, kv: KVBlocks, log: StepLog,
                 time_limit: float | None = None, on_finish: Callable[[Request, float], None] | None = None,
                 on_step: Callable[[int, float], None] | None = None) -> None:
        self.env = env
        self.policy = policy
        self.cost = cost
        self.log = log
        self.limit = math.inf if time_limit is None else time_limit
        self.on_finish = on_finish
        self.on_step = on_step
        """Told (requests finished, clock) before every step: a progress bar."""
        self.num_finished = 0
        self._waiting, self._order = make_queues(policy.scheduling)
        # The policy's view reads these two as they are (the rest of it below, as properties).
        self.kv = kv
        self.waiting: Any = WaitingWithHits(self._waiting, kv) if kv.caching else self._waiting
        self.decoders = Decoders(kv.block_size, log)
        self.explicit: list[Request] = []
        self.batch: Batch | None = None
        self.clock = env.now
        """The server's time: ahead of `env.now` after steps carried out without a timeout."""
        self.submitted: list[float] | None = None
        """When requests were submitted while a decode stretch is waited for (None between stretches)."""
        self.priority: int = NORMAL
        """Of its timeouts among events at the same instant (a fleet orders servers by index)."""
        self.horizon: Callable[[], float] = env.peek
        """The next instant another process could read or change this server: by default the clock's
        next event; a fleet open loop's next arrival (`simulator.fleet.engine`)."""
        self.finish_seen_elsewhere = False
        """A finish is seen by other servers at its instant (a fleet's closed-loop client routes its
        next request then): a padded batch's stretch stops at each member's finish, not its last."""
        self.stretch_kv: tuple[Sequence[float], Sequence[int]] | None = None
        """While a decode stretch is waited for: its step ends and the KV blocks its steps took by
        then (cumulative), which it commits at its end; a router reads the blocks held mid-stretch."""
        self._admissions = 0
        self._wakeup = simpy.Store(env)
        self._sleeping = False
        self.process = env.process(self._serve())

    # -- the policy's view --------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock

    @property
    def prefilling(self) -> Sequence[Request]:
        return self.explicit

    @property
    def num_decoding(self) -> int:
        return self.decoders.count

    @property
    def decode_blocks(self) -> int:
        return self.decoders.blocks_needed()

    @property
    def num_running(self) -> int:
        held = len(self.batch.members) - self.batch.live if self.batch is not None else 0
        return self.decoders.count + len(self.explicit) + held

    def is_youngest(self, request: Request) -> bool:
        return self._order.youngest() is request

    def running(self) -> Sequence[Request]:
        self.make_explicit()
        return self.explicit

    # -- the server ---------------------------------------------------------------------------------
    def submit(self, request: Request, at: float | None = None) -> None:
        """A request joins the waiting queue (at `at`, or now)."""
        self._waiting.push(request)
        if self.submitted is not None:
            self.submitted.append(self.env.now if at is None else at)
        if self._sleeping:
            self._sleeping = False
            self._wakeup.put(request.id)

    def make_explicit(self) -> None:
        """Every decoder out of the aggregate, its state brought up to date (O(batch))."""
        if self.decoders.count:
            evicted = sorted(self.decoders.members, key=_admitted)
            for request in evicted:
                self.decoders.leave(request)
            self.explicit = sorted(self.explicit + evicted, key=_admitted)

    def _serve(self) -> Process:
        from simulator.engine.stretch import decode_stretch

        on_step, policy, read_hits = self.on_step, self.policy, self.kv.read_hits
        while True:
            if on_step is not None:
                on_step(self.num_finished, self.clock)
            read_hits.clear()
            step = policy(self)
            decode = step.decode and self.decoders.count > 0
            if not step.tokens and not decode:
                yield from self._sleep(step.wake_at)
            elif not step.tokens and self.decoders.blocks_needed() <= self.kv.num_free:
                yield from decode_stretch(self, step.wake_at)
            else:
                yield from self._step(step)

    def _sleep(self, wake_at: float | None) -> Process:
        if wake_at is None and (len(self._waiting) or self.num_running):
            raise PolicyStalledError(
                f"the policy scheduled nothing at t={self.clock:.6f} s while {len(self._waiting)} requests "
                f"waited and {self.num_running} ran")
        if self.clock > self.env.now:
            yield self.env.timeout_at(self.clock, self.priority)
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
        self.clock = self.env.now

    def _split(self, step: Step) -> tuple[list[tuple[Request, int]], list[tuple[Request, int]]]:
        """The step's running rows and admissions, checked."""
        rows: list[tuple[Request, int]] = []
        admits: list[tuple[Request, int]] = []
        members = self.decoders.members
        for request, n in step.tokens.items():
            if not 1 <= n <= request.num_pending or request in members:
                raise PolicyError(f"request {request.id} was given {n} tokens with {request.num_pending} pending"
                                  if request not in members else
                                  f"decoder {request.id} was named in a step: decoders run through Step.decode, "
                                  "or one by one after view.running()")
            if request.admitted >= 0:
                if admits:
                    raise PolicyError(f"running request {request.id} comes after a waiting one in the step")
                rows.append((request, n))
            else:
                admits.append((request, n))
        if admits and self.batch is not None:
            raise PolicyError("requests were admitted while a padded batch runs")
        return rows, admits

    def _step(self, step: Step) -> Process:
        """One step of any kind, the decoders taking part as an aggregate."""
        rows, admits = self._split(step)
        decoders, log = self.decoders, self.log
        num_preempted = self._allocate(rows, step.decode and decoders.count > 0)
        kv = self.kv
        queried, hit = kv.queried_tokens, kv.hit_tokens
        for request, n in admits:
            self._admit(request, n, step.batch)
        num_lazy = decoders.count if step.decode else 0
        explicit_rows = rows + admits
        if kv.caching:
            for request, n in explicit_rows:
                if not (request.emitted and request.num_pending == 1):  # decode rows register at release
                    kv.register(request, request.computed + n)
        real = num_lazy
        num_decode = num_lazy
        for request, n in explicit_rows:
            real += n
            if n == 1 and request.emitted and request.num_pending == 1:
                num_decode += 1
        if step.batch is not None:
            shape = StepShape.from_rows([(step.batch.prompt_len, step.batch.prompt_len)] * len(admits))
            self._form_batch(admits, step.batch)
        elif self.batch is not None and num_lazy:
            rows_held = len(self.batch.members)
            shape = StepShape(rows_held, rows_held, rows_held * self.batch.position(decoders.steps))
        else:
            shape = StepShape.from_rows([(n, r.computed + n) for r, n in explicit_rows], num_lazy,
                                        decoders.decode_context if num_lazy else 0)
        start = self.clock
        duration = self.cost.step_time(shape)
        end = start + duration
        if end >= self.limit:
            yield self.env.timeout_at(end, self.priority)  # the clock stops first
            return
        index = len(log)
        finished = []
        if num_lazy:
            decoders.steps += 1
            log.lazy_step.append(index)
            finishing = decoders.pop_finished()
            if finishing:
                finished = [request for _, request in finishing]
        for request, n in explicit_rows:
            request.computed += n
            if request.computed == request.prompt_tokens + request.emitted:
                request.emitted += 1
                log.token_request.append(request.id)
                log.token_step.append(index)
                if request.emitted == 1:
                    request.first_token = end
                if request.emitted == request.output_tokens:
                    finished.append(request)
        if finished or end >= self.horizon():
            yield self.env.timeout_at(end, self.priority)
        self.clock = end
        if finished:
            finished.sort(key=_admitted)  # the step's order: admission order
            for request in finished:
                self.finish(request, end)
        if self.explicit:
            still = []
            for request in self.explicit:
                if request.emitted and request.num_pending == 1:
                    decoders.join(request)
                else:
                    still.append(request)
            self.explicit = still
        log.append(start, duration, num_lazy + len(explicit_rows), real - num_decode, num_decode,
                   shape.num_tokens - real, kv.num_used, len(self._waiting), self.num_running, num_preempted)
        if kv.queried_tokens != queried:
            log.cache_queries(index, kv.queried_tokens - queried, kv.hit_tokens - hit)

    def _allocate(self, rows: list[tuple[Request, int]], decode: bool) -> int:
        """KV for the running rows and the decoders; preempt from the back of the running set until
        it fits (see the module docstring). Returns how many were preempted."""
        kv, decoders = self.kv, self.decoders
        if not rows:  # a prefill step's admissions are allocated apart; only the decoders grow here
            need = decoders.blocks_needed() if decode else 0
            if need <= kv.num_free:
                kv.take(need)  # from the free queue's head, evicting cached blocks there
                return 0
        needs = {r: kv.extra_blocks(r, r.computed + n) for r, n in rows}
        need = (decoders.blocks_needed() if decode else 0) + sum(needs.values())
        num_preempted = 0
        if need > kv.num_free:
            dropped = set()
            while need > kv.num_free:
                victim = self._order.victim()
                if victim in decoders.members:
                    need -= int(decode and decoders.needs_block(victim))
                    decoders.leave(victim)
                else:
                    self.explicit.remove(victim)
                    need -= needs.pop(victim, 0)
                self._preempt(victim)
                dropped.add(victim)
                num_preempted += 1
            rows[:] = [(r, n) for r, n in rows if r not in dropped]
        if decode:
            kv.take(decoders.blocks_needed())
        for request, n in rows:
            kv.grow(request, request.computed + n)
        return num_preempted

    def _admit(self, request: Request, n: int, batch: PaddedBatch | None) -> None:
        try:
            self._waiting.remove(request)
        except (ValueError, KeyError, IndexError, AssertionError):
            raise PolicyError(f"request {request.id} is neither waiting nor running") from None
        kv = self.kv
        if kv.caching:
            kv.take_hit(request)  # part of the hit the policy saw may have been evicted since
        needed = request.computed + n
        if batch is not None:
            request.reserved_tokens = batch.reserve_tokens
            needed = max(needed, batch.reserve_tokens)
        extra = kv.extra_blocks(request, needed)
        if extra > kv.num_free:
            raise PolicyError(f"request {request.id} was admitted needing {extra} KV blocks with {kv.num_free} free")
        kv.take(extra)
        request.blocks += extra
        if request.scheduled != request.scheduled:  # NaN: never scheduled before
            request.scheduled = self.clock
        request.admitted = self._admissions
        self._admissions += 1
        self.explicit.append(request)
        self._order.add(request)

    def _form_batch(self, admits: list[tuple[Request, int]], batch: PaddedBatch) -> None:
        members = [r for r, _ in admits]
        steps = self.decoders.steps
        self.batch = Batch(members, batch.prompt_len, steps + max(r.output_tokens for r in members) - 1, steps,
                           len(members))

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop its KV; tokens already emitted stay emitted."""
        self.kv.release(request)
        request.admitted = -1
        request.computed = 0
        request.preemptions += 1
        self._waiting.requeue(request)

    def finish(self, request: Request, at: float, steps: int | None = None) -> None:
        """`request` emitted its last token in the step ending at `at` (the decoders' `steps`-th)."""
        if request in self.decoders.members:
            self.decoders.leave(request, steps)
        else:
            self.explicit.remove(request)
        request.finish = at
        self.num_finished += 1
        batch = self.batch
        if batch is None:
            self.kv.release(request)
            request.admitted = -1
        else:
            batch.live -= 1
            if batch.live == 0:
                for member in batch.members:
                    self.kv.release(member)
                    member.admitted = -1
                self.batch = None
        if self.on_finish is not None:
            self.on_finish(request, at)

    def close(self) -> None:
        """After the clock stopped: bring every request still decoding up to date."""
        self.make_explicit()


def _admitted(request: Request) -> int:
    return request.admitted
