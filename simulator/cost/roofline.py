"""The roofline: each operator at max(bytes / achieved bandwidth, FLOPs / achieved FLOP/s) plus a
fixed kernel latency, from a profile's fitted rates alone (hardware never measured op by op)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from simulator.cost.contract import StepShape
from simulator.cost.operators import (
    ALL_REDUCES_PER_LAYER,
    ELEMENTWISE_KERNELS_PER_LAYER,
    all_reduce_bytes,
    gemm_weight_bytes,
    moe_bytes_and_flops,
)
from simulator.cost.parallel import AllReduce
from simulator.deploy.hardware import GpuSpec
from simulator.deploy.model import ModelSpec
from simulator.errors import InputError


def host_overhead(gpu: GpuSpec, step_overhead: float, num_seqs: int, tokens: int) -> float:
    """Host time of one step: per step, per sequence and per token (the profile's terms)."""
    return step_overhead + gpu.per_sequence_overhead * num_seqs + gpu.per_token_overhead * tokens


class RooflineCost:
    pure = True  # its records (all-reduces beyond the measured sizes) are kept per cached shape, not per step
    """Sum over one GPU's operators (`operators.py`) of their roofline times, plus host overhead.

    `model` is the whole model in the run's dtypes; each GPU computes `model.shard(N)` and, for
    N > 1, two all-reduces per layer (`all_reduce`, measured where the profile has collectives)."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tensor_parallel_size: int = 1,
                 all_reduce: AllReduce | None = None) -> None:
        self.model, self.gpu = model, gpu
        self.rank = model.shard(tensor_parallel_size)
        if tensor_parallel_size > 1 and all_reduce is None:
            all_reduce = AllReduce(tensor_parallel_size, gpu, None)
        self.all_reduce = all_reduce
        self.extrapolated: Counter[str] = Counter()
        self.notes = () if all_reduce is None or all_reduce.note is None else (all_reduce.note,)
        if self.rank.weight_dtype_bytes != self.rank.dtype_bytes and (gpu.fp8_gemm_flops is None
                                                                       or gpu.fp8_mem_bw is None):
            raise InputError(f"GPU profile {gpu.name!r} has no fp8_gemm_flops or fp8_mem_bw: cannot price fp8 weights")
        self._fixed_cache: dict[tuple[int, int], tuple[float, float]] = {}
        # Attention's constants, read once (the same values, so the same float operations and bits).
        self._kv_bytes_per_token = self.rank.kv_bytes_per_token_per_layer
        self._flops_per_pair = 4.0 * self.rank.num_heads * self.rank.head_dim

    def _rates(self, weight_bytes: int) -> tuple[float, float]:
        """Achieved (bandwidth, FLOP/s) of GEMMs with weights of `weight_bytes` bytes."""
        if weight_bytes == self.rank.dtype_bytes:
            return self.gpu.mem_bw, self.gpu.gemm_flops
        assert self.gpu.fp8_mem_bw is not None and self.gpu.fp8_gemm_flops is not None
        return self.gpu.fp8_mem_bw, self.gpu.fp8_gemm_flops

    def gemm_time(self, m: int, n: int, k: int, weight_bytes: int | None = None) -> float:
        if m == 0:
            return 0.0
        act = self.rank.dtype_bytes
        weights = act if weight_bytes is None else weight_bytes
        bandwidth, flops = self._rates(weights)
        nbytes = n * k * weights + m * k * act + m * n * act
        return self.gpu.kernel_latency + max(nbytes / bandwidth, 2.0 * m * n * k / flops)

    def moe_time(self, tokens: int) -> float:
        """One MoE layer's experts: a fused kernel for gate/up and one for down."""
        nbytes, flops = moe_bytes_and_flops(self.rank, tokens)
        bandwidth, rate = self._rates(self.rank.weight_dtype_bytes)
        return 2 * self.gpu.kernel_latency + max(nbytes / bandwidth, flops / rate)

    def attention_time(self, kv_tokens: float, pairs: float) -> float:
        """One layer's attention over `kv_tokens` of cached context and `pairs` query-key products."""
        gpu = self.gpu
        memory = kv_tokens * self._kv_bytes_per_token / gpu.attn_bw
        compute = self._flops_per_pair * pairs / gpu.attn_flops
        return gpu.attn_kernel_latency + (compute if compute > memory else memory)  # max(), without the call

    def _fixed(self, tokens: int, num_seqs: int) -> tuple[float, float]:
        """The parts of a step that depend only on its token and sequence counts: per layer (GEMMs,
        experts, elementwise kernels, all-reduces) and per step (LM head, sampling, host overhead).
        Cached: a run repeats them."""
        key = (tokens, num_seqs)
        cache = self._fixed_cache
        fixed = cache.get(key)
        if fixed is not None:
            return fixed
        rank, gpu = self.rank, self.gpu
        layer = sum(self.gemm_time(tokens, n, k, gemm_weight_bytes(rank, name))
                    for name, n, k in rank.linear_shapes)
        if rank.is_moe:
            layer += self.moe_time(tokens)
        elementwise_bytes = tokens * rank.dtype_bytes * (
            8 * rank.hidden_size + 3 * rank.ffn_intermediate_per_token
            + 2 * (rank.num_heads + rank.num_kv_heads) * rank.head_dim) + tokens * rank.kv_bytes_per_token_per_layer
        layer += ELEMENTWISE_KERNELS_PER_LAYER * gpu.kernel_latency + elementwise_bytes / gpu.mem_bw
        if self.all_reduce is not None:
            layer += ALL_REDUCES_PER_LAYER * self.all_reduce.time(all_reduce_bytes(rank, tokens), self.extrapolated)
        # The LM head runs on one token per sequence; sampling reads the whole vocabulary's fp32 logits.
        head = self.gemm_time(num_seqs, rank.vocab_size, rank.hidden_size)
        sampling = gpu.kernel_latency + num_seqs * self.model.vocab_size * 4 / gpu.mem_bw
        fixed = cache[key] = (layer, head + sampling + host_overhead(gpu, gpu.step_overhead, num_seqs, tokens))
        return fixed

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        """`step_time` of steps that decode `num_seqs` sequences whose contexts sum to each of
        `contexts`, for many steps at once: the same float operations elementwise, so the same bits."""
        rank, gpu = self.rank, self.gpu
        layer, per_step = self._fixed(num_seqs, num_seqs)
        attention = gpu.attn_kernel_latency + np.maximum(contexts * self._kv_bytes_per_token / gpu.attn_bw,
                                                         self._flops_per_pair * contexts / gpu.attn_flops)
        return rank.num_layers * (layer + attention) + per_step  # type: ignore[no-any-return]

    def step_time(self, shape: StepShape) -> float:
        decode_seqs, prefill_seqs = shape.decode_seqs, shape.prefill_seqs
        tokens = decode_seqs + shape.prefill_tokens
        if tokens == 0:
            return 0.0
        layer, per_step = self._fixed(tokens, shape.num_seqs)
        if decode_seqs:
            layer += self.attention_time(shape.decode_context, shape.decode_context)
        if prefill_seqs:
            layer += self.attention_time(shape.prefill_context, shape.prefill_pairs)
        return self.rank.num_layers * layer + per_step

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per family: everything but the all-reduces as `compute`, and `collectives`."""
        total = self.step_time(shape)
        collectives = 0.0
        if self.all_reduce is not None and shape.num_tokens:
            collectives = self.rank.num_layers * ALL_REDUCES_PER_LAYER * self.all_reduce.time(
                all_reduce_bytes(self.rank, shape.num_tokens), Counter())
        return {"compute": total - collectives, "collectives": collectives}
