"""Prefill and decode pools whose workers have data-parallel attention (`--prefill-data-parallel-size`,
`--decode-data-parallel-size`): a worker of N ranks is N servers of the pool, each run as the
aggregated deployment of that worker (`--data-parallel-size N --num-replicas N`) runs a rank, checked
against that deployment and against plain replicas where nothing is shared."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest

from simulator.config import RunConfig
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.errors import InputError
from simulator.metrics.summary import build_tables
from simulator.plan.space import Deployment
from simulator.run.estimate import estimate_run
from simulator.run.pools import build_pools
from simulator.run.simulate import simulate
from simulator.run.sizing import gpu_shard
from workloads import Workload


def at_once(prompt: int, output: int, count: int) -> Workload:
    return Workload(prompt_tokens=np.full(count, prompt), output_tokens=np.full(count, output),
                    arrival=np.zeros(count), concurrency=None)


def requests(config: RunConfig, workload: Workload) -> pl.DataFrame:
    return build_tables(simulate(config, workload)).requests


def test_a_dense_pools_data_parallel_ranks_are_its_replicas() -> None:
    # A dense model's data-parallel ranks share nothing: one prefill worker of 2 ranks is 2 prefill
    # servers, request for request and to the bit (round robin over the ranks as over the replicas).
    workload = at_once(700, 20, 6)
    pools = dict(policy="continuous", decode_replicas=1, decode_tensor_parallel_size=2)
    ranks = requests(RunConfig(prefill_replicas=1, prefill_data_parallel_size=2, prefill_enable_expert_parallel=True,
                               **pools), workload)
    replicas = requests(RunConfig(prefill_replicas=2, **pools), workload)
    assert ranks["prefill_server"].to_list() == [0, 1, 0, 1, 0, 1]
    assert ranks.equals(replicas)
    one_server = requests(RunConfig(prefill_replicas=1, **pools), workload)
    assert not ranks.equals(one_server)  # the ranks are two servers, not one


def test_a_pool_ranks_prefill_is_the_aggregated_ranks_first_step() -> None:
    # Qwen3-30B-A3B, two prompts at once to a prefill worker of 2 data-parallel ranks with experts
    # spread: each rank prefills one prompt in its first step, priced as a rank of the aggregated
    # deployment `--data-parallel-size 2 --num-replicas 2 --enable-expert-parallel` prices it (its
    # MoE layers for both ranks' tokens), so each prompt's prefill ends when that deployment's first
    # token comes, on both ranks at once.
    workload = at_once(1000, 5, 2)
    common = dict(policy="continuous", model="qwen3-30b-a3b")
    disagg = RunConfig(prefill_replicas=1, prefill_data_parallel_size=2, prefill_enable_expert_parallel=True,
                       decode_replicas=1, decode_tensor_parallel_size=2, **common)
    agg = RunConfig(num_replicas=2, data_parallel_size=2, enable_expert_parallel=True, **common)
    pooled, colocated = requests(disagg, workload), requests(agg, workload)
    assert pooled["prefill_server"].to_list() == [0, 1]
    assert pooled["prefill_end"].to_list() == colocated["first_token"].to_list()
    assert pooled["prefill_end"][0] == pooled["prefill_end"][1]
    # Each rank's GPU holds 128 / 2 = 64 experts whole; the decode worker's TP 2 splits every one.
    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h100_sxm")
    pools, _ = build_pools(disagg, model, gpu, workload)
    assert [len(pool.policies) for pool in pools] == [2, 1]
    assert model.num_experts == 128
    assert gpu_shard(RunConfig(num_replicas=2, data_parallel_size=2, enable_expert_parallel=True, **common),
                     model).expert_parallel == 2


@pytest.mark.parametrize(("settings", "message"), [
    ({"prefill_data_parallel_size": 2}, "--prefill-data-parallel-size 2 prices data-parallel attention with "
                                        "expert parallelism: add --prefill-enable-expert-parallel"),
    ({"data_parallel_size": 2, "decode_enable_expert_parallel": True},
     "--data-parallel-size 2 prices data-parallel attention with expert parallelism: add "
     "--prefill-enable-expert-parallel"),
])
def test_a_pools_data_parallelism_without_expert_parallelism_is_refused(settings: dict[str, object],
                                                                        message: str) -> None:
    with pytest.raises(InputError, match=f"^{re.escape(message)}"):
        RunConfig(prefill_replicas=1, decode_replicas=1, **settings)  # type: ignore[arg-type]


def test_a_pool_setting_without_pools_is_refused() -> None:
    with pytest.raises(InputError, match=r"^--decode-data-parallel-size applies only to prefill/decode pools"):
        RunConfig(decode_data_parallel_size=2)


def test_a_deployments_gpus_and_servers_count_each_pools_ranks() -> None:
    # 2 prefill workers of 8 ranks x TP 1 and 3 decode workers of TP 8: 16 + 24 GPUs, 16 + 3 servers.
    deployment = Deployment({"tensor_parallel_size": 1, "gpu": "h200_sxm", "prefill_replicas": 2,
                             "prefill_data_parallel_size": 8, "decode_replicas": 3, "decode_tensor_parallel_size": 8,
                             "decode_data_parallel_size": 1})
    assert deployment.pool_gpus() == [("h200_sxm", 16), ("h200_sxm", 24)]
    assert (deployment.gpus, deployment.servers) == (40, 19)
    config = RunConfig(model="deepseek-v3", gpu="h200_sxm", enable_expert_parallel=True,
                       **{k: v for k, v in deployment.settings.items() if k != "gpu"})
    assert estimate_run(config, token_rows=False).servers == 19
