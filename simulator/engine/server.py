"""One GPU server as a SimPy process: ask the policy, charge the cost, advance the requests, log the step.

The server keeps the process, the policy call and its clock; the running set (`simulator.engine.running`)
holds the requests it runs and their KV, makes every change to them and writes the step log. A
running request is an explicit row (it has prompt, or recomputation, left) or one of the decoders,
which run as one that no step walks (`simulator.engine.decoders`). A step names the explicit rows
and admissions and says whether the decoders run (`simulator.engine.step`). The server

1. asks the policy for the step (`self` is the policy's view);
2. has the running set take it: explicit rows and the decoders get the KV they grow into, the
   running set preempted from its back until that fits, and the admissions join;
3. charges the step's cost: its end on the server's clock;
4. advances the requests: explicit rows compute their tokens, the decoders' step count goes up,
   explicit requests that now decode join the decoders, those finishing leave;
5. logs the step.

With a KV host tier (`simulator.engine.offload`), after the step took its blocks the waiting
requests the policy passed over for their host hits start loading, on the server's host link
(`HostLink`), beside the steps; a load's end is an event of the server's own: before the next
policy call after it, its request rejoins the waiting queue, a decode stretch stops at the step it
falls in, and an idle server wakes for it.

It waits on the SimPy clock for the step's end only when something could see it: a finish, or an
event before that end. Otherwise the step is carried out without a timeout at all, the server's
clock ahead of SimPy's (the clock's next event is later, so nothing could see it).

Under speculative decoding (`simulator.engine.speculation`) every step is taken as a general one.
Otherwise a decode-only step (only the decoders, nothing admitted or preempted) is priced for the k steps it
repeats until the next event (`simulator.engine.stretch`): a finish, a KV shortfall, the eviction
of part of a prefix-cache hit the policy read, the time limit, or the next event that could see it
(`horizon`: the clock's next event, an arrival; in a fleet the next arrival only, since other
servers' step ends cannot). The k steps are one SimPy timeout, after which the running set commits
them; when the first step is the last, it is taken as any other step.

Under async scheduling (vLLM's `--async-scheduling`, SGLang's and TensorRT-LLM's overlap scheduler)
the scheduler plans each step while the one before it runs: a request that arrives once a step has
started (`unplanned`) joins the waiting queue at the next step boundary but one, and while one
waits the decoders run a step at a time. A server with nothing in flight plans at once, as in step.
With output lag on top (`simulator.engine.delivery`), a step's first tokens and finishes reach
their clients once the next step is known: at its end if it computes prompt tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Any

import simpy
from mypy_extensions import mypyc_attr
from simpy.events import NORMAL

from simulator.cost import CostModel
from simulator.engine import stretch
from simulator.engine.clock import Clock
from simulator.engine.delivery import Delivery
from simulator.engine.kv import KVBlocks
from simulator.engine.loads import HostLoads
from simulator.engine.queues import Unplanned, WaitingWithHits, make_queues
from simulator.engine.request import Request
from simulator.engine.running import RunningSet
from simulator.engine.speculation import Speculation
from simulator.engine.step import Policy, PolicyError, Step
from simulator.engine.steplog import StepLog
from simulator.errors import InputError

Process = Generator[simpy.Event, Any, None]


@mypyc_attr(native_class=False)  # a compiled class cannot subclass a builtin exception (setup.py)
class PolicyStalledError(InputError):
    """A policy scheduled nothing while work was waiting: its settings cannot serve this workload."""


def _next_event(queue: list[Any]) -> float:
    """The time of the clock's next event: `env.peek` over the clock's event queue, read without a
    call into SimPy's interpreted code (a server asks before every step)."""
    return float(queue[0][0]) if queue else math.inf


