"""The models of issue 25 (DeepSeek-V3/R1 and Kimi-K2.5 with MLA, gpt-oss-120b, MiniMax-M2.5): the
built-ins against their config.json files field by field, parameter counts against the model cards,
and every new size (MLA's latent KV, a window's KV cap, 4-bit and block-fp8 weights) against a
hand-computed tiny case."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from simulator.cost.contract import StepShape
from simulator.deploy.memory import sliding_window_reserve_bytes
from simulator.deploy.model import load_model
from simulator.deploy.spec import ModelSpec
from simulator.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "models"
needs_models = pytest.mark.skipif(not MODELS.exists(), reason=f"reference model configs missing: {MODELS}")
FILES = {"deepseek-v3": "deepseek-ai--DeepSeek-V3", "deepseek-r1": "deepseek-ai--DeepSeek-R1",
         "kimi-k2.5": "moonshotai--Kimi-K2.5", "gpt-oss-120b": "openai--gpt-oss-120b",
         "minimax-m2.5": "MiniMaxAI--MiniMax-M2.5"}


def raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / f"{FILES[name]}.config.json").read_text())
    return data.get("text_config", data)


@needs_models
@pytest.mark.parametrize("name", sorted(FILES))
def test_builtins_match_their_config_json_field_by_field(name: str) -> None:
    """Each field read straight from the JSON (not through servesim's reader)."""
    c, spec = raw(name), load_model(name)
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.vocab_size, spec.max_model_len) == (
        c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["vocab_size"],
        c["max_position_embeddings"])
    assert spec.intermediate_size == c["intermediate_size"]
    assert spec.num_experts == c.get("n_routed_experts", c.get("num_local_experts"))
    assert spec.num_experts_per_tok == c["num_experts_per_tok"]
    assert spec.moe_intermediate_size == c.get("moe_intermediate_size", c["intermediate_size"])
    assert spec.first_dense_layers == c.get("first_k_dense_replace", 0)
    assert spec.shared_expert_intermediate_size == c.get("n_shared_experts", 0) * spec.moe_intermediate_size
    if "kv_lora_rank" in c:
        assert (spec.kv_lora_rank, spec.q_lora_rank, spec.qk_rope_head_dim, spec.v_head_dim) == (
            c["kv_lora_rank"], c["q_lora_rank"], c["qk_rope_head_dim"], c["v_head_dim"])
        assert spec.head_dim == c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    else:
        assert (spec.num_kv_heads, spec.head_dim) == (c["num_key_value_heads"], c["head_dim"])
    types = c.get("layer_types", [])
    assert spec.sliding_layers == types.count("sliding_attention")
    assert spec.sliding_window == (c["sliding_window"] if types else 0)
    method = c.get("quantization_config", {}).get("quant_method")
    assert spec.expert_dtype == {"mxfp4": "mxfp4", "compressed-tensors": "int4"}.get(method)
    assert spec.weight_dtype == ("fp8_block" if method == "fp8" else None)
    assert FILES[name].replace("--", "/") in spec.source
    assert spec.qk_norm_across_heads == (c.get("use_qk_norm", False) and c.get("qk_norm_type") == "per_layer")


# Model cards: DeepSeek-V3 "671B total parameters with 37B activated" (685B with the MTP module servesim
# does not load); Kimi K2 "1.04 trillion total, 32 billion activated"; gpt-oss-120b 116.83B total,
# 5.13B active (the card counts active parameters without the embedding table); MiniMax-M2 "230B total".
@pytest.mark.parametrize(("name", "total", "active"), [
    ("deepseek-v3", 671e9, 37e9), ("kimi-k2.5", 1.04e12, 32e9), ("minimax-m2.5", 230e9, None)])
def test_parameter_counts_match_the_model_cards(name: str, total: float, active: float | None) -> None:
    spec = load_model(name)
    assert spec.num_params == pytest.approx(total, rel=0.015)
    if active is not None:
        assert spec.active_params == pytest.approx(active, rel=0.03)


def test_gpt_oss_parameters_and_checkpoint_size() -> None:
    spec = load_model("gpt-oss-120b")
    assert spec.num_params == pytest.approx(116.83e9, rel=0.001)
    assert spec.active_params - spec.vocab_size * spec.hidden_size == pytest.approx(5.13e9, rel=0.01)
    # The card: "fits into a single 80GB GPU" thanks to mxfp4 experts; bf16 experts would not.
    assert 60e9 < spec.weight_bytes < 70e9


def test_mla_kv_is_the_latent_and_is_not_split_by_tensor_parallelism() -> None:
    v3 = load_model("deepseek-v3")
    assert v3.kv_bytes_per_token_per_layer == (512 + 64) * 2  # kv_lora_rank + qk_rope_head_dim, bf16
    assert v3.kv_bytes_per_token == 61 * 1152 == 70272
    assert v3.deployed(None, "fp8").kv_bytes_per_token == 61 * 576
    assert v3.shard(8).kv_bytes_per_token == 70272  # vLLM keeps the whole latent on every rank
    kimi = load_model("kimi-k2.5")
    assert kimi.kv_bytes_per_token == 61 * 1152  # half DeepSeek's heads, the same latent


