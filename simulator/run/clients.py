"""Who sends a run's requests, and when: the workload's requests made as they are sent, and the
kinds of client that send them to the servers (one server, or a fleet's entry).

- `OpenLoop`: each request at its arrival time, whatever the servers do;
- `ClosedLoop`: `concurrency` clients, each sending its next request when its last one finishes;
- `CappedOpenLoop`: each request at its arrival time unless `concurrency` are in flight, then in turn
  at the next finish (`vllm bench serve --request-rate --max-concurrency`);
- `Sessions`: multi-turn conversations (`simulator.run.sessions`);
- `BenchmarkClients`: a benchmark client as `simulate compare` reruns it (`simulator.sim2real.replay`):
  a warm-up answered whole, then a closed loop (or the arrivals), each request reaching the servers a
  client time after its send.

Every kind makes its requests through `Requests`, so every one carries its workload's lengths,
priority and prefix content.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from simulator.engine.clock import Clock
from simulator.engine.request import Request, RequestColumns
from simulator.engine.server import Process, Server
from simulator.run.sessions import SessionClients
from workloads import Workload
from workloads.prefixes import OUTPUT, Content, request_content

POOL_PROMPT = OUTPUT + (1 << 40)
"""Segment ids of a prompt pool's entries (`pool_content`), apart from every other kind of `workloads.prefixes`."""


class Requests:
    """The workload's requests, made as the clients send them: ids in the order they are sent."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.prompts = workload.prompt_tokens.tolist()
        self.outputs = workload.output_tokens.tolist()
        self.priorities = workload.priority.tolist() if workload.priority is not None else [0] * workload.num_requests
        self.contents = workload.content
        self.num_requests = workload.num_requests
        self.sent: list[Request] = []

    def make(self, arrival: float, index: int | None = None) -> Request:
        """The workload's request `index` (the next one by default), sent at `arrival`."""
        sent = self.sent
        i = len(sent) if index is None else index
        request = Request(len(sent), arrival, self.prompts[i], self.outputs[i], self.priorities[i])
        if self.contents is not None:
            request.content = request_content(self.contents, i, self.outputs[i])
        sent.append(request)
        return request

    def columns(self) -> RequestColumns:
        return RequestColumns.from_requests(self.sent)


class Entry(Protocol):
    """What clients send to: a server, or a fleet (its entry pool's router)."""

    def submit(self, request: Request, at: float | None = None, /) -> None:
        """`request` reaches the servers (sent at `at`, or now)."""

    def close(self) -> None:
        """After the clock stopped: bring every request up to date."""


class Clients(Protocol):
    """One kind of client, made for one run."""

    @property
    def on_finish(self) -> Callable[[Request, float], None] | None:
        """Told of every finish (a client that sends on a reply); None when no client waits for one."""

    @property
    def arrivals(self) -> list[float] | None:
        """When the requests reach the servers, in the order they are sent, where that is known
        before the run (an open loop); None when it depends on the run."""

    def start(self, entry: Entry) -> None:
        """Begin sending to `entry` (before the clock runs)."""


ClientKind = Callable[[Clock, Requests], Clients]
"""Makes a run's clients from its clock and its requests."""


class OpenLoop:
    """Each request sent at its arrival time, whatever the servers do."""

    def __init__(self, env: Clock, requests: Requests, arrivals: list[float]) -> None:
        self.env = env
        self.requests = requests
        self.arrivals = arrivals
        self.on_finish: Callable[[Request, float], None] | None = None

    def start(self, entry: Entry) -> None:
        if isinstance(entry, Server):  # alone, it takes the requests as its clock passes their arrivals
            entry.feed(self.arrivals, self.requests.make)
        else:
            self.env.process(self._arrive(entry))

    def _arrive(self, entry: Entry) -> Process:
        env, make, submit = self.env, self.requests.make, entry.submit
        for t in self.arrivals:
            now = env.now
            if t > now:
                yield env.arrival_timeout(t - now)
            submit(make(t))


class ClosedLoop:
    """`concurrency` clients, each sending its next request when its last one finishes."""

    def __init__(self, requests: Requests, concurrency: int) -> None:
        self.requests = requests
        self.concurrency = concurrency
        self.arrivals: list[float] | None = None
        self.on_finish: Callable[[Request, float], None] | None = self._send_next

    def start(self, entry: Entry) -> None:
        self.entry = entry
        for _ in range(min(self.concurrency, self.requests.num_requests)):
            entry.submit(self.requests.make(0.0))

    def _send_next(self, _finished: Request, at: float) -> None:
        requests = self.requests
        if len(requests.sent) < requests.num_requests:
            self.entry.submit(requests.make(at), at)


class CappedOpenLoop:
    """Each request sent at its arrival time, unless `concurrency` are in flight: then it waits in the
    client and is sent, in arrival order, at the next finish. vLLM's benchmark client holds a
    semaphore of `--max-concurrency` slots and starts a request's clock once it has one, so a
    request's arrival here is its send, and its latencies count from there."""

    def __init__(self, env: Clock, requests: Requests, arrivals: list[float], concurrency: int) -> None:
        self.env = env
        self.requests = requests
        self.due = arrivals
        self.concurrency = concurrency
        self.in_flight = 0
        self.held = 0
        """Requests due but not sent (the next ones in arrival order)."""
        self.arrivals: list[float] | None = None  # sends depend on the finishes
        self.on_finish: Callable[[Request, float], None] | None = self._reply

    def start(self, entry: Entry) -> None:
        self.entry = entry
        self.env.process(self._arrive())

    def _arrive(self) -> Process:
        env, make, submit = self.env, self.requests.make, self.entry.submit
        for t in self.due:
            now = env.now
            if t > now:
                yield env.arrival_timeout(t - now)
            if self.in_flight < self.concurrency:
                self.in_flight += 1
                submit(make(t))
            else:
                self.held += 1

    def _reply(self, _finished: Request, at: float) -> None:
        if self.held:
            self.held -= 1
            self.entry.submit(self.requests.make(at), at)
        else:
            self.in_flight -= 1


