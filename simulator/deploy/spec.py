"""The model spec: the shapes that decide what a forward pass reads and computes, and the sizes
derived from them (weights, KV bytes per token, each layer's GEMMs), never typed in.

Besides a GQA transformer's shapes a spec may hold multi-head latent attention (MLA, DeepSeek-V3's:
`kv_lora_rank` > 0), dense layers before the mixture-of-experts ones (`first_dense_layers`), shared
experts, experts stored in a 4-bit format (`expert_dtype`), sliding-window layers and attention
sinks (gpt-oss). `shard` gives the slice one GPU holds under tensor (and expert) parallelism, as
vLLM splits it. `simulator.deploy.model` reads specs from config.json files and names the built-ins.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simulator.errors import InputError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "fp8_block": 1}
"""Bytes per element. `fp8_block` is fp8 with per-block scales (128 x 128, as DeepSeek and Qwen ship
it): the same bytes per weight as per-tensor fp8 plus one fp32 scale per block, priced from its own
measured kernels."""
EXPERT_DTYPE_BITS = {"mxfp4": 4.25, "int4": 4.5}
"""Bits per expert weight of the 4-bit formats, scales included: mxfp4 (gpt-oss) stores 4-bit values
with one 8-bit exponent per 32; int4 (Kimi-K2.5's compressed-tensors, group size 32) one bf16 scale
per 32."""
FP8_BLOCK_SIDE = 128
FP8_BLOCK_SCALE_BYTES = 4
"""One fp32 scale per 128 x 128 block of an fp8_block weight."""
QUANTIZATIONS = ("fp8", "fp8_block")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")
Shape = tuple[str, int, int]
"""A GEMM as (name, n, k): output features by input features."""


def _blocks(n: int, k: int) -> int:
    return -(-n // FP8_BLOCK_SIDE) * -(-k // FP8_BLOCK_SIDE)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: GQA attention (or MLA) and a gated (SiLU) MLP in every layer, or a
    mixture of `num_experts` gated MLPs of which each token uses `num_experts_per_tok`.

    `dtype` is the activations' (the checkpoint's torch_dtype); the linear layers' weights are in
    `weight_dtype`, the routed experts' in `expert_dtype` (None: `weight_dtype`) and the KV cache in
    `kv_cache_dtype` (None: `dtype`). Under MLA `head_dim` is the query/key head size (nope + rope
    dimensions) and `v_head_dim` the value head size."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    max_model_len: int = 131072
    tie_word_embeddings: bool = False
    num_experts: int = 0
    """Experts per MoE layer; 0 for a dense model."""
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    weight_dtype: str | None = None
    kv_cache_dtype: str | None = None
    source: str = field(default="", compare=False)
    """Where the shapes came from."""
    kv_lora_rank: int = 0
    """MLA's latent size (0: not MLA); each token caches it plus `qk_rope_head_dim` per layer."""
    q_lora_rank: int = 0
    """MLA's query low-rank size (0: queries projected from the hidden state directly)."""
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    first_dense_layers: int = 0
    """Layers before the first MoE layer that have a dense MLP of `intermediate_size`."""
    shared_expert_intermediate_size: int = 0
    """Width of the shared experts every token of a MoE layer computes, together."""
    expert_dtype: str | None = None
    sliding_window: int = 0
    """Tokens a sliding-window layer attends to (0: no such layers)."""
    sliding_layers: int = 0
    attention_sinks: bool = False
    """One learned logit per head that every query attends to (gpt-oss)."""
    qk_norm_across_heads: bool = False
    """Queries and keys RMS-normalized over all heads together (MiniMax's `qk_norm_type` per_layer),
    not head by head: under tensor parallelism each layer all-reduces the partial variances."""
    expert_parallel: int = 1
    """GPUs the routed experts are spread over (whole experts each); set by `shard`."""
    num_nextn_predict_layers: int = 0
    """Multi-token prediction layers beside the model (DeepSeek's MTP), which can draft for
    speculative decoding (`--speculative-method mtp`)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_model_len", "expert_parallel"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
        for name in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "first_dense_layers",
                     "shared_expert_intermediate_size", "sliding_window", "sliding_layers", "num_nextn_predict_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputError(f"model {self.name!r}: {name} must be a non-negative integer, got {value!r}")
        for name in ("dtype", "weight_dtype", "kv_cache_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPE_BYTES:
                raise InputError(f"model {self.name!r}: unknown {name} {value!r} (known: {', '.join(DTYPE_BYTES)})")
        if self.expert_dtype is not None and self.expert_dtype not in EXPERT_DTYPE_BITS:
            raise InputError(f"model {self.name!r}: unknown expert_dtype {self.expert_dtype!r} "
                             f"(known: {', '.join(EXPERT_DTYPE_BITS)})")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model {self.name!r}: {self.num_heads} heads do not divide into "
                             f"{self.num_kv_heads} KV heads")
        moe = (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size)
        if any(moe) and not (all(v >= 1 for v in moe) and self.num_experts_per_tok <= self.num_experts):
            raise InputError(f"model {self.name!r}: a mixture of experts needs num_experts >= num_experts_per_tok "
                             f">= 1 and moe_intermediate_size >= 1, got {moe}")
        if self.kv_lora_rank and not (self.v_head_dim >= 1 and 1 <= self.qk_rope_head_dim < self.head_dim):
            raise InputError(f"model {self.name!r}: MLA needs v_head_dim >= 1 and 1 <= qk_rope_head_dim < head_dim, "
                             f"got {self.v_head_dim}, {self.qk_rope_head_dim}, {self.head_dim}")
        if self.first_dense_layers and not (self.num_experts and self.first_dense_layers < self.num_layers):
            raise InputError(f"model {self.name!r}: {self.first_dense_layers} dense layers need a mixture of experts "
                             f"in the other of its {self.num_layers} layers")
        if self.sliding_layers > self.num_layers or bool(self.sliding_layers) != bool(self.sliding_window):
            raise InputError(f"model {self.name!r}: sliding_layers {self.sliding_layers} of {self.num_layers} layers "
                             f"with sliding_window {self.sliding_window}: both or neither, at most every layer")
        if self.num_experts % self.expert_parallel:
            raise InputError(f"model {self.name!r}: {self.num_experts} experts do not spread over "
                             f"{self.expert_parallel} GPUs")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dtype_bytes(self) -> int:
        """Bytes per activation element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.weight_dtype or self.dtype]

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes per routed-expert weight (a fraction for the 4-bit formats, scales included)."""
        if self.expert_dtype is None:
            return self.weight_dtype_bytes
        return EXPERT_DTYPE_BITS[self.expert_dtype] / 8

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_cache_dtype or self.dtype]

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def local_experts(self) -> int:
        """Routed experts one GPU holds in each MoE layer."""
        return self.num_experts // self.expert_parallel

    @property
    def attention_shapes(self) -> tuple[Shape, ...]:
        """The attention block's GEMMs. MLA (as vLLM runs it): the queries' and the latent's down
        projections fused (`qkv_a`, replicated under tensor parallelism), the queries' up projection
        (`q_b`), the latent's up projection to keys and values (`kv_b`: in decode the same weights
        absorbed into two batched GEMMs per token) and the output."""
        if not self.is_mla:
            q_size = self.num_heads * self.head_dim
            kv_size = self.num_kv_heads * self.head_dim
            return ("qkv", q_size + 2 * kv_size, self.hidden_size), ("attn_out", self.hidden_size, q_size)
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        q_out = self.num_heads * self.head_dim
        queries: tuple[Shape, ...] = (
            (("qkv_a", self.q_lora_rank + latent, self.hidden_size), ("q_b", q_out, self.q_lora_rank))
            if self.q_lora_rank else (("q", q_out, self.hidden_size), ("kv_a", latent, self.hidden_size)))
        nope = self.head_dim - self.qk_rope_head_dim
        return (*queries, ("kv_b", self.num_heads * (nope + self.v_head_dim), self.kv_lora_rank),
                ("attn_out", self.hidden_size, self.num_heads * self.v_head_dim))

    def mlp_shapes(self, intermediate: int, prefix: str = "") -> tuple[Shape, ...]:
        return ((f"{prefix}gate_up", 2 * intermediate, self.hidden_size),
                (f"{prefix}down", self.hidden_size, intermediate))

    @property
    def linear_shapes(self) -> tuple[Shape, ...]:
        """Per-layer GEMMs as (name, n, k): output features by input features. A MoE layer's
        experts are not GEMMs of the step's tokens (see `expert_params`); its router and shared
        experts are. (The first `first_dense_layers` layers: `dense_layer_shapes`.)"""
        attention = self.attention_shapes
        if self.is_moe:
            shared = self.shared_expert_intermediate_size
            return (*attention, ("router", self.num_experts, self.hidden_size),
                    *(self.mlp_shapes(shared, "shared_") if shared else ()))
        return (*attention, *self.mlp_shapes(self.intermediate_size))

    @property
    def dense_layer_shapes(self) -> tuple[Shape, ...]:
        """GEMMs of one of the dense layers before the MoE ones."""
        return (*self.attention_shapes, *self.mlp_shapes(self.intermediate_size))

    @property
    def ffn_intermediate_per_token(self) -> int:
        """Gated-MLP width one token computes: the dense MLP's, or its experts' (shared ones too) together."""
        if not self.is_moe:
            return self.intermediate_size
        return self.num_experts_per_tok * self.moe_intermediate_size + self.shared_expert_intermediate_size

    @property
    def expert_params(self) -> int:
        """Weights of one expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def _layer_params(self) -> tuple[int, int, int]:
        """Parameters of all layers: (linear layers in `weight_dtype`, routed experts, the rest in
        `dtype`: routers and norms). The router, norms, embeddings and LM head stay in `dtype`, as
        vLLM's fp8 keeps them."""
        dense = self.num_layers - self.moe_layers
        linear = (dense * sum(n * k for _, n, k in self.dense_layer_shapes)
                  + self.moe_layers * sum(n * k for name, n, k in self.linear_shapes if name != "router"))
        experts = self.moe_layers * self.local_experts * self.expert_params
        norms = 2 * self.hidden_size + self.q_lora_rank + self.kv_lora_rank + (self.num_heads if self.attention_sinks
                                                                               else 0)
        other = self.num_layers * norms + self.moe_layers * self.num_experts * self.hidden_size
        return linear, experts, other

    @property
    def num_params(self) -> int:
        linear, experts, other = self._layer_params()
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return linear + experts + other + embeddings + lm_head + self.hidden_size

    @property
    def active_params(self) -> int:
        """Parameters one token computes with: all but the experts it is not routed to."""
        unused = self.moe_layers * (self.local_experts - self.num_experts_per_tok) * self.expert_params
        return self.num_params - unused

    def _scale_bytes(self) -> int:
        """fp32 block scales of the fp8_block weights."""
        if self.weight_dtype != "fp8_block":
            return 0
        dense = self.num_layers - self.moe_layers
        blocks = (dense * sum(_blocks(n, k) for _, n, k in self.dense_layer_shapes)
                  + self.moe_layers * sum(_blocks(n, k) for name, n, k in self.linear_shapes if name != "router"))
        if self.expert_dtype is None:
            per_expert = 2 * _blocks(self.moe_intermediate_size, self.hidden_size) + _blocks(
                self.hidden_size, self.moe_intermediate_size)
            blocks += self.moe_layers * self.local_experts * per_expert
        return blocks * FP8_BLOCK_SCALE_BYTES

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights occupy in GPU memory."""
        linear, experts, _ = self._layer_params()
        if self.expert_dtype is None:
            quantized = linear + experts
            return (quantized * self.weight_dtype_bytes + (self.num_params - quantized) * self.dtype_bytes
                    + self._scale_bytes())
        expert_bytes = -(-experts * int(EXPERT_DTYPE_BITS[self.expert_dtype] * 4) // 32)
        rest = self.num_params - linear - experts
        return linear * self.weight_dtype_bytes + expert_bytes + rest * self.dtype_bytes + self._scale_bytes()

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one forward pass reads: everything but the embedding table, which is
        gathered row by row (unless it doubles as the LM head)."""
        if self.tie_word_embeddings:
            return self.weight_bytes
        return self.weight_bytes - self.vocab_size * self.hidden_size * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """One token's cache in one layer: keys and values of the KV heads, or MLA's latent and its
        rotary part (one copy for all heads, held whole by every GPU under tensor parallelism)."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token across the full-attention layers (128 KiB for Llama-3.1-8B
        in bf16); a sliding-window layer holds at most `sliding_window` tokens (`kv_bytes_for_context`)."""
        return (self.num_layers - self.sliding_layers) * self.kv_bytes_per_token_per_layer

    def kv_bytes_for_context(self, context: int) -> int:
        """KV bytes one sequence of `context` tokens holds, across all layers."""
        window = self.sliding_layers * min(context, self.sliding_window) * self.kv_bytes_per_token_per_layer
        return context * self.kv_bytes_per_token + window

    @property
    def rotary_elements(self) -> int:
        """Elements of one token the rotary embedding rewrites: queries and keys (MLA: their rope parts)."""
        if self.is_mla:
            return (self.num_heads + 1) * self.qk_rope_head_dim
        return (self.num_heads + self.num_kv_heads) * self.head_dim

    @property
    def kv_write_bytes(self) -> int:
        """Bytes one token's KV-cache write moves in one layer: keys and values read, cache written."""
        if self.is_mla:
            return (self.dtype_bytes + self.kv_dtype_bytes) * (self.kv_lora_rank + self.qk_rope_head_dim)
        return (2 * self.dtype_bytes + 2 * self.kv_dtype_bytes) * self.num_kv_heads * self.head_dim

    def deployed(self, quantization: str | None, kv_cache_dtype: str) -> ModelSpec:
        """The model as a run serves it: `--quantization fp8` stores the linear layers' weights in
        fp8, `fp8_block` in fp8 with a scale per 128 x 128 block (a checkpoint that already is fp8
        stays so; 4-bit experts stay 4-bit); `--kv-cache-dtype` sets the KV cache's."""
        weights = self.weight_dtype
        if quantization in ("fp8", "fp8_block") and weights not in ("fp8", "fp8_block"):
            weights = quantization
        kv = {"auto": self.kv_cache_dtype, "fp8_e4m3": "fp8"}.get(kv_cache_dtype, kv_cache_dtype)
        return replace(self, weight_dtype=weights, kv_cache_dtype=kv)

    def shard(self, tensor_parallel_size: int, expert_parallel_size: int = 1) -> ModelSpec:
        """The slice of the model one GPU holds under vLLM's tensor parallelism: query heads, the
        MLP's (shared experts' and, without expert parallelism, every expert's) intermediate and the
        vocabulary split N ways; KV heads split too, or replicated, one per GPU, when there are fewer
        than N; MLA's latent cache and down projections, norms and the router replicated. With
        `expert_parallel_size` E > 1 each GPU holds 1/E of the routed experts, whole."""
        tp, ep = tensor_parallel_size, expert_parallel_size
        if tp == 1 and ep == 1:
            return self
        split = ["num_heads", "intermediate_size", "shared_expert_intermediate_size"]
        if ep == 1:
            split.append("moe_intermediate_size")
        for name in split:
            if getattr(self, name) % tp:
                raise InputError(f"--tensor-parallel-size {tp} does not divide {self.name}'s {name} "
                                 f"{getattr(self, name)}")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise InputError(f"--tensor-parallel-size {tp} neither divides nor is a multiple of {self.name}'s "
                             f"{self.num_kv_heads} KV heads")
        if ep > 1 and (not self.is_moe or self.num_experts % ep):
            raise InputError(f"expert parallelism over {ep} GPUs does not divide {self.name}'s "
                             f"{self.num_experts} experts")
        return replace(self, num_heads=self.num_heads // tp, num_kv_heads=max(1, self.num_kv_heads // tp),
                       intermediate_size=self.intermediate_size // tp,
                       moe_intermediate_size=self.moe_intermediate_size // (tp if ep == 1 else 1),
                       shared_expert_intermediate_size=self.shared_expert_intermediate_size // tp,
                       vocab_size=-(-self.vocab_size // tp), expert_parallel=ep)

    def expert_parallel_size(self, tensor_parallel_size: int, data_parallel_size: int = 1,
                             enable_expert_parallel: bool = False) -> int:
        """GPUs the routed experts spread over: all of them (tensor x data parallel) with vLLM's
        --enable-expert-parallel on a MoE model, else 1 (a dense model ignores the flag, as vLLM does)."""
        return tensor_parallel_size * data_parallel_size if enable_expert_parallel and self.is_moe else 1


def check_data_parallel(data_parallel_size: int, enable_expert_parallel: bool, num_replicas: int) -> None:
    """vLLM's --data-parallel-size as servesim prices it, for MoE models: data-parallel attention
    with expert parallelism. Each of the N ranks (--tensor-parallel-size GPUs each) is one of the
    --num-replicas N servers: its own attention, KV cache and scheduler, behind the router (vLLM's
    DP load balancer); their MoE layers are one expert-parallel group over all the GPUs, each rank
    priced as if every rank ran a step of as many tokens as its own (the ranks step in lockstep)."""
    dp = data_parallel_size
    if dp > 1 and not enable_expert_parallel:
        raise InputError(f"--data-parallel-size {dp} prices data-parallel attention with expert parallelism: "
                         "add --enable-expert-parallel (dense models: --num-replicas)")
    if dp > 1 and num_replicas != dp:
        raise InputError(f"--data-parallel-size {dp} runs {dp} ranks, each a server of its own requests: give "
                         f"--num-replicas {dp} (got {num_replicas})")
