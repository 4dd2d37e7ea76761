"""A server's size under a `RunConfig`: what one GPU holds, how many KV blocks are left for the
cache, and whether every request of the workload can ever run on it."""

from __future__ import annotations

import numpy as np

from policies import build_policy
from simulator.config import RunConfig
from simulator.deploy.hardware import GpuSpec
from simulator.deploy.memory import activation_reserve_bytes, check_weights_fit, kv_capacity_blocks
from simulator.deploy.model import ModelSpec, draft_model, draft_weight_bytes
from simulator.deploy.spec import check_data_parallel
from simulator.engine.offload import HostTier
from simulator.engine.step import Policy
from simulator.errors import InputError
from simulator.fleet.transfer import BYTES_PER_GB
from workloads import Workload


def step_activation_bytes(config: RunConfig, model: ModelSpec, longest_prompt: int) -> int:
    """Activation memory on one GPU of the largest step the policy can build: its token budget, or
    for static batching a whole batch padded to the longest prompt."""
    tokens = build_policy(config).max_step_tokens(longest_prompt)
    return activation_reserve_bytes(gpu_shard(config, model), tokens, config.max_num_seqs)


def gpu_shard(config: RunConfig, model: ModelSpec) -> ModelSpec:
    """What one GPU holds: the model in the run's dtypes, split --tensor-parallel-size ways (and its
    experts spread under --enable-expert-parallel)."""
    tp = config.tensor_parallel_size
    check_data_parallel(config.data_parallel_size, config.enable_expert_parallel, config.num_replicas)
    ep = model.expert_parallel_size(tp, config.data_parallel_size, config.enable_expert_parallel)
    return model.deployed(config.quantization, config.kv_cache_dtype).shard(tp, ep)


def kv_cache_blocks(config: RunConfig, model: ModelSpec, gpu: GpuSpec, longest_prompt: int) -> int:
    """KV blocks each GPU holds under `config` (every GPU holds its share of every block): sized
    from its memory, or vLLM's override. Refuses a model whose weights do not fit."""
    shard = gpu_shard(config, model)
    check_weights_fit(shard, config.tensor_parallel_size, gpu.memory_bytes, config.gpu_memory_utilization)
    weight_bytes, kv_bytes_per_token = shard.weight_bytes, shard.kv_bytes_per_token
    method = config.speculative_method if config.speculates else None
    drafter = None if method is None else draft_model(method, model, config.draft_model)
    if method is not None and drafter is not None:  # beside the target: its weights, and its KV in the same blocks
        draft = gpu_shard(config, drafter)
        draft_bytes = draft_weight_bytes(method, draft)
        usable = gpu.memory_bytes * config.gpu_memory_utilization
        if weight_bytes + draft_bytes >= usable:
            raise InputError(f"the drafter {draft.name} ({draft_bytes / 1e9:.1f} GB per GPU) does not fit beside "
                             f"{model.name} ({weight_bytes / 1e9:.1f} GB) in the {usable / 1e9:.1f} GB usable "
                             f"(--gpu-memory-utilization {config.gpu_memory_utilization})")
        weight_bytes += draft_bytes
        kv_bytes_per_token += draft.kv_bytes_per_token
    if config.num_gpu_blocks_override is not None:
        return config.num_gpu_blocks_override
    return kv_capacity_blocks(
        memory_bytes=gpu.memory_bytes, gpu_memory_utilization=config.gpu_memory_utilization,
        weight_bytes=weight_bytes, activation_bytes=step_activation_bytes(config, model, longest_prompt),
        kv_bytes_per_token=kv_bytes_per_token, block_size=config.block_size)


def host_tier(config: RunConfig, model: ModelSpec, gpu: GpuSpec) -> HostTier | None:
    """The KV cache's host tier under `--kv-offload-gb` (None without): as many blocks as that much
    host memory holds, each block all of its GPUs' shards (every GPU of the server offloads its own
    share of a block); each GPU loads its shard over its own host link (`--kv-offload-bandwidth`,
    else the GPU profile's `host_link_bw`)."""
    if not config.kv_offload_gb:
        return None
    shard = gpu_shard(config, model)
    block_bytes = shard.kv_bytes_per_token * config.block_size
    blocks = int(config.kv_offload_gb * BYTES_PER_GB // (block_bytes * config.tensor_parallel_size))
    if blocks < 1:
        raise InputError(f"--kv-offload-gb {config.kv_offload_gb:g} holds no KV block of {model.name} "
                         f"({block_bytes * config.tensor_parallel_size / BYTES_PER_GB:.4g} GB each)")
    if config.kv_offload_bandwidth is not None:
        bandwidth = config.kv_offload_bandwidth * BYTES_PER_GB
    elif gpu.host_link_bw is not None:
        bandwidth = gpu.host_link_bw
    else:
        raise InputError(f"GPU profile {gpu.name!r} has no host_link_bw: give --kv-offload-bandwidth")
    return HostTier(blocks, block_bytes, bandwidth)


def check_fits(workload: Workload, config: RunConfig, model: ModelSpec, kv_blocks: int) -> None:
    """Reject requests no server of this size could ever run, before any output is written."""
    lengths = workload.prompt_tokens + workload.output_tokens
    # A verify step holds KV for k + 1 tokens past its context: the last one, for prompt + output + k - 1.
    slots = np.where(workload.output_tokens > 1, config.num_speculative_tokens - 1, 0) \
        if config.num_speculative_tokens else np.zeros_like(lengths)
    longest = int(np.argmax(lengths + slots))
    capacity = kv_blocks * config.block_size
    if lengths[longest] + slots[longest] > capacity:
        drafts = f" + {slots[longest]} for the draft tokens verified in its last step" if slots[longest] else ""
        raise InputError(f"{workload.describe(longest)} needs {lengths[longest] + slots[longest]} tokens of KV cache "
                         f"({workload.prompt_tokens[longest]} prompt + {workload.output_tokens[longest]} output"
                         f"{drafts}); the GPU holds {capacity} ({kv_blocks} blocks of {config.block_size})")
    if config.max_model_len is not None and config.max_model_len > model.max_model_len:
        raise InputError(f"--max-model-len {config.max_model_len} is past {model.name}'s {model.max_model_len} tokens")
    if lengths[longest] > (config.max_model_len or model.max_model_len):
        limit = f"--max-model-len {config.max_model_len}" if config.max_model_len else f"{model.name}"
        raise InputError(f"{workload.describe(longest)} is {lengths[longest]} tokens long; "
                         f"{limit} takes at most {config.max_model_len or model.max_model_len}")
    build_policy(config).check_prompts(workload.prompt_tokens.tolist(), workload.output_tokens.tolist())


def keeps_prefix_cache(config: RunConfig, workload: Workload, policy: Policy) -> bool:
    """A server keeps a prefix cache when it is on, the workload says which prompt tokens are equal,
    and the policy can start an admission after a cached prefix."""
    return config.enable_prefix_caching and workload.content is not None and policy.prefix_hits
