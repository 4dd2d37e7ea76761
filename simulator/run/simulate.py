"""Run one simulation from a `RunConfig`: build the pieces, feed the workload, run the SimPy clock."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from policies import build_policy
from simulator.config import RunConfig, is_fleet
from simulator.cost import CostModel, build_cost_model
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.engine.clock import Clock
from simulator.engine.kv import KVBlocks
from simulator.engine.request import Request, RequestColumns
from simulator.engine.server import Process, Server
from simulator.engine.step import Policy
from simulator.engine.steplog import StepLog
from simulator.progress import RunProgress
from simulator.run.pools import simulate_fleet
from simulator.run.result import RunResult
from simulator.run.sessions import SessionClients
from simulator.run.sizing import check_fits, keeps_prefix_cache, kv_cache_blocks
from workloads import Workload, read_trace, synthetic_workload
from workloads.prefixes import request_content, shared_prefix_content
from workloads.sessions import conversations

DEFAULT_NUM_REQUESTS = 1000  # as `vllm bench serve --num-prompts`


def build_workload(config: RunConfig) -> Workload:
    workload = _lengths_and_arrivals(config)
    if config.priority_levels is not None:
        # Its own stream from the seed (the fourth), so the lengths and arrivals stay as they were.
        rng = np.random.default_rng(config.seed).spawn(4)[3]
        workload = replace(workload, priority=rng.integers(0, config.priority_levels, workload.num_requests))
    if config.prefix_len:
        # The fifth stream chooses the prefixes, leaving the others as they were.
        rng = np.random.default_rng(config.seed).spawn(5)[4]
        prompts, content = shared_prefix_content(workload.prompt_tokens, config.prefix_len, config.num_prefixes, rng)
        workload = replace(workload, prompt_tokens=prompts, content=content)
    if config.num_turns > 1:
        workload = conversations(workload, config.num_turns, config.think_time)
    return workload


def _lengths_and_arrivals(config: RunConfig) -> Workload:
    if config.trace is not None:
        return read_trace(config.trace, speed=config.trace_speed, limit=config.num_requests)
    num_requests = config.num_requests
    if num_requests is None and (config.duration is None or config.concurrency is not None):
        num_requests = DEFAULT_NUM_REQUESTS
    rate = config.rate
    if rate is None and config.concurrency is None:
        rate = math.inf  # `vllm bench serve` sends everything at once unless given a rate
    return synthetic_workload(
        input_len=config.input_len, output_len=config.output_len,
        input_dist=config.input_len_dist, output_dist=config.output_len_dist,
        rate=rate, burstiness=config.burstiness, concurrency=config.concurrency,
        num_requests=num_requests, duration=config.duration, seed=config.seed)


Engine = Callable[..., tuple[RequestColumns, StepLog, float]]
"""`run_engine`'s signature (the tests' oracle)."""


def simulate(config: RunConfig, workload: Workload | None = None, cost: CostModel | None = None,
             engine: Engine | None = None, progress: bool = False) -> RunResult:
    """Run `config` on its own workload (or the one given) with its cost model (or the one given);
    `engine` replaces `run_engine` (the tests' oracle); `progress` draws a bar on stderr."""
    model = load_model(config.model)
    gpu = load_gpu(config.gpu)
    policy = build_policy(config)
    if workload is None:
        workload = build_workload(config)
    if is_fleet(config):
        assert engine is None, "a fleet's oracle engine goes to pools.simulate_fleet"
        return simulate_fleet(config, model, gpu, workload, progress, cost=cost)
    kv_blocks = kv_cache_blocks(config, model, gpu, int(workload.prompt_tokens.max()))
    check_fits(workload, config, model, kv_blocks)
    cost = cost or build_cost_model(config, model, gpu)
    caching = keeps_prefix_cache(config, workload, policy)
    if engine is not None:
        requests, log, end_time = engine(policy, cost, kv_blocks, config.block_size, workload, config.time_limit,
                                         prefix_caching=caching)
    else:
        bar = RunProgress(workload.num_requests, enabled=progress)
        try:
            requests, log, end_time = run_engine(policy, cost, kv_blocks, config.block_size, workload,
                                                 config.time_limit, bar.update if progress else None,
                                                 prefix_caching=caching)
        finally:
            bar.close()
    return RunResult(config, model, gpu, kv_blocks, requests, log, workload.num_requests, end_time,
                     dict(cost.extrapolated), tuple(cost.notes))


def run_engine(policy: Policy, cost: CostModel, kv_blocks: int, block_size: int, workload: Workload,
               time_limit: float | None, on_step: Callable[[int, float], None] | None = None,
               prefix_caching: bool = False) -> tuple[RequestColumns, StepLog, float]:
    """One server in a SimPy environment, fed by an arrival process (open loop) or by clients that
    send their next request when the last one finishes (closed loop)."""
    env = Clock()
    log = StepLog()
    requests: list[Request] = []
    prompts = workload.prompt_tokens.tolist()
    outputs = workload.output_tokens.tolist()
    priorities = workload.priority.tolist() if workload.priority is not None else [0] * workload.num_requests

    contents = workload.content
    kv = KVBlocks(kv_blocks, block_size, prefix_caching)

    def make_request(arrival: float, i: int | None = None) -> Request:
        """The workload's request `i` (the next one by default) arrives."""
        i = len(requests) if i is None else i
        request = Request(len(requests), arrival, prompts[i], outputs[i], priorities[i])
        if contents is not None:
            request.content = request_content(contents, i, outputs[i])
        requests.append(request)
        return request

    if workload.turns > 1:
        def send(i: int, at: float) -> Request:
            request = make_request(at, i)
            server.submit(request, at)
            return request

        clients = SessionClients(env, workload, send, env.arrival_timeout)
        server = Server(env, policy, cost, kv, log, time_limit, on_finish=clients.on_finish, on_step=on_step)
        clients.start()
    elif workload.arrival is None:
        def next_client(_finished: Request, at: float) -> None:
            if len(requests) < workload.num_requests:
                server.submit(make_request(at), at)

        server = Server(env, policy, cost, kv, log, time_limit, on_finish=next_client, on_step=on_step)
        assert workload.concurrency is not None
        for _ in range(min(workload.concurrency, workload.num_requests)):
            server.submit(make_request(0.0))
    else:
        server = Server(env, policy, cost, kv, log, time_limit, on_step=on_step)
        arrivals = workload.arrival.tolist()

        def arrive() -> Process:
            for t in arrivals:
                now = env.now
                if t > now:
                    yield env.arrival_timeout(t - now)
                server.submit(make_request(t))

        env.process(arrive())

    env.run(until=time_limit)
    server.close()
    return RequestColumns.from_requests(requests), log, env.now