# A two-layer dense MLA model, every size by hand: hidden 64, 4 heads, q_lora 16, kv_lora 8, rope 4,
# nope 8 (so head_dim 12), v 8, MLP 32, vocabulary 10.
TINY_MLA = ModelSpec(name="tiny-mla", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=12,
                     intermediate_size=32, vocab_size=10, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
                     v_head_dim=8)


def test_tiny_mla_by_hand() -> None:
    assert dict((n, (a, b)) for n, a, b in TINY_MLA.attention_shapes) == {
        "qkv_a": (16 + 8 + 4, 64), "q_b": (4 * 12, 16), "kv_b": (4 * (8 + 8), 8), "attn_out": (64, 4 * 8)}
    per_layer = 28 * 64 + 48 * 16 + 64 * 8 + 64 * 32 + 3 * 64 * 32 + (2 * 64 + 16 + 8)  # GEMMs, MLP, norms
    assert TINY_MLA.num_params == 2 * per_layer + 2 * 10 * 64 + 64
    assert TINY_MLA.kv_bytes_per_token == 2 * (8 + 4) * 2
    tp2 = TINY_MLA.shard(2)
    assert (tp2.num_heads, tp2.kv_lora_rank, tp2.kv_bytes_per_token) == (2, 8, 48)


def test_a_window_caps_the_sliding_layers_kv() -> None:
    oss = load_model("gpt-oss-120b")
    per_layer = 2 * 8 * 64 * 2  # K and V of 8 KV heads of 64, bf16
    assert oss.kv_bytes_per_token == 18 * per_layer  # the 18 full-attention layers grow with the context
    assert oss.kv_bytes_for_context(100) == 36 * 100 * per_layer  # inside the window: every layer
    assert oss.kv_bytes_for_context(5000) == 18 * 5000 * per_layer + 18 * 128 * per_layer
    assert sliding_window_reserve_bytes(oss, 256) == 256 * 18 * 128 * per_layer
    assert sliding_window_reserve_bytes(load_model("llama-3.1-8b"), 256) == 0


def test_four_bit_experts_by_hand() -> None:
    """One MoE layer: hidden 64, 2 query heads and 1 KV head of 32, 4 experts of 32 (top 2), vocabulary 100."""
    spec = ModelSpec(name="tiny-moe", num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=32,
                     intermediate_size=32, vocab_size=100, num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32, expert_dtype="mxfp4")
    attention = (64 + 64) * 64 + 64 * 64
    experts = 4 * 3 * 64 * 32
    rest = 4 * 64 + 2 * 64 + 2 * 100 * 64 + 64  # router, norms, embeddings and LM head, final norm
    assert spec.num_params == attention + experts + rest
    assert spec.weight_bytes == 2 * attention + experts * 17 // 32 + 2 * rest  # 4.25 bits per expert weight
    int4 = ModelSpec(**{**spec.__dict__, "expert_dtype": "int4"})
    assert int4.weight_bytes == 2 * attention + experts * 18 // 32 + 2 * rest  # 4 bits + a bf16 scale per 32


def test_block_fp8_counts_one_fp32_scale_per_block() -> None:
    """qkv (128 + 2 x 128) x 128: 3 blocks; attn_out, down: 1 each; gate_up 256 x 128: 2."""
    spec = ModelSpec(name="tiny-fp8", num_layers=1, hidden_size=128, num_heads=1, num_kv_heads=1, head_dim=128,
                     intermediate_size=128, vocab_size=10)
    block = ModelSpec(**{**spec.__dict__, "weight_dtype": "fp8_block"})
    linear = 3 * 128 * 128 + 128 * 128 + 3 * 128 * 128
    assert block.weight_bytes == linear + 2 * (spec.num_params - linear) + 7 * 4


def test_expert_parallelism_holds_whole_experts() -> None:
    v3 = load_model("deepseek-v3")
    ep8 = v3.shard(1, 8)
    assert (ep8.local_experts, ep8.moe_intermediate_size, ep8.num_heads) == (32, 2048, 128)
    tp8 = v3.shard(8)
    assert (tp8.local_experts, tp8.moe_intermediate_size) == (256, 256)
    # The routed experts weigh the same spread either way; EP keeps attention and shared experts whole.
    routed = 58 * 256 * 3 * 7168 * 2048
    assert 8 * ep8.moe_layers * ep8.local_experts * ep8.expert_params == routed
    with pytest.raises(InputError, match="does not divide"):
        v3.shard(1, 3)


@needs_models
@pytest.mark.parametrize(("file", "named"), [
    ("zai-org--GLM-5", "index_topk 2048 means sparse indexer attention"),
    ("Qwen--Qwen3.5-397B-A17B", "full_attention_interval 4 means linear attention layers")])
def test_what_cannot_be_priced_is_refused_in_one_line(file: str, named: str) -> None:
    with pytest.raises(InputError, match=named) as caught:
        load_model(str(MODELS / f"{file}.config.json"))
    assert "\n" not in str(caught.value)


