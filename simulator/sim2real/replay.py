"""A measured benchmark rerun as its client ran it: warm-up, then a closed loop of clients with
per-request client time, and the per-request sums of step counts that the host-overhead fit needs.
The rerun is a `simulate` run whose clients are `simulator.run.clients.BenchmarkClients`, so it
keeps everything else a run has (the workload's priorities and prefix content, a fleet).

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
  step leave the waves whole (docs/validation/measured-serving.md has the measurements).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from simulator.config import RunConfig
from simulator.cost import CostModel
from simulator.metrics.tokens import tokens_table
from simulator.run.clients import BenchmarkClients, ClientRun, pool_content, pool_draws
from simulator.run.result import RunResult
from simulator.run.simulate import simulate
from workloads import Workload


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
    """The first measured request's id."""
    end: int | None = None
    """One past the last measured request's id (None: the last request's)."""

    def measured_ids(self) -> range:
        """The ids of the measured requests."""
        return range(self.warmup, self.end if self.end is not None else len(self.result.requests.arrival))

    def measured_tokens(self) -> pl.DataFrame:
        """The tokens table's rows of the measured requests, by request and index."""
        ids = self.measured_ids()
        return (tokens_table(self.result.log).filter(pl.col("request_id").is_between(ids.start, ids.stop - 1))
                .sort("request_id", "index"))

    def ttft_at(self, token: int) -> np.ndarray:
        """Each measured request's time from its send to its output token `token` (0-based; its last
        where it has fewer) reaching the client, seconds. It is the TTFT of a client that counts a
        response only when it carries text (aiperf drops a streamed chunk with neither content nor
        reasoning), for a model whose first `token` output tokens carry none; 0 gives `ttft`."""
        if token < 0:
            raise ValueError(f"token {token}: an output token's index is >= 0")
        if token == 0:
            return self.ttft
        ids = self.measured_ids()
        reqs = self.result.requests
        wanted = np.minimum(token, np.maximum(reqs.output_tokens[ids.start:ids.stop] - 1, 0))
        tokens = self.measured_tokens().join(pl.DataFrame({"request_id": np.asarray(ids), "index": wanted}),
                                             on=["request_id", "index"]).sort("request_id")
        assert len(tokens) == len(ids), "every measured request emits the token asked for"
        return tokens["time"].to_numpy() - reqs.arrival[ids.start:ids.stop]

    def itl(self) -> np.ndarray:
        """Every gap between consecutive tokens of the measured requests, pooled (seconds)."""
        gaps = self.measured_tokens().select(gap=pl.col("time").diff(), same=pl.col("request_id").diff() == 0)
        return gaps.filter(pl.col("same"))["gap"].to_numpy()


def client_delays(client: ClientRun, num_requests: int, seed: int) -> np.ndarray:
    """Each request's client time, seconds: exponential with mean `client_time`, from `seed`."""
    if client.client_time == 0:
        return np.zeros(num_requests)
    return np.random.default_rng(seed).exponential(client.client_time, num_requests)


def replay(config: RunConfig, client: ClientRun) -> Replay:
    """Rerun `config`'s lengths (fixed, `input_len`/`output_len`) as `client` sent them."""
    total = client.warmup + client.measured
    workload = Workload(np.full(total, config.input_len, np.int64), np.full(total, config.output_len, np.int64),
                        None, client.concurrency)
    return replay_workload(config, client, workload)


def pooled(workload: Workload, entries: int | None, seed: int, phases: list[int] | None = None) -> Workload:
    """`workload`'s prompts drawn from aiperf's pool of `entries` prompts (None: as they are): each
    of `phases` (request counts of the runs of a sweep, each a new aiperf run with the same seed)
    draws the same sequence from the start; the entries are the same prompts in every phase."""
    if entries is None:
        return workload
    draws = np.concatenate([pool_draws(n, entries, np.random.default_rng(seed))
                            for n in (phases or [workload.num_requests])])
    prompts, content = pool_content(workload.prompt_tokens, draws)
    return replace(workload, prompt_tokens=prompts, content=content)


def replay_workload(config: RunConfig, client: ClientRun, workload: Workload, cost: CostModel | None = None) -> Replay:
    """Rerun `workload` as `client` sent it (its first `warmup` requests warm up), with `config`'s
    cost model or `cost`, its prompts from `config`'s prompt pool (`num_dataset_entries`) if any."""
    return replay_sweep(config, [client], workload, cost)[0]


def replay_sweep(config: RunConfig, clients: list[ClientRun], workload: Workload, cost: CostModel | None = None
                 ) -> list[Replay]:
    """The runs of a sweep back to back against one server, its prefix cache kept: run k's requests
    (`workload`'s, in order) are sent as `clients[k]` sends them once run k - 1 is all answered."""
    counts = [c.warmup + c.measured for c in clients]
    workload = pooled(workload, config.num_dataset_entries, config.seed, counts)
    delays = np.concatenate([client_delays(c, n, config.seed) for c, n in zip(clients, counts, strict=True)])
    result = simulate(config, workload, cost,
                      clients=lambda env, requests: BenchmarkClients(env, requests, clients[0], delays, clients[1:]))
    starts = np.cumsum([0, *counts])
    return [_measured(result, delays, client, int(start)) for client, start in zip(clients, starts[:-1], strict=True)]


def _measured(result: RunResult, delays: np.ndarray, client: ClientRun, start: int) -> Replay:
    """The Replay of the run whose requests begin at `start`."""
    reqs = result.requests
    measured = slice(start + client.warmup, start + client.warmup + client.measured)
    arrival, first, finish = reqs.arrival[measured], reqs.first_token[measured], reqs.finish[measured]
    output = reqs.output_tokens[measured]
    engine_arrival = arrival + delays[measured]
    log = result.log
    ends = log.column("start") + log.column("duration")
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
                  float(np.nanmax(finish) - np.min(arrival)) if len(arrival) else 0.0, start + client.warmup,
                  start + client.warmup + client.measured)

