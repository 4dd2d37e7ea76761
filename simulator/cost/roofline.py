"""The roofline: each operator at max(bytes / achieved bandwidth, FLOPs / achieved FLOP/s) plus a
fixed kernel latency, from a profile's fitted rates alone (hardware never measured op by op)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from simulator.cost.contract import StepShape
from simulator.cost.operators import (
    ELEMENTWISE_KERNELS_PER_LAYER,
    all_to_all_bytes,
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


def decode_pairs(shape: StepShape) -> float:
    """Query-key pairs of the single-token rows: each query over its row's whole context, the draft
    tokens a row verifies (`spec_tokens`) too; without them, `decode_context` as it is."""
    if not shape.spec_tokens:
        return shape.decode_context
    return shape.decode_context * (shape.decode_seqs + shape.spec_tokens) / shape.decode_seqs


class RooflineCost:
    pure = True  # its records (all-reduces beyond the measured sizes) are kept per cached shape, not per step
    """Sum over one GPU's operators (`operators.py`) of their roofline times, plus host overhead.

    `model` is the whole model in the run's dtypes; each GPU computes `model.shard(N)` and, for
    N > 1, two all-reduces per layer (`all_reduce`, measured where the profile has collectives)."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tensor_parallel_size: int = 1,
                 all_reduce: AllReduce | None = None, expert_parallel_size: int = 1,
                 data_parallel_size: int = 1) -> None:
        self.model, self.gpu = model, gpu
        self.rank = model.shard(tensor_parallel_size, expert_parallel_size)
        self.data_parallel_size = data_parallel_size
        if tensor_parallel_size > 1 and all_reduce is None:
            all_reduce = AllReduce(tensor_parallel_size, gpu, None)
        self.all_reduce = all_reduce
        self.extrapolated: Counter[str] = Counter()
        self.notes = () if all_reduce is None or all_reduce.note is None else (all_reduce.note,)
        if self.rank.weight_dtype_bytes != self.rank.dtype_bytes and (gpu.fp8_gemm_flops is None
                                                                       or gpu.fp8_mem_bw is None):
            raise InputError(f"GPU profile {gpu.name!r} has no fp8_gemm_flops or fp8_mem_bw: cannot price fp8 weights")
        if data_parallel_size > 1 and gpu.interconnect_bw is None:
            raise InputError(f"GPU profile {gpu.name!r} has no interconnect_bw: cannot price expert parallelism's "
                             "all-to-all")
        self._fixed_cache: dict[tuple[int, int, int], tuple[float, float]] = {}
        # What every step reads, copied once from the frozen specs (the same values, so the same float
        # operations and bits; a compiled build reads its own attributes natively, the specs' through
        # Python's attribute lookup).
        rank = self.rank
        self._num_layers, self._is_mla = rank.num_layers, rank.is_mla
        self._attn_bw, self._attn_flops, self._attn_latency = gpu.attn_bw, gpu.attn_flops, gpu.attn_kernel_latency
        self._kv_bytes_per_token = rank.kv_bytes_per_token_per_layer
        self._flops_per_pair = 4.0 * rank.num_heads * rank.head_dim
        self._prefill_kv_bytes, self._prefill_flops_per_pair = self._kv_bytes_per_token, self._flops_per_pair
        if rank.is_mla:
            # Decode, absorbed: each head scores the cached latent and rope part, then sums the latent.
            self._flops_per_pair = 2.0 * rank.num_heads * (2 * rank.kv_lora_rank + rank.qk_rope_head_dim)
            # Prefill, not absorbed: the latent is projected up to keys (nope + rope) and values per head.
            per_head = rank.head_dim + rank.v_head_dim
            self._prefill_kv_bytes = rank.num_heads * per_head * rank.dtype_bytes
            self._prefill_flops_per_pair = 2.0 * rank.num_heads * per_head
        self._plain = not (rank.sliding_layers or rank.attention_sinks)
        """Every layer attends to the whole context, with no sinks: one attention term per layer."""

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
        """One MoE layer's routed experts: a fused kernel for gate/up and one for down. `tokens`: all
        the experts see (every data-parallel rank's). 4-bit experts are read as such and computed in
        the activations' dtype (Hopper has no 4-bit tensor cores)."""
        nbytes, flops = moe_bytes_and_flops(self.rank, tokens)
        if self.rank.expert_dtype is None:
            bandwidth, rate = self._rates(self.rank.weight_dtype_bytes)
        else:
            bandwidth, rate = self.gpu.mem_bw, self.gpu.gemm_flops
        return 2 * self.gpu.kernel_latency + max(nbytes / bandwidth, flops / rate)

    def all_to_all_time(self, tokens: float) -> float:
        """One MoE layer's dispatch and combine under data-parallel attention with expert parallelism
        (DeepEP's): each of `all_to_all_bytes`, at the interconnect's per-GPU bandwidth plus its latency."""
        if self.data_parallel_size == 1 or self.rank.expert_parallel == 1:
            return 0.0
        assert self.gpu.interconnect_bw is not None
        return 2 * (self.gpu.interconnect_latency + all_to_all_bytes(self.rank, tokens) / self.gpu.interconnect_bw)

    def attention_time(self, kv_tokens: float, pairs: float, prefill: bool = False) -> float:
        """One layer's attention over `kv_tokens` of cached context and `pairs` query-key products
        (MLA: decode in the absorbed form over the latent cache, prefill in the up-projected form)."""
        if prefill:
            memory = kv_tokens * self._prefill_kv_bytes / self._attn_bw
            compute = self._prefill_flops_per_pair * pairs / self._attn_flops
        else:
            memory = kv_tokens * self._kv_bytes_per_token / self._attn_bw
            compute = self._flops_per_pair * pairs / self._attn_flops
        return self._attn_latency + (compute if compute > memory else memory)  # max(), without the call

    def attention_all_layers(self, shape: StepShape) -> float:
        """Attention of every layer of a step (MLA prefill's up projection of cached context included)."""
        layer = self.mla_context_up_projection(shape) if shape.prefill_seqs else 0.0
        if not self._plain:
            return self.rank.num_layers * layer + self._attention(shape)
        if shape.decode_seqs:
            layer += self.attention_time(shape.decode_context, decode_pairs(shape))
        if shape.prefill_seqs:
            layer += self.attention_time(shape.prefill_context, shape.prefill_pairs, True)
        return self.rank.num_layers * layer

    def _attention(self, shape: StepShape) -> float:
        """Attention of all layers of a step whose layers differ (sliding-window layers: see
        `sliding_attention`; sinks: one more key per query)."""
        rank = self.rank
        sink = 1 if rank.attention_sinks else 0
        full = rank.num_layers - rank.sliding_layers
        total = 0.0
        if shape.decode_seqs:
            queries = shape.decode_seqs + shape.spec_tokens
            total += full * self.attention_time(shape.decode_context, decode_pairs(shape) + sink * queries)
        if shape.prefill_seqs:
            pairs = shape.prefill_pairs + sink * shape.prefill_tokens
            total += full * self.attention_time(shape.prefill_context, pairs, True)
        return total + self.sliding_attention(shape, True, True)

    def sliding_attention(self, shape: StepShape, decode: bool, prefill: bool) -> float:
        """The sliding-window layers' attention of a step's single-token rows (`decode`) and
        multi-token rows (`prefill`): each row's context capped at the window, pairs at the window
        per query, sinks one more key per query. A sum of contexts stands for the rows, so the cap
        is min(sum, rows x window): exact when every row's context is past the window, or none is."""
        rank = self.rank
        window, sliding = rank.sliding_window, rank.sliding_layers
        sink = 1 if rank.attention_sinks else 0
        total = 0.0
        if not sliding:
            return total
        if decode and shape.decode_seqs:
            n, context = shape.decode_seqs, shape.decode_context
            queries = n + shape.spec_tokens
            capped = min(context, n * window)
            total += sliding * self.attention_time(capped, (capped * queries / n if shape.spec_tokens else capped)
                                                  + sink * queries)
        if prefill and shape.prefill_seqs:
            tokens, context, pairs = shape.prefill_tokens, shape.prefill_context, shape.prefill_pairs
            capped = min(context, tokens + shape.prefill_seqs * window)
            total += sliding * self.attention_time(capped, min(pairs, tokens * window) + sink * tokens, True)
        return total

    def _fixed(self, tokens: int, num_seqs: int, logit_rows: int) -> tuple[float, float]:
        """The parts of a step that depend only on its token and sequence counts: per layer (GEMMs,
        experts, elementwise kernels, all-reduces) and per step (LM head and sampling over
        `logit_rows`: one per sequence, and one per draft token verified; host overhead). Cached: a
        run repeats them."""
        key = (tokens, num_seqs, logit_rows)
        cache = self._fixed_cache
        fixed = cache.get(key)
        if fixed is not None:
            return fixed
        rank, gpu = self.rank, self.gpu
        layer = sum(self.gemm_time(tokens, n, k, gemm_weight_bytes(rank, name))
                    for name, n, k in rank.linear_shapes)
        if rank.is_moe:
            layer += self.moe_time(tokens * self.data_parallel_size) + self.all_to_all_time(tokens)
        elementwise_bytes = tokens * rank.dtype_bytes * (
            8 * rank.hidden_size + 3 * rank.ffn_intermediate_per_token
            + 2 * rank.rotary_elements) + tokens * rank.kv_bytes_per_token_per_layer
        layer += ELEMENTWISE_KERNELS_PER_LAYER * gpu.kernel_latency + elementwise_bytes / gpu.mem_bw
        if self.all_reduce is not None:
            layer += self.all_reduce.layer_time(rank, tokens, self.extrapolated)
        # The LM head runs on one token per sequence; sampling reads the whole vocabulary's fp32 logits.
        head = self.gemm_time(logit_rows, rank.vocab_size, rank.hidden_size)
        sampling = gpu.kernel_latency + logit_rows * self.model.vocab_size * 4 / gpu.mem_bw
        per_step = head + sampling + host_overhead(gpu, gpu.step_overhead, num_seqs, tokens)
        if rank.first_dense_layers:
            per_step += rank.first_dense_layers * self._dense_layer_delta(tokens)
        fixed = cache[key] = (layer, per_step)
        return fixed

    def _dense_layer_delta(self, tokens: int) -> float:
        """How much longer a dense layer (before the MoE ones) takes than the MoE layer `_fixed`
        prices every layer as: its MLP's GEMMs and SiLU in place of router, shared and routed experts."""
        rank = self.rank
        dense = sum(self.gemm_time(tokens, n, k, gemm_weight_bytes(rank, name))
                    for name, n, k in rank.dense_layer_shapes)
        moe = sum(self.gemm_time(tokens, n, k, gemm_weight_bytes(rank, name)) for name, n, k in rank.linear_shapes)
        moe += self.moe_time(tokens * self.data_parallel_size) + self.all_to_all_time(tokens)
        silu = 3 * tokens * rank.dtype_bytes * (rank.intermediate_size - rank.ffn_intermediate_per_token)
        return dense - moe + silu / self.gpu.mem_bw

    def mla_context_up_projection(self, shape: StepShape) -> float:
        """MLA prefill's up projection (`kv_b`) of the cached context a chunk attends to (the chunk's
        own tokens are in the step's GEMMs), per layer."""
        cached = shape.prefill_context - shape.prefill_tokens
        if not (self.rank.is_mla and cached > 0):
            return 0.0
        _, n, k = next(s for s in self.rank.attention_shapes if s[0] == "kv_b")
        return self.gemm_time(cached, n, k, gemm_weight_bytes(self.rank, "kv_b"))

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        """`step_time` of steps that decode `num_seqs` sequences whose contexts sum to each of
        `contexts`, for many steps at once: the same float operations elementwise, so the same bits."""
        if not self._plain:
            return np.array([self.step_time(StepShape(num_seqs, num_seqs, int(c))) for c in contexts],
                            dtype=np.float64)
        rank, gpu = self.rank, self.gpu
        layer, per_step = self._fixed(num_seqs, num_seqs, num_seqs)
        attention = gpu.attn_kernel_latency + np.maximum(contexts * self._kv_bytes_per_token / gpu.attn_bw,
                                                         self._flops_per_pair * contexts / gpu.attn_flops)
        return rank.num_layers * (layer + attention) + per_step  # type: ignore[no-any-return]

    def step_time(self, shape: StepShape) -> float:
        decode_seqs, prefill_seqs, spec_tokens = shape.decode_seqs, shape.prefill_seqs, shape.spec_tokens
        tokens = decode_seqs + shape.prefill_tokens + spec_tokens
        if tokens == 0:
            return 0.0
        layer, per_step = self._fixed(tokens, shape.num_seqs, shape.num_seqs + spec_tokens)
        if prefill_seqs and self._is_mla:
            layer += self.mla_context_up_projection(shape)
        if not self._plain:
            return self._num_layers * layer + self._attention(shape) + per_step
        if decode_seqs:
            layer += self.attention_time(shape.decode_context, decode_pairs(shape))
        if prefill_seqs:
            layer += self.attention_time(shape.prefill_context, shape.prefill_pairs, True)
        return self._num_layers * layer + per_step

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per family: everything but the all-reduces (and expert parallelism's all-to-alls)
        as `compute`, and `collectives`."""
        total = self.step_time(shape)
        collectives = 0.0
        if self.all_reduce is not None and shape.num_tokens:
            collectives = self.rank.num_layers * self.all_reduce.layer_time(self.rank, shape.num_tokens, Counter())
        if shape.num_tokens:
            collectives += self.rank.moe_layers * self.all_to_all_time(shape.num_tokens)
        return {"compute": total - collectives, "collectives": collectives}
