"""Run one simulation from a `RunConfig`: build the pieces, feed the workload, run the SimPy clock."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from policies import build_policy
from simulator.clock import Clock
from simulator.config import RunConfig
from simulator.cost import CostModel, build_cost_model
from simulator.errors import InputError
from simulator.fleet import FleetResult
from simulator.fleet_settings import is_fleet
from simulator.hardware import GpuSpec, load_gpu
from simulator.kv import KVBlocks
from simulator.memory import activation_reserve_bytes, check_weights_fit, kv_capacity_blocks
from simulator.model import ModelSpec, load_model
from simulator.progress import RunProgress
from simulator.request import Request, RequestColumns
from simulator.server import Process, Server
from simulator.sessions import SessionClients
from simulator.step import Policy
from simulator.steplog import StepLog
from workloads import Workload, read_trace, synthetic_workload
from workloads.prefixes import request_content, shared_prefix_content
from workloads.sessions import conversations

DEFAULT_NUM_REQUESTS = 1000  # as `vllm bench serve --num-prompts`


@dataclass
class RunResult:
    config: RunConfig
    model: ModelSpec
    gpu: GpuSpec
    kv_blocks: int
    requests: RequestColumns
    """Every request that arrived, in id (arrival) order."""
    log: StepLog
    num_requests: int
    """Requests in the workload, arrived or not."""
    end_time: float
    cost_extrapolated: dict[str, int]
    """Steps whose cost the model extrapolated beyond its measurements, by operator family."""
    cost_notes: tuple[str, ...]
    """What the cost model's tables stood in for, noted at load."""
    fleet: FleetResult | None = None
    """Servers, routing and transfers of a run of more than one server (`simulator.fleet`)."""


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


def step_activation_bytes(config: RunConfig, model: ModelSpec, longest_prompt: int) -> int:
    """Activation memory on one GPU of the largest step the policy can build: its token budget, or
    for static batching a whole batch padded to the longest prompt."""
    tokens = build_policy(config).max_step_tokens(longest_prompt)
    return activation_reserve_bytes(gpu_shard(config, model), tokens, config.max_num_seqs)


def gpu_shard(config: RunConfig, model: ModelSpec) -> ModelSpec:
    """What one GPU holds: the model in the run's dtypes, split --tensor-parallel-size ways."""
    return model.deployed(config.quantization, config.kv_cache_dtype).shard(config.tensor_parallel_size)


def kv_cache_blocks(config: RunConfig, model: ModelSpec, gpu: GpuSpec, longest_prompt: int) -> int:
    """KV blocks each GPU holds under `config` (every GPU holds its share of every block): sized
    from its memory, or vLLM's override. Refuses a model whose weights do not fit."""
    shard = gpu_shard(config, model)
    check_weights_fit(shard, config.tensor_parallel_size, gpu.memory_bytes, config.gpu_memory_utilization)
    if config.num_gpu_blocks_override is not None:
        return config.num_gpu_blocks_override
    return kv_capacity_blocks(
        memory_bytes=gpu.memory_bytes, gpu_memory_utilization=config.gpu_memory_utilization,
        weight_bytes=shard.weight_bytes, activation_bytes=step_activation_bytes(config, model, longest_prompt),
        kv_bytes_per_token=shard.kv_bytes_per_token, block_size=config.block_size)


def check_fits(workload: Workload, config: RunConfig, model: ModelSpec, kv_blocks: int) -> None:
    """Reject requests no server of this size could ever run, before any output is written."""
    lengths = workload.prompt_tokens + workload.output_tokens
    longest = int(np.argmax(lengths))
    capacity = kv_blocks * config.block_size
    if lengths[longest] > capacity:
        raise InputError(f"request {longest} ({workload.prompt_tokens[longest]} prompt + "
                         f"{workload.output_tokens[longest]} output tokens) needs {lengths[longest]} tokens of KV "
                         f"cache; the GPU holds {capacity} ({kv_blocks} blocks of {config.block_size})")
    if config.max_model_len is not None and config.max_model_len > model.max_model_len:
        raise InputError(f"--max-model-len {config.max_model_len} is past {model.name}'s {model.max_model_len} tokens")
    if lengths[longest] > (config.max_model_len or model.max_model_len):
        limit = f"--max-model-len {config.max_model_len}" if config.max_model_len else f"{model.name}"
        raise InputError(f"request {longest} is {lengths[longest]} tokens long; "
                         f"{limit} takes at most {config.max_model_len or model.max_model_len}")
    build_policy(config).check_prompts(workload.prompt_tokens.tolist())


def keeps_prefix_cache(config: RunConfig, workload: Workload, policy: Policy) -> bool:
    """A server keeps a prefix cache when it is on, the workload says which prompt tokens are equal,
    and the policy can start an admission after a cached prefix."""
    return config.enable_prefix_caching and workload.content is not None and policy.prefix_hits


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
        from simulator.pools import simulate_fleet  # it builds on this module's sizing

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
