"""Model specs: derived sizes against published architectures and parameter counts, shards, and
config.json files that are wrong or describe what servesim cannot price."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.cli.main import run
from simulator.deploy.model import LLAMA_3_1_8B, from_hf_config, load_model
from simulator.errors import InputError

# Llama-3.1-8B's config.json as published by Meta on Hugging Face (the fields servesim reads).
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "torch_dtype": "bfloat16", "vocab_size": 128256, "tie_word_embeddings": False,
}


def test_llama_derived_sizes() -> None:
    assert LLAMA_3_1_8B.kv_bytes_per_token == 128 * 1024
    assert LLAMA_3_1_8B.num_params == pytest.approx(8.03e9, rel=1e-3)  # "8B": 8,030,261,248
    assert LLAMA_3_1_8B.weight_bytes == 2 * LLAMA_3_1_8B.num_params


def test_hf_config_gives_the_same_spec(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_CONFIG))
    spec = load_model(str(tmp_path))
    assert spec.num_params == LLAMA_3_1_8B.num_params
    assert spec.kv_bytes_per_token == LLAMA_3_1_8B.kv_bytes_per_token
    assert spec.linear_shapes == LLAMA_3_1_8B.linear_shapes


def test_bad_configs_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown model 'nope'"):
        load_model("nope")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_model(str(bad))
    bad.write_text(json.dumps({k: v for k, v in LLAMA_CONFIG.items() if k != "hidden_size"}))
    with pytest.raises(InputError, match="lacks hidden_size"):
        load_model(str(bad))


MODELS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "models"
needs_models = pytest.mark.skipif(not MODELS.exists(), reason=f"reference model configs missing: {MODELS}")
REFERENCE_FILES = {
    "llama-3.1-8b": "meta-llama--Meta-Llama-3.1-8B", "llama-3.1-70b": "meta-llama--Meta-Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama--Meta-Llama-3.1-405B", "qwen3-32b": "Qwen--Qwen3-32B",
    "qwen3-30b-a3b": "Qwen--Qwen3-30B-A3B", "mixtral-8x7b": "mistralai--Mixtral-8x7B-v0.1",
    "deepseek-v3": "deepseek-ai--DeepSeek-V3", "deepseek-r1": "deepseek-ai--DeepSeek-R1",
    "kimi-k2.5": "moonshotai--Kimi-K2.5", "gpt-oss-120b": "openai--gpt-oss-120b",
    "minimax-m2.5": "MiniMaxAI--MiniMax-M2.5",
}


@needs_models
@pytest.mark.parametrize("name", sorted(REFERENCE_FILES))
def test_builtins_are_their_config_json(name: str) -> None:
    from_file = from_hf_config(MODELS / f"{REFERENCE_FILES[name]}.config.json")
    builtin = load_model(name)
    assert replace(from_file, name=name) == builtin
    assert REFERENCE_FILES[name].replace("--", "/") in builtin.source


# Published parameter counts (model cards): Qwen3-30B-A3B "30.5B total, 3.3B activated"; Mixtral-8x7B
# 46.7B total, 12.9B active per token; Llama-3.1 70B and 405B; Qwen3-32B "32.8B".
@pytest.mark.parametrize(("name", "total", "active"), [
    ("qwen3-30b-a3b", 30.5e9, 3.3e9), ("mixtral-8x7b", 46.7e9, 12.9e9), ("llama-3.1-70b", 70.6e9, 70.6e9),
    ("llama-3.1-405b", 405.9e9, 405.9e9), ("qwen3-32b", 32.8e9, 32.8e9)])
def test_parameter_counts_match_the_model_cards(name: str, total: float, active: float) -> None:
    spec = load_model(name)
    assert spec.num_params == pytest.approx(total, rel=0.01)
    assert spec.active_params == pytest.approx(active, rel=0.02)


@needs_models
def test_mixtral_is_priced_as_a_mixture_not_a_dense_llama() -> None:
    spec = from_hf_config(MODELS / "mistralai--Mixtral-8x7B-v0.1.config.json")
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (8, 2, 14336)
    assert [name for name, _, _ in spec.linear_shapes] == ["qkv", "attn_out", "router"]


@needs_models
def test_fp8_checkpoints_imply_fp8_weights() -> None:
    assert from_hf_config(MODELS / "Qwen--Qwen3-235B-A22B-FP8.config.json").weight_dtype == "fp8_block"
    # modelopt writes the quantisation beside config.json, in hf_quant_config.json.
    spec = from_hf_config(MODELS / "nvidia--Llama-3.1-70B-Instruct-FP8.config.json")
    assert spec.weight_dtype == "fp8"
    # Linear layers in 1 byte; embeddings, LM head (2 x 128256 x 8192) and norms (161 x 8192) in 2.
    assert spec.weight_bytes == spec.num_params + 2 * 128256 * 8192 + 161 * 8192


def test_deployed_dtypes_and_memory() -> None:
    fp8 = LLAMA_3_1_8B.deployed("fp8", "fp8")
    assert fp8.kv_bytes_per_token == LLAMA_3_1_8B.kv_bytes_per_token // 2
    kept = 2 * 128256 * 4096 + 65 * 4096  # embeddings, LM head and norms stay bf16
    assert fp8.weight_bytes == (LLAMA_3_1_8B.num_params - kept) + 2 * kept
    assert LLAMA_3_1_8B.deployed(None, "auto") == LLAMA_3_1_8B


def test_shards_as_vllm_splits_them() -> None:
    from simulator.deploy.model import LLAMA_3_1_70B, QWEN3_30B_A3B

    tp4 = LLAMA_3_1_70B.shard(4)
    assert (tp4.num_heads, tp4.num_kv_heads, tp4.intermediate_size, tp4.vocab_size) == (16, 2, 7168, 32064)
    tp16 = LLAMA_3_1_70B.shard(16)
    assert (tp16.num_heads, tp16.num_kv_heads) == (4, 1)  # 8 KV heads, each held by two GPUs
    assert tp16.kv_bytes_per_token == LLAMA_3_1_70B.kv_bytes_per_token // 8
    moe = QWEN3_30B_A3B.shard(4)
    assert (moe.num_experts, moe.moe_intermediate_size) == (128, 192)  # every expert, a quarter of each
    # Per-GPU weights add up to the model's plus what every GPU repeats (norms, router).
    replicated = 48 * (2 * 2048 + 128 * 2048) + 2048
    assert 4 * moe.num_params == QWEN3_30B_A3B.num_params + 3 * replicated
    with pytest.raises(InputError, match="--tensor-parallel-size 3 does not divide"):
        LLAMA_3_1_70B.shard(3)


LLAMA = dict(LLAMA_CONFIG)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_hidden_layers", True, "num_hidden_layers must be a positive integer, got true"),
    ("hidden_size", "4096", 'hidden_size must be a positive integer, got "4096"'),
    ("num_attention_heads", 0, "num_attention_heads must be a positive integer, got 0"),
    ("num_key_value_heads", -8, "num_key_value_heads must be a positive integer, got -8"),
    ("head_dim", 128.0, "head_dim must be a positive integer, got 128.0"),
    ("intermediate_size", [14336], "intermediate_size must be a positive integer, got [14336]"),
    ("vocab_size", None, "lacks vocab_size"),
    ("max_position_embeddings", False, "max_position_embeddings must be a positive integer, got false"),
    ("tie_word_embeddings", "no", 'tie_word_embeddings must be true or false, got "no"'),
    ("torch_dtype", 16, "torch_dtype must be a string, got 16"),
    ("torch_dtype", "int4", "torch_dtype 'int4' is not one of"),
    ("_name_or_path", 7, "_name_or_path must be a string, got 7"),
    ("architectures", "LlamaForCausalLM", 'architectures must be a list of names, got "LlamaForCausalLM"'),
    ("quantization_config", "fp8", 'quantization_config must be an object, got "fp8"'),
    ("quantization_config", {"quant_method": "awq"}, 'quant_method "awq": servesim prices fp8, mxfp4 and'),
])
def test_every_field_read_is_type_checked(field: str, value: object, message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = LLAMA | {field: value}
    (tmp_path / "config.json").write_text(json.dumps(config))
    codes: list[int] = []
    run(["batch-table", "--model", str(tmp_path), "--batch", "1"], exit=codes.append)
    out, err = capsys.readouterr()
    assert codes == [2] and out == ""
    assert err.startswith("error: model config") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(("fields", "named"), [
    ({"num_local_experts": True, "num_experts_per_tok": 2}, "num_local_experts must be a positive integer, got true"),
    ({"num_experts": 8, "num_experts_per_tok": "2"}, 'num_experts_per_tok must be a positive integer, got "2"'),
    ({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 0},
     "moe_intermediate_size must be a positive integer, got 0"),
    ({"num_experts": 8, "num_experts_per_tok": 9}, "num_experts >= num_experts_per_tok"),
])
def test_moe_fields_are_type_checked(fields: dict[str, object], named: str, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA | {"architectures": ["MixtralForCausalLM"]} | fields))
    with pytest.raises(InputError, match=re.escape(named)):
        load_model(str(tmp_path))


@pytest.mark.parametrize(("fields", "named"), [
    ({"architectures": ["GPT2LMHeadModel"]}, "architectures GPT2LMHeadModel is not one servesim can price"),
    ({"architectures": ["DeepseekV32ForCausalLM"]}, "architectures DeepseekV32ForCausalLM"),
    ({"index_topk": 2048, "kv_lora_rank": 512}, "index_topk 2048 means sparse indexer attention"),
    ({"kv_lora_rank": 512}, "kv_lora_rank 512 means multi-head latent attention (MLA)"),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096},
     "sliding_window 4096 means sliding-window attention"),
    ({"full_attention_interval": 4}, "full_attention_interval 4 means linear attention layers"),
    ({"shared_expert_intermediate_size": 5632}, "shared_expert_intermediate_size 5632 means shared experts"),
    ({"decoder_sparse_step": 2}, "decoder_sparse_step 2 means dense layers among the MoE layers"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu': servesim prices gated SiLU MLPs only"),
])
def test_unpriceable_architectures_are_refused_naming_the_field(fields: dict[str, object], named: str,
                                                                tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA | fields))
    with pytest.raises(InputError, match=re.escape(named)):
        load_model(str(tmp_path))


def test_switched_off_sliding_window_is_accepted(tmp_path: Path) -> None:
    # Qwen configs carry a window size with use_sliding_window false: full attention.
    (tmp_path / "config.json").write_text(json.dumps(LLAMA | {"sliding_window": 131072, "use_sliding_window": False}))
    assert load_model(str(tmp_path)).num_params == LLAMA_3_1_8B.num_params


def test_a_model_that_does_not_fit_is_refused_with_a_way_out(capsys: pytest.CaptureFixture[str]) -> None:
    codes: list[int] = []
    run(["batch-table", "--model", "llama-3.1-70b", "--batch", "1"], exit=codes.append)
    _, err = capsys.readouterr()
    assert codes == [2] and err.count("\n") == 1
    assert "llama-3.1-70b's weights (bfloat16) need 141.1 GB per GPU" in err
    assert "77.3 GB usable" in err and "try --tensor-parallel-size 4" in err
    run(["batch-table", "--model", "llama-3.1-70b", "--batch", "1", "--tensor-parallel-size", "4"],
        exit=codes.append)
    assert codes[-1] == 0
