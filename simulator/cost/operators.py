"""The kernels of one GPU's forward pass, listed once for both cost models.

Per layer: the linear layers (`ModelSpec.linear_shapes`: QKV, attention output and the gated MLP,
or the MoE router), the experts of a MoE layer, attention, the elementwise kernels below and,
under tensor parallelism, two all-reduces of the hidden state (after the attention output and the
MLP, the row-parallel layers; a third of query and key variances where they are normalized over all
heads). Per step: the LM head on one token per sequence and sampling.

The measured model prices `elementwise_ops` kernel by kernel; the roofline keeps its coarser sum of
the same kernels (five per layer, the final norm and embedding gather left out), which its
published numbers were checked with (folding them in barely moves its chapter table).
"""

from __future__ import annotations

from simulator.deploy.model import ModelSpec

ALL_REDUCES_PER_LAYER = 2
# Elementwise kernels per layer the roofline counts: two fused residual-add RMSNorms, rotary
# embedding, SiLU-and-multiply, and the KV-cache write.
ELEMENTWISE_KERNELS_PER_LAYER = 5


def elementwise_ops(model: ModelSpec) -> tuple[tuple[str, bool, int, int], ...]:
    """The step's memory-bound kernels as (op, per sequence?, kernels per step, bytes per token or sequence).

    Per layer: two fused residual-add RMSNorms, rotary embedding, SiLU-and-multiply and the KV-cache
    write (activations read, cache written); per step: the embedding gather, the final norm, and
    sampling over fp32 logits."""
    h, dt, layers = model.hidden_size, model.dtype_bytes, model.num_layers
    return (
        ("add_rmsnorm", False, 2 * layers + 1, 4 * h * dt),
        ("rotary", False, layers, 2 * model.rotary_elements * dt),
        ("silu_mul", False, layers, 3 * model.ffn_intermediate_per_token * dt),
        ("kv_write", False, layers, model.kv_write_bytes),
        ("embedding", False, 1, 2 * h * dt),
        ("sampling", True, 1, model.vocab_size * 4),
    )


def all_reduce_bytes(model: ModelSpec, tokens: int) -> int:
    """One all-reduce's message: the hidden state of every token in the step."""
    return tokens * model.hidden_size * model.dtype_bytes


def layer_all_reduces(model: ModelSpec, tokens: int) -> tuple[tuple[int, int], ...]:
    """A layer's all-reduces under tensor parallelism as (count, message bytes): the hidden state
    after the attention output and after the MLP, and, where queries and keys are normalized over
    all heads (MiniMax), their partial variances, one fp32 each per token (vLLM's
    `MiniMaxText01RMSNormTP.forward_qk`)."""
    hidden = ((ALL_REDUCES_PER_LAYER, all_reduce_bytes(model, tokens)),)
    return (*hidden, (1, tokens * 2 * 4)) if model.qk_norm_across_heads else hidden


def gemm_weight_bytes(model: ModelSpec, name: str) -> int:
    """Bytes per weight of a linear layer: the router (and LM head) stay in the activations' dtype."""
    return model.dtype_bytes if name in ("router", "lm_head") else model.weight_dtype_bytes


def experts_touched(tokens: float, num_experts: int, top_k: int) -> float:
    """Experts at least one of `tokens` tokens is routed to, in expectation, routing uniform."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def weight_bytes_read(model: ModelSpec, tokens: int) -> float:
    """Weight bytes a step of `tokens` tokens reads: all but the embedding table and, in a mixture
    of experts, the experts on this GPU no token is routed to (in expectation). `tokens`: those the
    experts see (under data-parallel attention, every rank's)."""
    if not model.is_moe:
        return model.weight_bytes_per_step
    touched = experts_touched(tokens, model.num_experts, model.num_experts_per_tok) / model.expert_parallel
    unused = model.local_experts - touched
    return model.weight_bytes_per_step - model.moe_layers * unused * model.expert_params * model.expert_weight_bytes


def moe_bytes_and_flops(model: ModelSpec, tokens: float) -> tuple[float, float]:
    """One MoE layer's routed experts on one GPU: weights of its experts touched, activations in and
    out, FLOPs (under expert parallelism over E GPUs, 1/E of the routed tokens, balanced)."""
    k, ep = model.num_experts_per_tok, model.expert_parallel
    weights = experts_touched(tokens, model.num_experts, k) / ep * model.expert_params * model.expert_weight_bytes
    activations = tokens * k / ep * (2 * model.hidden_size + 3 * model.moe_intermediate_size) * model.dtype_bytes
    return weights + activations, 2.0 * tokens * k / ep * model.expert_params


def all_to_all_bytes(model: ModelSpec, tokens: float) -> float:
    """Bytes one GPU sends in one expert-parallel dispatch (or receives back in the combine): the
    hidden state of each of its `tokens` tokens once per routed expert, for the (E - 1) / E of
    them held on other GPUs (routing uniform), in the activations' dtype."""
    ep = model.expert_parallel
    return tokens * model.num_experts_per_tok * model.hidden_size * model.dtype_bytes * (ep - 1) / ep
