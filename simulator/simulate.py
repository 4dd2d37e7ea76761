"""Run one simulation from a `RunConfig`: build the pieces, feed the workload, run the clock."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.events import URGENT, Timeout

from policies import build_policy
from simulator.config import RunConfig
from simulator.cost import CostModel, build_cost_model
from simulator.engine import Server, StepLog
from simulator.errors import InputError
from simulator.fast import run_fast, supports
from simulator.hardware import GpuSpec, load_gpu
from simulator.kv import BlockManager, activation_reserve_bytes, check_weights_fit, kv_capacity_blocks
from simulator.model import ModelSpec, load_model
from simulator.request import Request, RequestColumns
from simulator.step import Policy
from workloads import Workload, read_trace, synthetic_workload

DEFAULT_NUM_REQUESTS = 1000  # as `vllm bench serve --num-prompts`


class ArrivalTimeout(Timeout):
    """A timeout processed before any ordinary event at the same instant: a request arriving exactly
    when a step ends is seen by the scheduler at that step boundary (both engines' rule)."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        # Timeout.__init__ with URGENT for NORMAL (simpy inlines the same fields there).
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = delay
        self._ok = True
        env.schedule(self, URGENT, delay)


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


def build_workload(config: RunConfig) -> Workload:
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
    tokens = (config.max_num_batched_tokens if config.policy != "static"
              else config.max_batch_size * longest_prompt)
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
    if lengths[longest] > model.max_model_len:
        raise InputError(f"request {longest} is {lengths[longest]} tokens long; "
                         f"{model.name} takes at most {model.max_model_len}")
    if config.policy == "continuous":
        budget = config.max_num_batched_tokens
        prompt = int(np.argmax(workload.prompt_tokens))
        if workload.prompt_tokens[prompt] > budget:
            raise InputError(f"request {prompt} has a {workload.prompt_tokens[prompt]}-token prompt, larger than "
                             f"--max-num-batched-tokens {budget}: without chunking it can never be scheduled")


def simulate(config: RunConfig, workload: Workload | None = None, cost: CostModel | None = None) -> RunResult:
    """Run `config` on its own workload (or the one given) with its cost model (or the one given),
    on the engine `config.engine` names: `fast` (the default) or the one-event-per-step `reference`."""
    model = load_model(config.model)
    gpu = load_gpu(config.gpu)
    policy = build_policy(config)
    if workload is None:
        workload = build_workload(config)
    kv_blocks = kv_cache_blocks(config, model, gpu, int(workload.prompt_tokens.max()))
    check_fits(workload, config, model, kv_blocks)
    cost = cost or build_cost_model(config, model, gpu)
    if config.engine == "fast" and supports(policy):
        outcome = run_fast(policy, cost, kv_blocks, config.block_size, workload, config.time_limit)
    else:
        outcome = run_reference(policy, cost, kv_blocks, config.block_size, workload, config.time_limit)
    requests, log, end_time = outcome
    # Only the measured-kernel model keeps these records; a roofline has no measured range to leave.
    extrapolated = dict(getattr(cost, "extrapolated", {}))
    notes = tuple(getattr(cost, "notes", ()))
    return RunResult(config, model, gpu, kv_blocks, requests, log, workload.num_requests, end_time,
                     extrapolated, notes)


def run_reference(policy: Policy, cost: CostModel, kv_blocks: int, block_size: int, workload: Workload,
                  time_limit: float | None) -> tuple[RequestColumns, StepLog, float]:
    """The straightforward engine: a SimPy process per server, one event per step."""
    env = simpy.Environment()
    requests: list[Request] = []
    prompts = workload.prompt_tokens.tolist()
    outputs = workload.output_tokens.tolist()

    def make_request(arrival: float) -> Request:
        i = len(requests)
        request = Request(i, arrival, prompts[i], outputs[i])
        requests.append(request)
        return request

    if workload.arrival is None:
        def next_client(_finished: Request) -> None:
            if len(requests) < workload.num_requests:
                server.submit(make_request(env.now))

        server = Server(env, policy, cost, BlockManager(kv_blocks, block_size), on_finish=next_client)
        assert workload.concurrency is not None
        for _ in range(min(workload.concurrency, workload.num_requests)):
            server.submit(make_request(0.0))
    else:
        server = Server(env, policy, cost, BlockManager(kv_blocks, block_size))
        arrivals = workload.arrival.tolist()

        def arrive():  # type: ignore[no-untyped-def]
            for t in arrivals:
                if t > env.now:
                    yield ArrivalTimeout(env, t - env.now)
                server.submit(make_request(t))

        env.process(arrive())

    env.run(until=time_limit)
    return RequestColumns.from_requests(requests), server.log, env.now