def test_gpt_oss_layer_types_are_checked(tmp_path: Path) -> None:
    config = {"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 32,
              "vocab_size": 10, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16,
              "layer_types": ["sliding_attention", "full_attention"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = load_model(str(path))
    assert (spec.sliding_layers, spec.sliding_window, spec.attention_sinks) == (1, 16, True)
    path.write_text(json.dumps(config | {"layer_types": ["sliding_attention", "chunked_attention"]}))
    with pytest.raises(InputError, match="layer_types must list one of"):
        load_model(str(path))
    path.write_text(json.dumps(config | {"architectures": ["MistralForCausalLM"]}))
    with pytest.raises(InputError, match="sliding_window 16 means sliding-window attention"):
        load_model(str(path))


def test_minimax_norms_its_queries_and_keys_across_the_tensor_parallel_gpus(tmp_path: Path) -> None:
    """MiniMax normalizes q and k over all heads: each layer under TP all-reduces two fp32 partial
    variances per token besides the two hidden-state all-reduces; on one GPU there is nothing to
    reduce. By hand at TP 4 on the H200 profile, 16 tokens: 62 layers x t(16 x 8 bytes)."""
    from collections import Counter

    from simulator.cost.measured import measured_cost
    from simulator.cost.operators import layer_all_reduces
    from simulator.cost.parallel import AllReduce, all_reduce_table
    from simulator.deploy.hardware import load_gpu, load_profile

    minimax = load_model("minimax-m2.5")
    assert minimax.qk_norm_across_heads and not load_model("qwen3-32b").qk_norm_across_heads
    assert layer_all_reduces(minimax.shard(4), 16) == ((2, 16 * 3072 * 2), (1, 16 * 8))
    per_head = replace(minimax, qk_norm_across_heads=False)
    reduce = AllReduce(4, load_gpu("h200_sxm_vllm"), all_reduce_table(load_profile("h200_sxm_vllm")))
    variances = 62 * reduce.time(16 * 8, Counter())
    assert 62 * 3e-6 < variances < 62 * 20e-6  # a few microseconds each: a latency-bound message
    shape = StepShape(16, 16, 16 * 1000)
    across = measured_cost(minimax, "h200_sxm_vllm", 4).breakdown(shape)["collectives"]
    assert across - measured_cost(per_head, "h200_sxm_vllm", 4).breakdown(shape)["collectives"] == pytest.approx(
        variances, rel=1e-9)
    assert measured_cost(minimax, "h200_sxm_vllm", 1).breakdown(shape)["collectives"] == 0
    config = {"architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 32,
              "vocab_size": 10, "num_local_experts": 4, "num_experts_per_tok": 2, "use_qk_norm": True,
              "qk_norm_type": "per_layer"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert load_model(str(path)).qk_norm_across_heads
    path.write_text(json.dumps(config | {"use_qk_norm": False}))
    assert not load_model(str(path)).qk_norm_across_heads
    path.write_text(json.dumps(config | {"qk_norm_type": "per_group"}))
    with pytest.raises(InputError, match='qk_norm_type "per_group" is not per_head or per_layer') as caught:
        load_model(str(path))
    assert "\n" not in str(caught.value)


KERNEL_DB = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernel-db"


@pytest.mark.skipif(not KERNEL_DB.exists(), reason=f"reference kernel database missing: {KERNEL_DB}")
@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm"])
def test_mla_prefill_attention_never_outlasts_the_whole_measured_mla_module(gpu: str) -> None:
    """A part cannot take longer than the whole: every profile's MLA prefill attention (one prompt,
    bf16 KV, heads per GPU) stays under the whole MLA module, its projections included, as vLLM
    0.19's and TensorRT-LLM's collectors measured it at the same heads and prompt length, for the
    prompts of the measured rows (1,024-16,384 tokens; at 32,768 vLLM's module, its own attention
    kernel inside, is up to 15% quicker than TensorRT-LLM's kernel). SGLang 0.5.14's kernel rows,
    which the vLLM and SGLang profiles took before, are up to 3x over it."""
    import polars as pl

    from simulator.deploy.hardware import load_profile

    modules = [pl.read_parquet(path).filter((pl.col("batch_size") == 1) & (pl.col("step") == 0)
                                            & (pl.col("kv_cache_dtype") == "bfloat16")
                                            & pl.col("isl").is_between(1024, 16384))
               .group_by("num_heads", "isl").agg(pl.col("latency").min() * 1e-3)
               for path in sorted(KERNEL_DB.glob(f"{gpu}/mla/*/*/mla_context_module_perf.parquet"))]
    assert len(modules) == 2
    for profile in (gpu, f"{gpu}_vllm", f"{gpu}_sglang", f"{gpu}_trtllm"):
        table = load_profile(profile).tables["mla_prefill_attention"].filter(
            (pl.col("dtype") == "bfloat16") & (pl.col("batch_size") == 1))
        for module in modules:
            both = table.join(module, left_on=["num_heads", "new_tokens"], right_on=["num_heads", "isl"],
                              suffix="_module")
            assert both.height >= 20, profile
            assert (both["latency"] < both["latency_module"]).all(), (profile, both.filter(
                pl.col("latency") >= pl.col("latency_module")).head(3))
