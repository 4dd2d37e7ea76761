"""Model specs: the shapes that decide what a forward pass reads and computes.

A spec comes from a Hugging Face `config.json` (a local file, never a download, its fields checked by
`simulator.deploy.hf_config`) or a built-in name. Weight bytes, KV bytes per token and the linear
layers' shapes are derived from it, never typed in. `deployed` applies a run's dtypes and `shard`
gives the slice one GPU holds under tensor parallelism, as vLLM splits it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from simulator.deploy.hf_config import SLIDING_ARCHITECTURES, ConfigFile, quant_config_beside, read_json
from simulator.deploy.spec import DTYPE_BYTES, KV_CACHE_DTYPES, QUANTIZATIONS, ModelSpec
from simulator.errors import InputError, clip

__all__ = ["BUILTIN_MODELS", "DTYPE_BYTES", "KV_CACHE_DTYPES", "QUANTIZATIONS", "ModelSpec", "draft_model",
           "draft_weight_bytes", "from_hf_config", "load_model"]

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

def _from_hf(file: str) -> str:
    return f"Hugging Face {file.replace('--', '/')} config.json; ../shared/reference/models/"


# The models most deployments serve in 2026: MLA with shared experts and dense first layers in fp8 blocks
# (DeepSeek), the same with int4 routed experts (Kimi-K2.5, its text model), sliding-window layers with
# sinks and mxfp4 experts (gpt-oss), GQA with 256 fp8-block experts (MiniMax).
_DEEPSEEK_V3_SHAPES = dict(
    num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128, head_dim=192, intermediate_size=18432,
    vocab_size=129280, max_model_len=163840, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
    weight_dtype="fp8_block", kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
    first_dense_layers=3, shared_expert_intermediate_size=2048, num_nextn_predict_layers=1)
DEEPSEEK_V3 = ModelSpec(name="deepseek-v3", **_DEEPSEEK_V3_SHAPES, source=_from_hf("deepseek-ai--DeepSeek-V3"))  # type: ignore[arg-type]
DEEPSEEK_R1 = ModelSpec(name="deepseek-r1", **_DEEPSEEK_V3_SHAPES, source=_from_hf("deepseek-ai--DeepSeek-R1"))  # type: ignore[arg-type]
KIMI_K2_5 = ModelSpec(
    name="kimi-k2.5", num_layers=61, hidden_size=7168, num_heads=64, num_kv_heads=64, head_dim=192,
    intermediate_size=18432, vocab_size=163840, max_model_len=262144, num_experts=384, num_experts_per_tok=8,
    moe_intermediate_size=2048, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
    first_dense_layers=1, shared_expert_intermediate_size=2048, expert_dtype="int4",
    source=_from_hf("moonshotai--Kimi-K2.5") + " (its text_config)")
GPT_OSS_120B = ModelSpec(
    name="gpt-oss-120b", num_layers=36, hidden_size=2880, num_heads=64, num_kv_heads=8, head_dim=64,
    intermediate_size=2880, vocab_size=201088, num_experts=128, num_experts_per_tok=4, moe_intermediate_size=2880,
    expert_dtype="mxfp4", sliding_window=128, sliding_layers=18, attention_sinks=True,
    source=_from_hf("openai--gpt-oss-120b"))
MINIMAX_M2_5 = ModelSpec(
    name="minimax-m2.5", num_layers=62, hidden_size=3072, num_heads=48, num_kv_heads=8, head_dim=128,
    intermediate_size=1536, vocab_size=200064, max_model_len=196608, num_experts=256, num_experts_per_tok=8,
    moe_intermediate_size=1536, weight_dtype="fp8_block", qk_norm_across_heads=True,
    source=_from_hf("MiniMaxAI--MiniMax-M2.5"))

# A model small enough to run layer by layer on a CPU in seconds (calibration tests).
TINY = ModelSpec(
    name="tiny", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
    intermediate_size=512, vocab_size=1024, dtype="float32", max_model_len=4096, source="servesim's test model")

BUILTIN_MODELS = {spec.name: spec for spec in (LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, QWEN3_32B, QWEN3_30B_A3B,
                                               MIXTRAL_8X7B, DEEPSEEK_V3, DEEPSEEK_R1, KIMI_K2_5, GPT_OSS_120B,
                                               MINIMAX_M2_5, TINY)}


def from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face `config.json` of a supported architecture (and, beside it, modelopt's
    `hf_quant_config.json` if there is one). A multimodal wrapper (a `text_config` inside, as
    Kimi-K2.5's) is read as its text model; the vision tower is not counted."""
    data = read_json(path, "model config")
    if isinstance(data.get("text_config"), dict):
        data = data["text_config"] | {"tie_word_embeddings": data.get("tie_word_embeddings")}
    config = ConfigFile(path, data)
    architecture = config.architecture()
    quant_path = quant_config_beside(path)
    quant = read_json(quant_path, "quantization config") if quant_path and quant_path.is_file() else None
    num_layers = config.positive_int("num_hidden_layers")
    hidden = config.positive_int("hidden_size")
    num_heads = config.positive_int("num_attention_heads")
    intermediate = config.positive_int("intermediate_size")
    if "head_dim" not in config.data and hidden % num_heads:
        config.fail(f"hidden_size {hidden} does not divide into num_attention_heads {num_heads} (give head_dim)")
    experts_key = next((k for k in ("num_local_experts", "n_routed_experts") if k in config.data), "num_experts")
    num_experts = config.positive_int(experts_key, 0) if config.data.get(experts_key) else 0
    experts_per_tok = moe_intermediate = shared = 0
    if num_experts:
        experts_per_tok = config.positive_int("num_experts_per_tok")
        moe_intermediate = config.positive_int("moe_intermediate_size", intermediate)
        shared = config.count("n_shared_experts") * moe_intermediate + config.count("shared_intermediate_size")
    dtype = config.text("torch_dtype", config.text("dtype", "bfloat16"))
    if dtype not in ("bfloat16", "float16", "float32"):
        config.fail(f"torch_dtype {clip(repr(dtype))} is not one of bfloat16, float16, float32")
    name = Path(config.text("_name_or_path", "")).name or (path.name.endswith("config.json") and path.parent.name)
    weight_dtype, expert_dtype = config.weight_dtypes(quant)
    if expert_dtype is not None and not num_experts:
        config.fail(f"quantization_config quantizes experts ({expert_dtype}) of a model without experts")
    sliding_layers, window = config.sliding_layers(num_layers) if architecture in SLIDING_ARCHITECTURES else (0, 0)
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
        weight_dtype=weight_dtype,
        expert_dtype=expert_dtype,
        num_experts=num_experts,
        num_experts_per_tok=experts_per_tok,
        moe_intermediate_size=moe_intermediate,
        shared_expert_intermediate_size=shared,
        first_dense_layers=config.count("first_k_dense_replace") if num_experts else 0,
        sliding_layers=sliding_layers,
        sliding_window=window,
        attention_sinks=architecture in SLIDING_ARCHITECTURES,
        qk_norm_across_heads=config.qk_norm_across_heads(),
        num_nextn_predict_layers=config.count("num_nextn_predict_layers"),
        source=str(path),
    )
    if config.count("kv_lora_rank"):
        rope = config.positive_int("qk_rope_head_dim")
        shapes |= dict(kv_lora_rank=config.positive_int("kv_lora_rank"), q_lora_rank=config.count("q_lora_rank"),
                       qk_rope_head_dim=rope, head_dim=config.positive_int("qk_nope_head_dim") + rope,
                       v_head_dim=config.positive_int("v_head_dim"), num_kv_heads=num_heads)
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


