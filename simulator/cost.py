"""Cost models: how long one forward pass takes, given what the batch computes.

A step is summarised by a `StepShape` (token and context totals, which is all any of the models
needs, so a step's cost never loops over its sequences). A cost model is anything with
`step_time(shape) -> seconds`; `RooflineCost` is the default until a measured-kernel model exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from simulator.hardware import GpuSpec
from simulator.model import ModelSpec

# Elementwise kernels per layer in a vLLM Llama forward: two fused residual-add RMSNorms, rotary
# embedding, SiLU-and-multiply, and the KV-cache write.
ELEMENTWISE_KERNELS_PER_LAYER = 5


@dataclass(frozen=True)
class StepShape:
    """What one forward pass computes. Context counts include the tokens computed this step."""

    num_seqs: int = 0
    decode_seqs: int = 0
    decode_context: int = 0
    """Sum over single-token rows of their context length."""
    prefill_seqs: int = 0
    prefill_tokens: int = 0
    prefill_context: int = 0
    """Sum over multi-token rows of their context length (KV the chunk attends to)."""
    prefill_pairs: float = 0.0
    """Sum over multi-token rows of query-key pairs under the causal mask: n * (c0 + (n + 1) / 2)."""

    @property
    def num_tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, int]]) -> StepShape:
        """Build a shape from (new tokens, context after the step) per row."""
        decode_seqs = decode_context = prefill_seqs = prefill_tokens = prefill_context = 0
        prefill_pairs = 0.0
        for new, context in rows:
            if new == 1:
                decode_seqs += 1
                decode_context += context
            else:
                prefill_seqs += 1
                prefill_tokens += new
                prefill_context += context
                prefill_pairs += new * (context - new + (new + 1) / 2)
        return cls(decode_seqs + prefill_seqs, decode_seqs, decode_context, prefill_seqs, prefill_tokens,
                   prefill_context, prefill_pairs)


class CostModel(Protocol):
    def step_time(self, shape: StepShape) -> float: ...


@dataclass(frozen=True)
class RooflineCost:
    """Sum over the model's operators of max(bytes / achieved bandwidth, FLOPs / achieved FLOP/s)
    plus each kernel's fixed latency, plus the profile's per-step overhead."""

    model: ModelSpec
    gpu: GpuSpec

    def gemm_time(self, m: int, n: int, k: int) -> float:
        if m == 0:
            return 0.0
        nbytes = (n * k + m * k + m * n) * self.model.dtype_bytes
        return self.gpu.kernel_latency + max(nbytes / self.gpu.mem_bw, 2.0 * m * n * k / self.gpu.gemm_flops)

    def attention_time(self, kv_tokens: float, pairs: float) -> float:
        """One layer's attention over `kv_tokens` of cached context and `pairs` query-key products."""
        model = self.model
        nbytes = kv_tokens * model.kv_bytes_per_token_per_layer
        flops = 4.0 * model.num_heads * model.head_dim * pairs
        return self.gpu.attn_kernel_latency + max(nbytes / self.gpu.attn_bw, flops / self.gpu.attn_flops)

    def step_time(self, shape: StepShape) -> float:
        model, gpu = self.model, self.gpu
        tokens = shape.num_tokens
        if tokens == 0:
            return 0.0
        layer = sum(self.gemm_time(tokens, n, k) for _, n, k in model.linear_shapes)
        if shape.decode_seqs:
            layer += self.attention_time(shape.decode_context, shape.decode_context)
        if shape.prefill_seqs:
            layer += self.attention_time(shape.prefill_context, shape.prefill_pairs)
        elementwise_bytes = tokens * model.dtype_bytes * (
            8 * model.hidden_size + 3 * model.intermediate_size
            + 2 * (model.num_heads + model.num_kv_heads) * model.head_dim
            + 2 * model.num_kv_heads * model.head_dim)
        layer += ELEMENTWISE_KERNELS_PER_LAYER * gpu.kernel_latency + elementwise_bytes / gpu.mem_bw
        # The LM head runs on one token per sequence; sampling reads its fp32 logits.
        head = self.gemm_time(shape.num_seqs, model.vocab_size, model.hidden_size)
        sampling = gpu.kernel_latency + shape.num_seqs * model.vocab_size * 4 / gpu.mem_bw
        return model.num_layers * layer + head + sampling + gpu.step_overhead