class Server:
    """A GPU: a waiting queue and a running set, a policy and a cost model, as a SimPy process."""

    def __init__(self, env: Clock, policy: Policy, cost: CostModel, kv: KVBlocks, log: StepLog,
                 time_limit: float | None = None, on_finish: Callable[[Request, float], None] | None = None,
                 on_step: Callable[[int, float], None] | None = None, speculation: Speculation | None = None,
                 async_scheduling: bool = False, output_lag: bool = False) -> None:
        self.env = env
        self.policy = policy
        self.cost = cost
        self.log = log
        self.limit = math.inf if time_limit is None else time_limit
        self.on_step = on_step
        """Told (requests finished, clock) before every step: a progress bar."""
        waiting, order = make_queues(policy.scheduling)
        self.delivery = Delivery(log, on_finish) if output_lag else None
        """Under output lag, the last step's outputs until the next step is known."""
        told = on_finish if self.delivery is None else self.delivery.hold
        self.running_set = RunningSet(kv, waiting, order, log, told, speculation)
        if self.delivery is not None:
            self.running_set.first_tokens = self.delivery.first
        self.speculative = speculation is not None
        """Speculative decoding: every step is taken alone (its tokens are drawn, no stretch prices them)."""
        # The policy's view reads these three as they are (the rest of it below, as properties);
        # `prefilling` is the running set's list of explicit rows, which it changes in place.
        self.kv = kv
        self.waiting: Any = WaitingWithHits(waiting, kv) if kv.caching else waiting
        self.prefilling: Sequence[Request] = self.running_set.explicit
        self.clock = env.now
        """The server's time: ahead of `env.now` after steps carried out without a timeout."""
        self.submitted: list[float] | None = None
        """When requests were submitted while a decode stretch is waited for (None between stretches)."""
        self.priority: int = NORMAL
        """Of its timeouts among events at the same instant (a fleet orders servers by index)."""
        self.horizon: Callable[[], float] = partial(_next_event, env._queue)  # type: ignore[attr-defined]
        """The next instant another process could read or change this server: by default the clock's
        next event; a fleet open loop's next arrival (`simulator.fleet.engine`)."""
        self.stretch_stops_at_each_finish = output_lag
        """A padded batch's stretch stops at each member's finish, not its last: where a finish is
        seen at its instant by other servers (a fleet's closed-loop client routes its next request
        then), or is held until the next step is known (output lag)."""
        self.stretch_kv: tuple[Sequence[float], Sequence[int]] | None = None
        """While a decode stretch is waited for: its step ends and the KV blocks its steps took by
        then (cumulative), which it commits at its end; a router reads the blocks held mid-stretch."""
        self.launching = 0
        """While output lag tells the last step's outputs as the decode step after it is launched:
        the KV blocks that step takes then, which a router reads as taken."""
        self.host = HostLoads(kv, self.running_set.waiting)
        """Loads from the KV host tier in flight."""
        self.due: list[float] = []
        """A fed server's arrival times (`feed`), in order; `next_arrival` the first not yet submitted."""
        self.next_arrival = math.inf
        self._due_index = 0
        self._make: Callable[[float], Request] | None = None
        self.async_scheduling = async_scheduling  # see the module docstring
        self.unplanned = self.running_set.unplanned = Unplanned()
        self.last_start = self.last_end = -math.inf
        """The start and end of the last step taken."""
        self._wakeup = simpy.Store(env)
        self._sleeping = False
        self._serving = self._serve()
        env.process(self._serving)

    # -- the policy's view --------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock

    @property
    def num_decoding(self) -> int:
        return self.running_set.decoders.count

    @property
    def decode_blocks(self) -> int:
        return self.running_set.decoders.blocks_needed()

    @property
    def num_running(self) -> int:
        return self.running_set.num_running

    def is_youngest(self, request: Request) -> bool:
        return self.running_set.order.youngest() is request

    def running(self) -> Sequence[Request]:
        self.running_set.make_explicit()
        return self.prefilling

    def blocks_to_finish(self) -> int:
        return self.running_set.blocks_to_finish()

    # -- the server ---------------------------------------------------------------------------------
    @property
    def on_finish(self) -> Callable[[Request, float], None] | None:
        """Told (request, time) as each request finishes (reaches its client, under output lag)."""
        return self.running_set.on_finish if self.delivery is None else self.delivery.notify

    @on_finish.setter
    def on_finish(self, on_finish: Callable[[Request, float], None] | None) -> None:
        if self.delivery is None:
            self.running_set.on_finish = on_finish
        else:
            self.delivery.notify = on_finish

    @property
    def num_finished(self) -> int:
        return self.running_set.num_finished

    def submit(self, request: Request, at: float | None = None) -> None:
        """A request joins the waiting queue (at `at`, or now); under async scheduling, while the
        server is not idle, the requests planned after its arrival (`unplanned`)."""
        if self.async_scheduling and not self._sleeping:
            self.unplanned.append((self.env.now if at is None else at, request))
        else:
            self.running_set.waiting.push(request)
        if self.submitted is not None:
            self.submitted.append(self.env.now if at is None else at)
        if self._sleeping:
            self._sleeping = False
            self._wakeup.put(request.id)

    def feed(self, arrivals: list[float], make: Callable[[float], Request]) -> None:
        """Take an open loop's requests from their arrival times, each made by `make` (a sent
        request) and submitted as the server's clock passes it, instead of by an event per arrival:
        a lone server is the only one that sees them. The run's tables are the same: the stretches
        stop at the next arrival as at the clock's next event, and the step log's waiting counts
        hold the requests arrived by each step's end."""
        self.due, self._make, self._due_index = arrivals, make, -1
        self._next_due()

    def _next_due(self) -> None:
        i = self._due_index = self._due_index + 1
        due = self.due
        self.next_arrival = due[i] if i < len(due) and due[i] < self.limit else math.inf

    def _arrive(self, upto: float) -> None:
        """A fed server's requests that arrived by `upto`, submitted in order (none at or past the
        time limit, when the clock has stopped)."""
        make = self._make
        assert make is not None
        while self.next_arrival <= upto:
            at = self.next_arrival
            self.submit(make(at), at)
            self._next_due()

    def _serve(self) -> Process:
        on_step, policy, running, kv = self.on_step, self.policy, self.running_set, self.kv
        decoders, read_hits, speculative = running.decoders, kv.read_hits, self.speculative
        host, host_reads, delivery = self.host, kv.host_reads, self.delivery
        loads = host.loads
        while True:
            if on_step is not None:
                on_step(running.num_finished, self.clock)
            if loads and loads[0][0] <= self.clock:
                host.end(self.clock)
            read_hits.clear()
            if self.unplanned:  # this step was planned as the last one started, if it ran up to now
                busy = self.last_end == self.clock and running.num_running
                self.unplanned.plan(running.waiting, self.last_start if busy else math.inf)
            step = policy(self)
            decode = step.decode and decoders.count > 0
            if not step.tokens and not decode:
                if delivery is not None:  # nothing runs next: the last step's outputs at its end
                    delivery.deliver_now()
                if host_reads:
                    host.start(self.clock)
                yield from self._sleep(host.wake_at(step.wake_at) if loads else step.wake_at)
            elif (not step.tokens and not speculative and not host_reads
                  and decoders.blocks_needed() <= kv.num_free):
                if delivery is not None:  # a decode step next: the last step's outputs at its end, told as
                    self.launching = decoders.blocks_needed()  # this step is launched, its KV taken
                    delivery.deliver_now()
                    self.launching = 0
                wake_at = host.wake_at(step.wake_at) if loads else step.wake_at
                yield from self._decode(self.clock if self.unplanned else wake_at)  # one step, then plan them
            else:
                yield from self._step(step)

    def _sleep(self, wake_at: float | None) -> Process:
        if self.unplanned:  # an idle scheduler plans the next step with them
            self.unplanned.plan(self.running_set.waiting)
            return
        if wake_at is None and (len(self.waiting) or self.num_running):
            raise PolicyStalledError(
                f"the policy scheduled nothing at t={self.clock:.6f} s while {len(self.waiting)} requests "
                f"waited and {self.num_running} ran")
        if self.clock > self.env.now:
            yield self.env.timeout_at(self.clock, self.priority)
        if self.next_arrival < math.inf:
            yield from self._sleep_fed(wake_at)
            return
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

    def _sleep_fed(self, wake_at: float | None) -> Process:
        """A fed server's sleep: until its next arrival, or the policy's `wake_at` if that comes
        first (at the bits `env.timeout` gives it, as the unfed server wakes)."""
        env, arrival = self.env, self.next_arrival
        now = env.now
        if wake_at is not None and wake_at <= now:
            raise PolicyError(f"the policy asked to sleep until t={wake_at}, which is not after now (t={now})")
        # The policy's timeout is set either way, as the unfed server sets it: pending, it keeps
        # the run going until it fires, so the run ends when it would have.
        timer = None if wake_at is None else env.timeout(wake_at - now)
        if timer is not None and now + (wake_at - now) < arrival:  # type: ignore[operator]
            yield timer
        elif arrival > now:  # else it arrived at the instant the server first looked (t = 0)
            yield env.timeout_at(arrival, self.priority)
        self.clock = env.now
        self._arrive(self.clock)
        if self.unplanned:
            self.unplanned.plan(self.running_set.waiting)

    def _step(self, step: Step) -> Process:
        """One step of any kind, the decoders taking part as one."""
        running, start, delivery = self.running_set, self.clock, self.delivery
        duration = self.cost.step_time(running.take(step, start))
        if self.kv.host_reads:
            if running._counts[4]:  # it preempted: as vLLM schedules no waiting request then
                self.kv.host_reads.clear()
            else:
                self.host.start(start)
        carried = None  # under output lag, the last step's outputs, which wait for this step's end
        if delivery is not None and delivery.pending():
            if running._counts[1]:  # it computes prompt tokens
                carried = delivery.take()
            else:
                delivery.deliver_now()
        end = start + duration
        if end >= self.limit:
            yield self.env.timeout_at(end, self.priority)  # the clock stops first (nothing carried arrives)
            return
        finished = running.advance(end)
        if finished or end >= self.horizon() or (carried is not None and carried[1]):  # a finish is told
            yield self.env.timeout_at(end, self.priority)
        self._ended(start, duration, finished)
        if carried is not None:
            delivery.deliver(carried, end)  # type: ignore[union-attr]

    def _decode(self, wake_at: float | None) -> Process:
        """Decode-only steps until the next event (see the module docstring): the first alone when
        it is the last, else a stretch of them."""
        running, start = self.running_set, self.clock
        decoders = running.decoders
        if running.batch is None:
            horizon, last = self.horizon(), decoders.next_finish()
        else:  # nobody joins a padded batch, which holds its rows to its last member's finish
            horizon = math.inf
            last = decoders.next_finish() if self.stretch_stops_at_each_finish else running.batch_last_step
        seen = horizon  # the clock's next event: what a timeout is waited for
        if self.next_arrival < horizon and running.batch is None:  # a fed server's next request joins then
            horizon = self.next_arrival
        if wake_at is not None:
            horizon = min(horizon, wake_at)
        shape = running.decode_shape()
        first = self.cost.step_time(shape)
        if start + first < min(horizon, self.limit) and last - decoders.steps > 1:
            plan = stretch.plan(running, self.cost, start, shape, first, last, horizon, self.limit)
            submitted = self.submitted = []  # arrivals meanwhile, and closed-loop clients' next requests at finishes
            if decoders.next_finish() <= decoders.steps + plan.k or plan.end >= self.horizon():
                self.stretch_kv = (plan.ends, plan.used) if plan.growing else None
                yield self.env.timeout_at(plan.end, self.priority)
                self.stretch_kv = None
            if plan.end >= self.next_arrival:
                self._arrive(plan.end)
            running.run_decoders(plan.start, plan.durations, plan.ends, plan.used, submitted)
            self.clock = self.last_end = plan.end
            self.last_start = float(plan.ends[-2]) if len(plan.ends) > 1 else plan.start
            self.submitted = None
            if plan.crossing is not None:  # priced already: the step the clock stops in
                yield self.env.timeout_at(plan.crossing, self.priority)
            return
        end = start + first
        if end >= self.limit:
            yield self.env.timeout_at(end, self.priority)  # the clock stops during it
            return
        running.take_decoders()
        finished = running.advance(end)
        if finished or end >= (seen if running.batch is None and wake_at is None else self.horizon()):  # read once
            yield self.env.timeout_at(end, self.priority)
        self._ended(start, first, finished)

    def _ended(self, start: float, duration: float, finished: list[Request]) -> None:
        """The step from `start` ended (the clock there): the fed arrivals by then are submitted,
        the requests it `finished` leave, and it is logged."""
        end = start + duration
        self.clock, self.last_start, self.last_end = end, start, end
        if end >= self.next_arrival:
            self._arrive(end)
        running = self.running_set
        for request in finished:
            running.finish(request, end)
        running.log_step(start, duration)

    def close(self) -> None:
        """After the clock stopped: bring every request still decoding up to date, and end the
        server's process (its generator refers to the server: a cycle that reference counting
        cannot free, and that a compiled generator keeps whole until a full collection)."""
        if self.next_arrival < math.inf:  # a fed server's arrivals before the time limit stopped the clock
            self._arrive(self.due[-1])
        self.running_set.make_explicit()
        self._serving.close()
