"""Model specs: the shapes that decide what a forward pass reads and computes.

A spec comes from a Hugging Face `config.json` (a local file, never a download, its fields checked by
`simulator.deploy.hf_config`) or a built-in name. Weight bytes, KV bytes per token and the linear
layers' shapes are derived from it, never typed in. `deployed` applies a run's dtypes and `shard`
gives the slice one GPU holds under tensor parallelism, as vLLM splits it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simulator.deploy.hf_config import ConfigFile, quant_config_beside, read_json
from simulator.errors import InputError, clip

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "fp8_block": 1}
"""Bytes per element. `fp8_block` is fp8 with per-block scales (128 x 128, as DeepSeek and Qwen ship
it): the same bytes as per-tensor fp8, priced from its own measured kernels."""
QUANTIZATIONS = ("fp8",)
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: GQA attention and a gated (SiLU) MLP in every layer, or a
    mixture of `num_experts` gated MLPs of which each token uses `num_experts_per_tok`.

    `dtype` is the activations' (the checkpoint's torch_dtype); the linear layers' weights are in
    `weight_dtype` and the KV cache in `kv_cache_dtype` (None: `dtype`)."""

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

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_model_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
        for name in ("dtype", "weight_dtype", "kv_cache_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPE_BYTES:
                raise InputError(f"model {self.name!r}: unknown {name} {value!r} (known: {', '.join(DTYPE_BYTES)})")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model {self.name!r}: {self.num_heads} heads do not divide into "
                             f"{self.num_kv_heads} KV heads")
        moe = (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size)
        if any(moe) and not (all(v >= 1 for v in moe) and self.num_experts_per_tok <= self.num_experts):
            raise InputError(f"model {self.name!r}: a mixture of experts needs num_experts >= num_experts_per_tok "
                             f">= 1 and moe_intermediate_size >= 1, got {moe}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dtype_bytes(self) -> int:
        """Bytes per activation element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.weight_dtype or self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_cache_dtype or self.dtype]

    @property
    def linear_shapes(self) -> tuple[tuple[str, int, int], ...]:
        """Per-layer GEMMs as (name, n, k): output features by input features. A MoE layer's
        experts are not GEMMs of the step's tokens (see `expert_params`); its router is."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        attention = (("qkv", q_size + 2 * kv_size, self.hidden_size), ("attn_out", self.hidden_size, q_size))
        if self.is_moe:
            return (*attention, ("router", self.num_experts, self.hidden_size))
        return (*attention, ("gate_up", 2 * self.intermediate_size, self.hidden_size),
                ("down", self.hidden_size, self.intermediate_size))

    @property
    def ffn_intermediate_per_token(self) -> int:
        """Gated-MLP width one token computes: the dense MLP's, or its experts' together."""
        return self.num_experts_per_tok * self.moe_intermediate_size if self.is_moe else self.intermediate_size

    @property
    def expert_params(self) -> int:
        """Weights of one expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def _quantized_params(self) -> int:
        """Parameters stored in `weight_dtype`: the linear layers and experts. The router, norms,
        embeddings and LM head stay in `dtype`, as vLLM's fp8 keeps them."""
        per_layer = sum(n * k for name, n, k in self.linear_shapes if name != "router")
        return self.num_layers * (per_layer + self.num_experts * self.expert_params)

    @property
    def num_params(self) -> int:
        per_layer = (sum(n * k for _, n, k in self.linear_shapes) + self.num_experts * self.expert_params
                     + 2 * self.hidden_size)
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * per_layer + embeddings + lm_head + self.hidden_size

    @property
    def active_params(self) -> int:
        """Parameters one token computes with: all but the experts it is not routed to."""
        unused = self.num_layers * (self.num_experts - self.num_experts_per_tok) * self.expert_params
        return self.num_params - unused

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights occupy in GPU memory."""
        quantized = self._quantized_params()
        return quantized * self.weight_dtype_bytes + (self.num_params - quantized) * self.dtype_bytes

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one forward pass reads: everything but the embedding table, which is
        gathered row by row (unless it doubles as the LM head)."""
        if self.tie_word_embeddings:
            return self.weight_bytes
        return self.weight_bytes - self.vocab_size * self.hidden_size * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token across all layers (128 KiB for Llama-3.1-8B in bf16)."""
        return self.num_layers * self.kv_bytes_per_token_per_layer

    def deployed(self, quantization: str | None, kv_cache_dtype: str) -> ModelSpec:
        """The model as a run serves it: `--quantization fp8` stores the linear layers' weights in
        fp8 (a checkpoint that already is fp8 stays so); `--kv-cache-dtype` sets the KV cache's."""
        weights = self.weight_dtype
        if quantization == "fp8" and weights not in ("fp8", "fp8_block"):
            weights = "fp8"
        kv = {"auto": self.kv_cache_dtype, "fp8_e4m3": "fp8"}.get(kv_cache_dtype, kv_cache_dtype)
        return replace(self, weight_dtype=weights, kv_cache_dtype=kv)

    def shard(self, tensor_parallel_size: int) -> ModelSpec:
        """The slice of the model one GPU holds under vLLM's tensor parallelism: query heads, the
        MLP's (and every expert's) intermediate and the vocabulary split N ways; KV heads split too,
        or replicated, one per GPU, when there are fewer than N; norms and the router replicated."""
        tp = tensor_parallel_size
        if tp == 1:
            return self
        for name in ("num_heads", "intermediate_size", "moe_intermediate_size"):
            if getattr(self, name) % tp:
                raise InputError(f"--tensor-parallel-size {tp} does not divide {self.name}'s {name} "
                                 f"{getattr(self, name)}")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise InputError(f"--tensor-parallel-size {tp} neither divides nor is a multiple of {self.name}'s "
                             f"{self.num_kv_heads} KV heads")
        return replace(self, num_heads=self.num_heads // tp, num_kv_heads=max(1, self.num_kv_heads // tp),
                       intermediate_size=self.intermediate_size // tp,
                       moe_intermediate_size=self.moe_intermediate_size // tp,
                       vocab_size=-(-self.vocab_size // tp))


def _from_reference(file: str) -> str:
    return (f"Hugging Face {file.replace('--', '/')} config.json, as aiconfigurator (ai-dynamo/aiconfigurator, "
            "commit 095f58a) ships it; ../shared/reference/models/")


# Built-in models. Shapes from the config.json files in ../shared/reference/models/ (tests/test_model.py
# checks each against its file field by field).
LLAMA_3_1_8B = ModelSpec(
    name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
    intermediate_size=14336, vocab_size=128256, max_model_len=131072,
    source=_from_reference("meta-llama--Meta-Llama-3.1-8B"))
LLAMA_3_1_70B = ModelSpec(
    name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128,
    intermediate_size=28672, vocab_size=128256, max_model_len=131072,
    source=_from_reference("meta-llama--Meta-Llama-3.1-70B"))
LLAMA_3_1_405B = ModelSpec(
    name="llama-3.1-405b", num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8, head_dim=128,
    intermediate_size=53248, vocab_size=128256, max_model_len=131072,
    source=_from_reference("meta-llama--Meta-Llama-3.1-405B"))
QWEN3_32B = ModelSpec(
    name="qwen3-32b", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8, head_dim=128,
    intermediate_size=25600, vocab_size=151936, max_model_len=40960,
    source=_from_reference("Qwen--Qwen3-32B"))
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128,
    intermediate_size=6144, vocab_size=151936, max_model_len=40960, num_experts=128, num_experts_per_tok=8,
    moe_intermediate_size=768, source=_from_reference("Qwen--Qwen3-30B-A3B"))
MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
    intermediate_size=14336, vocab_size=32000, max_model_len=32768, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=14336, source=_from_reference("mistralai--Mixtral-8x7B-v0.1"))

# A model small enough to run layer by layer on a CPU in seconds (calibration tests).
TINY = ModelSpec(
    name="tiny", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
    intermediate_size=512, vocab_size=1024, dtype="float32", max_model_len=4096, source="servesim's test model")

BUILTIN_MODELS = {spec.name: spec for spec in (LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, QWEN3_32B, QWEN3_30B_A3B,
                                               MIXTRAL_8X7B, TINY)}


def from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face `config.json` of a supported architecture (and, beside it, modelopt's
    `hf_quant_config.json` if there is one)."""
    config = ConfigFile(path, read_json(path, "model config"))
    config.refuse_unsupported()
    quant_path = quant_config_beside(path)
    quant = read_json(quant_path, "quantization config") if quant_path and quant_path.is_file() else None
    num_layers = config.positive_int("num_hidden_layers")
    hidden = config.positive_int("hidden_size")
    num_heads = config.positive_int("num_attention_heads")
    intermediate = config.positive_int("intermediate_size")
    if "head_dim" not in config.data and hidden % num_heads:
        config.fail(f"hidden_size {hidden} does not divide into num_attention_heads {num_heads} (give head_dim)")
    experts_key = "num_local_experts" if "num_local_experts" in config.data else "num_experts"
    num_experts = config.positive_int(experts_key, 0) if config.data.get(experts_key) else 0
    experts_per_tok = moe_intermediate = 0
    if num_experts:
        experts_per_tok = config.positive_int("num_experts_per_tok")
        moe_intermediate = config.positive_int("moe_intermediate_size", intermediate)
    dtype = config.text("torch_dtype", config.text("dtype", "bfloat16"))
    if dtype not in ("bfloat16", "float16", "float32"):
        config.fail(f"torch_dtype {clip(repr(dtype))} is not one of bfloat16, float16, float32")
    name = Path(config.text("_name_or_path", "")).name or (path.name.endswith("config.json") and path.parent.name)
    shapes: dict[str, Any] = dict(
        name=name or path.stem,
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=config.positive_int("num_key_value_heads", num_heads),
        head_dim=config.positive_int("head_dim", hidden // num_heads),
        intermediate_size=intermediate,
        vocab_size=config.positive_int("vocab_size"),
        dtype=dtype,
        max_model_len=config.positive_int("max_position_embeddings", 131072),
        tie_word_embeddings=config.flag("tie_word_embeddings", False),
        weight_dtype=config.weight_dtype(quant),
        num_experts=num_experts,
        num_experts_per_tok=experts_per_tok,
        moe_intermediate_size=moe_intermediate,
        source=str(path),
    )
    try:
        return ModelSpec(**shapes)
    except InputError as exc:  # shapes that do not fit together: say which file holds them
        config.fail(str(exc))


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in model by name, or a local `config.json` (or a folder holding one)."""
    if name_or_path.lower() in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path.lower()]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise InputError(f"unknown model {name_or_path!r}: not a built-in ({', '.join(BUILTIN_MODELS)}) "
                         "and no such config.json")
    return from_hf_config(path)
