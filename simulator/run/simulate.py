"""A run from a `RunConfig`: its workload, its servers (one, or a fleet's pools, `simulator.run.pools`),
driven by the one driver of the engine (`simulator.run.driver`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from simulator.config import RunConfig, is_fleet
from simulator.cost import CostModel
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.run.clients import ClientKind, pool_content, pool_draws, workload_clients
from simulator.run.driver import Engine, run_engine, run_progress
from simulator.run.pools import build_pools, simulate_fleet
from simulator.run.result import RunResult, run_result
from workloads import Workload, synthetic_workload
from workloads.prefixes import shared_prefix_content
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
    if config.num_dataset_entries is not None:  # aiperf's prompt pool; the sixth stream draws from it
        rng = np.random.default_rng(config.seed).spawn(6)[5]
        draws = pool_draws(workload.num_requests, config.num_dataset_entries, rng)
        prompts, content = pool_content(workload.prompt_tokens, draws)
        workload = replace(workload, prompt_tokens=prompts, content=content)
    if config.num_turns > 1:
        workload = conversations(workload, config.num_turns, config.think_time)
    return workload


def _lengths_and_arrivals(config: RunConfig) -> Workload:
    if config.trace is not None:
        from workloads.traces import read_trace  # here: the trace readers load polars

        return read_trace(config.trace, speed=config.trace_speed, limit=config.num_requests)
    num_requests = config.num_requests
    if num_requests is None and config.duration is None:
        num_requests = DEFAULT_NUM_REQUESTS
    rate = config.rate
    if config.concurrency is not None and not config.capped_open_loop:
        rate = None  # all at once, at most `concurrency` in flight: a closed loop
    elif rate is None:
        rate = math.inf  # `vllm bench serve` sends everything at once unless given a rate
    return synthetic_workload(
        input_len=config.input_len, output_len=config.output_len,
        input_dist=config.input_len_dist, output_dist=config.output_len_dist,
        rate=rate, burstiness=config.burstiness, concurrency=config.concurrency,
        num_requests=num_requests, duration=config.duration, seed=config.seed)


def simulate(config: RunConfig, workload: Workload | None = None, cost: CostModel | None = None,
             engine: Engine | None = None, progress: bool = False, clients: ClientKind = workload_clients
             ) -> RunResult:
    """Run `config` on its own workload (or the one given) with its cost model (or the one given),
    sent by `clients` (by default the ones the workload says); `engine` replaces `run_engine` (the
    tests' oracle); `progress` draws a bar on stderr."""
    model = load_model(config.model)
    gpu = load_gpu(config.gpu)
    if workload is None:
        workload = build_workload(config)
    if is_fleet(config):
        assert engine is None, "a fleet's oracle engine goes to pools.simulate_fleet"
        return simulate_fleet(config, model, gpu, workload, progress, cost=cost, clients=clients)
    [pool], _ = build_pools(config, model, gpu, workload, cost)  # one pool of one server
    policy, limit, caching, speculation = pool.policies[0], config.time_limit, pool.prefix_caching, pool.speculation
    host = pool.host if caching else None
    if engine is not None:
        requests, log, end_time = engine(policy, pool.cost, pool.kv_blocks, pool.block_size, workload, limit,
                                         prefix_caching=caching, speculation=speculation, host=host,
                                         async_scheduling=pool.async_scheduling, output_lag=pool.output_lag)
    else:
        with run_progress(workload.num_requests, progress) as on_step:
            requests, log, end_time = run_engine(policy, pool.cost, pool.kv_blocks, pool.block_size, workload, limit,
                                                 on_step, caching, clients, speculation, host,
                                                 pool.async_scheduling, pool.output_lag)
    return run_result(config, model, gpu, [pool], workload, requests, log, end_time)
