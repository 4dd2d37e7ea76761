"""What fits on one GPU: the weights, the largest step's activations, and KV blocks in what is left
(vLLM's memory profiling, as `simulate.kv_cache_blocks` applies it to a run)."""

from __future__ import annotations

from simulator.deploy.model import ModelSpec
from simulator.errors import InputError

MOST_GPUS_SUGGESTED = 2**16
"""The largest tensor parallelism a message suggests (past it: none would do)."""
# Scratch memory vLLM's profiling run finds on top of the weights: the largest step's activations
# (hidden states, QKV, the gated MLP's intermediate) plus the fp32 logits of every sequence.


def activation_reserve_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak activation memory of the largest step the scheduler can build (vLLM profiles this)."""
    per_token = model.dtype_bytes * (
        2 * model.hidden_size
        + (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
        + 3 * model.ffn_intermediate_per_token)
    logits = max_num_seqs * model.vocab_size * 4
    return max_num_batched_tokens * per_token + logits + sliding_window_reserve_bytes(model, max_num_seqs)


def sliding_window_reserve_bytes(model: ModelSpec, max_num_seqs: int) -> int:
    """KV of the sliding-window layers for `max_num_seqs` sequences, each holding the whole window:
    set aside before the blocks are counted, so that a block stands for a token of the full-attention
    layers alone (`ModelSpec.kv_bytes_per_token`). vLLM's hybrid allocator instead draws both kinds
    of layer from one pool and frees a sequence's blocks as they leave its window; reserving the
    windows of a full batch is the most those blocks can take."""
    return max_num_seqs * model.sliding_layers * model.sliding_window * model.kv_bytes_per_token_per_layer


def check_memory_share(gpu_memory_utilization: float) -> None:
    """Refuse a share of memory outside (0, 1] (nan included) before anything is computed from it."""
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")


def check_weights_fit(model: ModelSpec, tensor_parallel_size: int, memory_bytes: int,
                      gpu_memory_utilization: float) -> None:
    """Refuse a model whose weights alone overflow each GPU's usable memory, saying how many GPUs
    it takes. `model` is one GPU's shard."""
    check_memory_share(gpu_memory_utilization)
    usable = memory_bytes * gpu_memory_utilization
    if model.weight_bytes < usable:
        return
    said = (f"{model.name}'s weights ({model.weight_dtype or model.dtype}) need {model.weight_bytes / 1e9:.1f} GB per "
            f"GPU at --tensor-parallel-size {tensor_parallel_size}, more than the {usable / 1e9:.1f} GB usable "
            f"(--gpu-memory-utilization {gpu_memory_utilization} of {memory_bytes / 1e9:.1f} GB)")
    total = model.weight_bytes * tensor_parallel_size
    suggestion = tensor_parallel_size * 2
    while suggestion <= MOST_GPUS_SUGGESTED:
        if total / suggestion < usable * 0.8:
            raise InputError(f"{said}: try --tensor-parallel-size {suggestion}")
        suggestion *= 2
    raise InputError(f"{said}; no --tensor-parallel-size up to {MOST_GPUS_SUGGESTED} makes them fit")


def kv_capacity_blocks(*, memory_bytes: int, gpu_memory_utilization: float, weight_bytes: int,
                       activation_bytes: int, kv_bytes_per_token: int, block_size: int) -> int:
    """Blocks = (memory x utilization - weights - activations) / bytes per block."""
    check_memory_share(gpu_memory_utilization)
    if block_size < 1:
        raise InputError(f"--block-size must be a positive number of tokens, got {block_size}")
    free = memory_bytes * gpu_memory_utilization - weight_bytes - activation_bytes
    blocks = int(free // (kv_bytes_per_token * block_size))
    if blocks < 1:
        raise InputError(
            f"no room for one KV block: {memory_bytes * gpu_memory_utilization / 1e9:.1f} GB usable "
            f"(--gpu-memory-utilization {gpu_memory_utilization}) minus {weight_bytes / 1e9:.1f} GB of weights "
            f"and {activation_bytes / 1e9:.1f} GB of activations leaves {max(free, 0) / 1e9:.1f} GB, less than one "
            f"block of --block-size {block_size} tokens ({kv_bytes_per_token * block_size / 1e9:.1f} GB); a larger "
            "--tensor-parallel-size shares the weights")
    return blocks
