"""A run's pools built from a `RunConfig`: one server, colocated replicas, or prefill and decode
pools each of its own tensor-parallel size, data-parallel attention ranks and expert parallelism
(a worker of N ranks is N servers, as `--data-parallel-size N` replicas are) and GPU type
(`--prefill-gpu`, `--decode-gpu`, as aiconfigurator's `--decode-system`), sized, priced and checked
as a single server of that size on that GPU would be; and a fleet's run. The KV link between the
pools is the run's `--gpu`'s."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from policies import build_policy
from simulator.config import POOL_SETTINGS, RunConfig, disaggregated, pool_parallelism
from simulator.cost import CostModel, build_cost_model
from simulator.deploy.hardware import GpuSpec, load_gpu
from simulator.deploy.model import ModelSpec
from simulator.engine.speculation import Speculation
from simulator.errors import InputError
from simulator.fleet.engine import Pool
from simulator.fleet.routers import build_router
from simulator.fleet.transfer import KVLink, kv_link
from simulator.ranges import spec_acceptance
from simulator.run.clients import ClientKind, workload_clients
from simulator.run.driver import FleetEngine, run_fleet, run_progress
from simulator.run.result import RunResult, run_result
from simulator.run.sizing import check_fits, gpu_shard, host_tier, keeps_prefix_cache, kv_cache_blocks
from workloads import Workload


def pool_configs(config: RunConfig) -> list[tuple[str, int, RunConfig]]:
    """(role, servers, the config one server of the pool runs) for each pool, the entry pool first.
    A pool's worker of data-parallel attention N (`--prefill-data-parallel-size`) is N servers, as an
    aggregated deployment's `--data-parallel-size N` is N replicas (`simulator.deploy.spec`
    `check_data_parallel`): its server runs the worker as that aggregated deployment would."""
    if not disaggregated(config):
        return [("replica", config.num_replicas, config)]
    assert config.prefill_replicas is not None and config.decode_replicas is not None
    pools = []
    for role, workers in (("prefill", config.prefill_replicas), ("decode", config.decode_replicas)):
        dp, ep = pool_parallelism(config, role)
        pools.append((role, workers * dp, worker_config(
            config, getattr(config, f"{role}_tensor_parallel_size") or config.tensor_parallel_size,
            getattr(config, f"{role}_gpu") or config.gpu, dp, ep)))
    return pools


def worker_config(config: RunConfig, tensor_parallel_size: int, gpu: str, data_parallel_size: int,
                  expert_parallel: bool) -> RunConfig:
    """`config` as one worker of a pool (`tensor_parallel_size` GPUs on `gpu`, times
    `data_parallel_size` ranks) would run alone: an aggregated deployment of that worker, its ranks
    its replicas."""
    pools_cleared: dict[str, Any] = dict.fromkeys(("prefill_replicas", "decode_replicas", *POOL_SETTINGS))
    return replace(config, tensor_parallel_size=tensor_parallel_size, gpu=gpu, data_parallel_size=data_parallel_size,
                   enable_expert_parallel=expert_parallel, num_replicas=data_parallel_size,
                   router=config.router if data_parallel_size > 1 else "round-robin", **pools_cleared)


def build_speculation(config: RunConfig) -> Speculation | None:
    """The run's speculative decoding (`simulator.engine.speculation`), or None: k draft tokens,
    one acceptance probability per position (a single one stands for every position), the run's seed."""
    if not config.speculates:
        return None
    assert config.num_speculative_tokens is not None and config.spec_acceptance is not None, "RunConfig checked"
    k = config.num_speculative_tokens
    return Speculation(k, spec_acceptance(config.spec_acceptance, k), config.seed)


def build_pools(config: RunConfig, model: ModelSpec, gpu: GpuSpec, workload: Workload, cost: CostModel | None = None
                ) -> tuple[list[Pool], KVLink | None]:
    """The pools (fresh policies and routers) and, for P/D, the KV link; refuses a workload a pool
    could never serve, before anything runs. `cost` replaces every pool's cost model. `gpu` is the
    run's `--gpu`; a pool on another GPU type loads its own profile. Under speculative decoding
    every server that decodes verifies with the run's settings; a prefill server never verifies
    (its requests end at their first token) but, priced and sized with the drafter as every server
    is, runs the drafter over its prompts."""
    longest = int(workload.prompt_tokens.max())
    pools = []
    for index, (role, count, pool_config) in enumerate(pool_configs(config)):
        pool_gpu = gpu if pool_config.gpu == config.gpu else load_gpu(pool_config.gpu)
        kv_blocks = kv_cache_blocks(pool_config, model, pool_gpu, longest)
        check_fits(workload, pool_config, model, kv_blocks)
        policies = [build_policy(pool_config) for _ in range(count)]
        # A decode server receives prompts computed elsewhere: it has no prefill to skip.
        caching = keeps_prefix_cache(config, workload, policies[0]) and role != "decode"
        if config.kv_offload_gb and not caching:
            raise InputError(f"--kv-offload-gb {config.kv_offload_gb:g} needs a workload whose prompts share "
                             "tokens (--prefix-len, --num-turns, a Mooncake trace's hash_ids): this one has "
                             "nothing for the prefix cache to evict")
        pool_cost = cost or build_cost_model(pool_config, model, pool_gpu)
        if count > 1 and hasattr(pool_cost, "keep_shapes"):  # servers in step ask it the same shapes
            pool_cost.keep_shapes = True
        pools.append(Pool(role, policies, pool_cost, kv_blocks,
                          config.block_size, build_router(config.router, count, workload.num_requests, config.seed,
                                                          index), caching, host_tier(pool_config, model, pool_gpu),
                          build_speculation(pool_config) if role != "prefill" else None,
                          pool_config.async_scheduling, pool_config.output_lag))
    link = None
    if disaggregated(config):
        kv_bytes = max(gpu_shard(pool_config, model).kv_bytes_per_token for _, _, pool_config in pool_configs(config))
        link = kv_link(config.kv_transfer_bandwidth, config.kv_transfer_latency, gpu, kv_bytes)
    return pools, link


def simulate_fleet(config: RunConfig, model: ModelSpec, gpu: GpuSpec, workload: Workload, progress: bool = False,
                   engine: FleetEngine | None = None, cost: CostModel | None = None,
                   clients: ClientKind = workload_clients) -> RunResult:
    """`simulate` for more than one server; `engine` replaces `run_fleet` (the tests' oracle),
    `cost` every pool's cost model."""
    if workload.turns > 1:
        raise InputError(f"--num-turns {workload.turns} runs on one server: a fleet does not route conversations "
                         "(drop --num-replicas, or --prefill-replicas and --decode-replicas)")
    pools, link = build_pools(config, model, gpu, workload, cost)
    with run_progress(workload.num_requests, progress) as on_step:
        if engine is not None:
            requests, log, end_time, fleet = engine(pools, link, workload, config.time_limit, on_step)
        else:
            requests, log, end_time, fleet = run_fleet(pools, link, workload, config.time_limit, on_step, clients)
    return run_result(config, model, gpu, pools, workload, requests, log, end_time, fleet)
