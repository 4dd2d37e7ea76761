"""A measured benchmark rerun as its client ran it: warm-up, then a closed loop of clients with
per-request client time, and the per-request sums of step counts that the host-overhead fit needs.

Two things a closed loop of real clients does that `simulate --concurrency` does not:

- Warm-up as aiperf does it: `concurrency` warm-up requests are sent at once and all answered
  before the profiling phase starts ("By default, AIPerf waits indefinitely for all warmup
  responses before starting profiling", aiperf's warm-up guide); then every client sends its first
  measured request at that instant. The warm-up requests are not counted.
- Client time: between a client's send (or its previous reply) and the engine seeing the request
  lie HTTP, the API server's tokenisation and its hand-over to the engine core, and the first token
  comes back through detokenisation and the stream. `client_time` is the mean of that time per
  request, seconds, counted in the client's TTFT and E2EL; each request's draw is exponential
  (one parameter, the least that says it varies), seeded. With no variation at all, clients that
  start together with equal lengths stay in lockstep forever (every wave admitted in the same
  steps). A spread splits a wave only where it straddles a step boundary: requests that arrive
  within the step under way are all admitted in the next one, so spreads shorter than a decode
  step leave the waves whole (the README's sim-to-real section has the measurements).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from simulator.config import RunConfig
from simulator.cost import CostModel
from simulator.engine.clock import Clock
from simulator.engine.kv import KVBlocks
from simulator.engine.request import Request, RequestColumns
from simulator.engine.server import Process, Server
from simulator.engine.step import Policy
from simulator.engine.steplog import StepLog
from simulator.metrics.tokens import tokens_table
from simulator.run.result import RunResult
from simulator.run.simulate import Engine, simulate
from workloads import Workload


@dataclass(frozen=True)
class ClientRun:
    """How the benchmark client drove the server."""

    concurrency: int
    warmup: int
    """Requests sent first and answered before measuring starts (not counted)."""
    measured: int
    client_time: float = 0.0
    """Mean seconds per request outside the engine (HTTP, tokenisation, streaming)."""


@dataclass(frozen=True)
class Replay:
    """The measured requests of one rerun (client-side times) and the step sums under each."""

    result: RunResult
    ttft: np.ndarray
    tpot: np.ndarray
    e2el: np.ndarray
    ttft_sums: np.ndarray
    """Per measured request, (steps, sequences, tokens) summed over the steps ending in its TTFT."""
    tpot_sums: np.ndarray
    """The same over its decode, divided by its output tokens - 1."""
    duration: float
    """First measured send to last measured reply, seconds."""
    warmup: int

    def itl(self) -> np.ndarray:
        """Every gap between consecutive tokens of the measured requests, pooled (seconds)."""
        tokens = tokens_table(self.result.log).filter(pl.col("request_id") >= self.warmup).sort("request_id", "index")
        gaps = tokens.select(gap=pl.col("time").diff(), same=pl.col("request_id").diff() == 0)
        return gaps.filter(pl.col("same"))["gap"].to_numpy()


def client_delays(client: ClientRun, num_requests: int, seed: int) -> np.ndarray:
    """Each request's client time, seconds: exponential with mean `client_time`, from `seed`."""
    if client.client_time == 0:
        return np.zeros(num_requests)
    return np.random.default_rng(seed).exponential(client.client_time, num_requests)


def client_engine(client: ClientRun, delays: np.ndarray) -> Engine:
    """An engine for `simulate`: warm-up, a barrier, then each client sends again on its reply (or,
    for a workload with arrivals, each request sent at its arrival); request i reaches the engine
    `delays[i]` after its send."""

    def engine(policy: Policy, cost: CostModel, kv_blocks: int, block_size: int, workload: Workload,
               time_limit: float | None, prefix_caching: bool = False) -> tuple[RequestColumns, StepLog, float]:
        env = Clock()
        log = StepLog()
        requests: list[Request] = []
        prompts, outputs = workload.prompt_tokens.tolist(), workload.output_tokens.tolist()
        warm_left = [client.warmup]

        def deliver(request: Request, delay: float) -> Process:
            yield env.arrival_timeout(delay)
            server.submit(request)

        def send(at: float) -> None:
            i = len(requests)
            request = Request(i, at, prompts[i], outputs[i], 0)
            requests.append(request)
            env.process(deliver(request, at + float(delays[i]) - env.now))

        def on_finish(request: Request, at: float) -> None:
            if workload.arrival is not None:
                return  # an open loop sends on its own clock
            if request.id < client.warmup:
                warm_left[0] -= 1
                if warm_left[0] == 0:
                    for _ in range(min(client.concurrency, client.measured)):
                        send(at)
            elif len(requests) < workload.num_requests:
                send(at)

        def open_loop(arrivals: list[float]) -> Process:
            for at in arrivals:
                if at > env.now:
                    yield env.arrival_timeout(at - env.now)
                send(at)

        kv = KVBlocks(kv_blocks, block_size, prefix_caching)
        server = Server(env, policy, cost, kv, log, time_limit, on_finish=on_finish)
        if workload.arrival is not None:
            env.process(open_loop(workload.arrival.tolist()))
        else:
            for _ in range(client.warmup if client.warmup else min(client.concurrency, client.measured)):
                send(0.0)
        env.run(until=time_limit)
        server.close()
        return RequestColumns.from_requests(requests), log, env.now

    return engine


def replay(config: RunConfig, client: ClientRun) -> Replay:
    """Rerun `config`'s lengths (fixed, `input_len`/`output_len`) as `client` sent them."""
    total = client.warmup + client.measured
    workload = Workload(np.full(total, config.input_len, np.int64), np.full(total, config.output_len, np.int64),
                        None, client.concurrency)
    return replay_workload(config, client, workload)


def replay_workload(config: RunConfig, client: ClientRun, workload: Workload, cost: CostModel | None = None) -> Replay:
    """Rerun `workload`'s lengths as `client` sent them (its first `warmup` requests warm up), with
    `config`'s cost model or `cost`."""
    delays = client_delays(client, workload.num_requests, config.seed)
    result = simulate(config, workload, cost, engine=client_engine(client, delays))
    reqs = result.requests
    measured = slice(client.warmup, None)
    arrival, first, finish = reqs.arrival[measured], reqs.first_token[measured], reqs.finish[measured]
    output = reqs.output_tokens[measured]
    engine_arrival = arrival + delays[measured]
    log = result.log
    start, duration = log.column("start"), log.column("duration")
    ends = start + duration
    per_step = np.stack([np.ones(len(log)), log.column("num_seqs"),
                         log.column("prefill_tokens") + log.column("decode_tokens")], axis=1).astype(np.float64)
    cumulative = np.vstack([np.zeros((1, 3)), np.cumsum(per_step, axis=0)])

    def sums(begin: np.ndarray, end: np.ndarray) -> np.ndarray:
        # Steps ending in (begin, end]: the one under way at `begin` counts whole (it delays the request).
        lo = np.searchsorted(ends, begin, side="right")
        hi = np.searchsorted(ends, end, side="right")
        return np.asarray(cumulative[hi] - cumulative[lo])

    with np.errstate(invalid="ignore", divide="ignore"):
        per_token = np.where(output > 1, 1.0 / (output - 1), np.nan)[:, None]
    return Replay(result, first - arrival, (finish - first) * per_token[:, 0], finish - arrival,
                  sums(engine_arrival, first), sums(first, finish) * per_token,
                  float(np.nanmax(finish) - np.min(arrival)) if len(arrival) else 0.0, client.warmup)

