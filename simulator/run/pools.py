"""A run's pools built from a `RunConfig`: one server, colocated replicas, or prefill and decode
pools each of its own tensor-parallel size and GPU type (`--prefill-gpu`, `--decode-gpu`, as
aiconfigurator's `--decode-system`), sized, priced and checked as a single server of that size on
that GPU would be; and a fleet's run. The KV link between the pools is the run's `--gpu`'s."""

from __future__ import annotations

from dataclasses import replace

from policies import build_policy
from simulator.config import RunConfig, disaggregated
from simulator.cost import CostModel, build_cost_model
from simulator.deploy.hardware import GpuSpec, load_gpu
from simulator.deploy.model import ModelSpec
from simulator.errors import InputError
from simulator.fleet.engine import Pool
from simulator.fleet.routers import build_router
from simulator.fleet.transfer import KVLink, kv_link
from simulator.run.clients import ClientKind, workload_clients
from simulator.run.driver import FleetEngine, run_fleet, run_progress
from simulator.run.result import RunResult, run_result
from simulator.run.sizing import check_fits, gpu_shard, host_tier, keeps_prefix_cache, kv_cache_blocks
from workloads import Workload


def pool_configs(config: RunConfig) -> list[tuple[str, int, RunConfig]]:
    """(role, servers, the config one server of the pool runs) for each pool, the entry pool first."""
    tp = config.tensor_parallel_size
    if not disaggregated(config):
        return [("replica", config.num_replicas, config)]
    assert config.prefill_replicas is not None and config.decode_replicas is not None
    prefill_tp = config.prefill_tensor_parallel_size or tp
    decode_tp = config.decode_tensor_parallel_size or tp
    return [("prefill", config.prefill_replicas, replace(config, tensor_parallel_size=prefill_tp,
                                                         gpu=config.prefill_gpu or config.gpu)),
            ("decode", config.decode_replicas, replace(config, tensor_parallel_size=decode_tp,
                                                       gpu=config.decode_gpu or config.gpu))]


def build_pools(config: RunConfig, model: ModelSpec, gpu: GpuSpec, workload: Workload, cost: CostModel | None = None
                ) -> tuple[list[Pool], KVLink | None]:
    """The pools (fresh policies and routers) and, for P/D, the KV link; refuses a workload a pool
    could never serve, before anything runs. `cost` replaces every pool's cost model. `gpu` is the
    run's `--gpu`; a pool on another GPU type loads its own profile."""
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
        pools.append(Pool(role, policies, cost or build_cost_model(pool_config, model, pool_gpu), kv_blocks,
                          config.block_size, build_router(config.router, count, workload.num_requests, config.seed,
                                                          index), caching, host_tier(pool_config, model, pool_gpu)))
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