class Sessions:
    """`SessionClients` (shared with the test oracle) sending through `Requests` to the servers."""

    def __init__(self, env: Clock, requests: Requests) -> None:
        self.requests = requests
        self.sessions = SessionClients(env, requests.workload, self._send, env.arrival_timeout)
        self.arrivals: list[float] | None = None
        self.on_finish: Callable[[Request, float], None] | None = self.sessions.on_finish

    def start(self, entry: Entry) -> None:
        self.entry = entry
        self.sessions.start()

    def _send(self, index: int, at: float) -> Request:
        request = self.requests.make(at, index)
        self.entry.submit(request, at)
        return request


def workload_clients(env: Clock, requests: Requests) -> Clients:
    """The clients the workload says: sessions, a closed loop of `concurrency`, or its arrivals."""
    workload = requests.workload
    if workload.turns > 1:
        return Sessions(env, requests)
    if workload.arrival is None:
        assert workload.concurrency is not None
        return ClosedLoop(requests, workload.concurrency)
    if workload.concurrency is not None:
        return CappedOpenLoop(env, requests, workload.arrival.tolist(), workload.concurrency)
    return OpenLoop(env, requests, workload.arrival.tolist())


@dataclass(frozen=True)
class ClientRun:
    """How a benchmark client drove the server."""

    concurrency: int
    warmup: int
    """Requests sent first and answered before measuring starts (not counted)."""
    measured: int
    client_time: float = 0.0
    """Mean seconds per request outside the engine (HTTP, tokenisation, streaming)."""


class BenchmarkClients:
    """`client`'s warm-up sent at once, and once all of it is answered, its `concurrency` clients
    each sending on its reply (or, for a workload with arrivals, each request sent at its arrival);
    request i reaches the servers `delays[i]` seconds after its send. Then each run of `then` the
    same way, once the one before is all answered: the levels of a sweep against one server."""

    def __init__(self, env: Clock, requests: Requests, client: ClientRun, delays: np.ndarray,
                 then: list[ClientRun] | None = None) -> None:
        self.env = env
        self.requests = requests
        self.runs = [client, *(then or [])]
        self.delays = delays
        open_loop = requests.workload.arrival is not None
        self.arrivals: list[float] | None = None  # each request reaches the servers after its own delay
        self.on_finish: Callable[[Request, float], None] | None = None if open_loop else self._reply

    def start(self, entry: Entry) -> None:
        self.entry = entry
        arrival = self.requests.workload.arrival
        if arrival is not None:
            self.env.process(self._open_loop(arrival.tolist()))
        else:
            self._begin(0, 0.0)

    def _begin(self, run: int, at: float) -> None:
        self.run, client = run, self.runs[run]
        self.first = len(self.requests.sent)
        self.warm_left, self.answered = client.warmup, 0
        for _ in range(client.warmup if client.warmup else min(client.concurrency, client.measured)):
            self._send(at)

    def _send(self, at: float) -> None:
        request = self.requests.make(at)
        self.env.process(self._deliver(request, at + float(self.delays[request.id]) - self.env.now))

    def _deliver(self, request: Request, delay: float) -> Process:
        yield self.env.arrival_timeout(delay)
        self.entry.submit(request)

    def _reply(self, request: Request, at: float) -> None:
        client = self.runs[self.run]
        if request.id < self.first + client.warmup:
            self.warm_left -= 1
            if self.warm_left == 0:
                for _ in range(min(client.concurrency, client.measured)):
                    self._send(at)
            return
        self.answered += 1
        if len(self.requests.sent) < self.first + client.warmup + client.measured:
            self._send(at)
        elif self.answered == client.measured and self.run + 1 < len(self.runs):
            self._begin(self.run + 1, at)

    def _open_loop(self, arrivals: list[float]) -> Process:
        env = self.env
        for at in arrivals:
            if at > env.now:
                yield env.arrival_timeout(at - env.now)
            self._send(at)


def pool_draws(num_requests: int, entries: int, rng: np.random.Generator, shuffled: bool = False) -> np.ndarray:
    """Which of `entries` pooled prompts each request sends, as aiperf draws them from its dataset of
    `--num-dataset-entries` prompts: at random with replacement (aiperf 0.1), or `shuffled`: each
    entry once per pass, in a new random order each pass (later aiperf)."""
    if not shuffled:
        return rng.integers(0, entries, num_requests)
    passes = -(-num_requests // entries)
    return np.concatenate([rng.permutation(entries) for _ in range(passes)])[:num_requests]


def pool_content(prompt_tokens: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, tuple[Content, ...]]:
    """Prompts as whole pooled prompts: request i sends entry `draws[i]`, of the length
    `prompt_tokens[draws[i]]` (entry k's own); equal entries are equal tokens (the prefix cache's)."""
    lengths = prompt_tokens[draws % len(prompt_tokens)]
    content = tuple(((POOL_PROMPT + int(k), int(n)),) for k, n in zip(draws.tolist(), lengths.tolist(), strict=True))
    return lengths.astype(np.int64), content