def draft_model(method: str, target: ModelSpec, draft: str | None) -> ModelSpec | None:
    """The model that drafts for speculative decoding `method` on `target`: none for ngram (a lookup
    in the request's own tokens, on the host); for eagle one decoder layer of the target's shapes,
    its MLP dense (an EAGLE head); for mtp one of the target's multi-token prediction layers (its
    own layer's shapes, refused for a model without one); for draft the model `draft` names, which
    must share the target's vocabulary."""
    if method == "ngram":
        return None
    if method == "draft":
        assert draft is not None, "RunConfig asks for a --draft-model"
        try:
            drafter = load_model(draft)
        except InputError as exc:
            raise InputError(f"--draft-model: {exc}") from None
        if drafter.vocab_size != target.vocab_size:
            raise InputError(f"--draft-model {drafter.name} has a vocabulary of {drafter.vocab_size} tokens, "
                             f"{target.name} one of {target.vocab_size}: a draft model shares its target's tokenizer")
        return drafter
    if method == "mtp" and not target.num_nextn_predict_layers:
        raise InputError(f"--speculative-method mtp drafts with a model's multi-token prediction layers; {target.name} "
                         "has none (num_nextn_predict_layers in its config.json)")
    layer: dict[str, Any] = dict(num_layers=1, first_dense_layers=0, sliding_layers=0, sliding_window=0,
                                 attention_sinks=False, num_nextn_predict_layers=0)
    if method == "eagle":
        layer |= dict(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                      shared_expert_intermediate_size=0, expert_dtype=None)
    return replace(target, name=f"{target.name} {'EAGLE head' if method == 'eagle' else 'MTP layer'}", **layer)


def draft_weight_bytes(method: str, drafter: ModelSpec) -> int:
    """Bytes the drafter adds to GPU memory: a draft model's whole weights; an EAGLE head's or an MTP
    layer's own layer, which uses the target's embedding and LM head."""
    if method == "draft":
        return drafter.weight_bytes
    shared = drafter.vocab_size * drafter.hidden_size * (1 if drafter.tie_word_embeddings else 2) + drafter.hidden_size
    return drafter.weight_bytes - shared * drafter.dtype_bytes
