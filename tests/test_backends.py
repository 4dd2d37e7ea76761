"""Serving stacks as profiles: each stack's tables against the kernel-database rows they came from
(read here independently with polars), its defaults against what its source says, its scheduling
rule on hand-counted cases, and `--backend` on the command line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import UnitCost, run, token_times
from test_cli import simulate_cli

from calibration.kernel_db import nearest_version
from simulator.config import RunConfig
from simulator.deploy.backends import DEFAULTS, bench_scheduler, stack_defaults, stack_settings
from simulator.deploy.hardware import available_gpus, load_profile
from simulator.errors import InputError
from simulator.metrics.summary import build_tables
from simulator.run.simulate import simulate
from workloads import Workload

KERNEL_DB = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernel-db"
NCCL = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernels"
VERSIONS = {"vllm": "0.19.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
needs_db = pytest.mark.skipif(not KERNEL_DB.exists(), reason=f"reference kernel database missing: {KERNEL_DB}")


def db(gpu: str, family: str, stack: str, table: str) -> pl.DataFrame:
    return pl.read_parquet(KERNEL_DB / gpu / family / stack / VERSIONS[stack] / f"{table}.parquet")


def latency(table: pl.DataFrame, **key: int | str) -> float:
    rows = table.filter(*(pl.col(name) == value for name, value in key.items()))
    assert rows.height == 1, (key, rows)
    return float(rows["latency"][0])


@needs_db
@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm"])
@pytest.mark.parametrize(("stack", "dtype", "kernel", "suffix"), [
    ("vllm", "bfloat16", "vllm_default", ""), ("vllm", "fp8", "vllm_default", "_fp8"),
    ("sglang", "fp8_block", "sglang_deepgemm_gemm_nt_f8f8bf16", "_fp8_block"),
    ("trtllm", "bfloat16", "torch_flow", ""), ("trtllm", "fp8", "torch_flow", "_fp8")])
def test_a_gemm_is_the_kernel_db_row_it_came_from(gpu: str, stack: str, dtype: str, kernel: str, suffix: str) -> None:
    rows = db(gpu, "gemm", stack, "gemm_perf").filter((pl.col("gemm_dtype") == dtype)
                                                     & (pl.col("kernel_source") == kernel))
    profile = load_profile(f"{gpu}_{stack}").tables["gemm" + suffix]
    for m, n, k in [(8, 5120, 5120), (1024, 8192, 5120), (1, 51200, 5120)]:
        row = rows.filter((pl.col("m") == m) & (pl.col("n") == n) & (pl.col("k") == k))
        assert row.height == 1
        assert latency(profile, m=m, n=n, k=k) == pytest.approx(row["latency"][0] * 1e-3, rel=1e-12)


@needs_db
@pytest.mark.parametrize("stack", ["vllm", "sglang", "trtllm"])
def test_attention_moe_and_all_reduce_are_the_kernel_db_rows(stack: str) -> None:
    gpu, profile = "h100_sxm", load_profile(f"h100_sxm_{stack}").tables
    kernel = {"vllm": "vllm_flash_attn", "sglang": "fa3", "trtllm": "torch_flow"}[stack]
    chosen = ((pl.col("kernel_source") == kernel) & (pl.col("window_size") == 0) & (pl.col("attn_dtype") == "bfloat16")
              & (pl.col("num_heads") == 32) & (pl.col("num_key_value_heads") == 8) & (pl.col("head_dim") == 128))
    # Decode: batch 16, one token over a context of 1 + 4095 (the database's isl + step).
    gen = db(gpu, "attention", stack, "generation_attention_perf").filter(
        chosen & (pl.col("batch_size") == 16) & (pl.col("isl") == 1) & (pl.col("step") == 4095))
    for kv, suffix in (("bfloat16", ""), ("fp8", "_fp8")):
        measured = gen.filter(pl.col("kv_cache_dtype") == kv)["latency"].median()
        assert latency(profile["decode_attention" + suffix], batch_size=16, context=4096, num_heads=32, num_kv_heads=8,
                       head_dim=128) == pytest.approx(measured * 1e-3)
    ctx = db(gpu, "attention", stack, "context_attention_perf").filter(
        chosen & (pl.col("batch_size") == 2) & (pl.col("isl") == 1024) & (pl.col("kv_cache_dtype") == "bfloat16"))
    assert latency(profile["prefill_attention"], batch_size=2, new_tokens=1024, context=1024, num_heads=32,
                   num_kv_heads=8, head_dim=128) == pytest.approx(ctx["latency"].median() * 1e-3)
    # MoE: Qwen3-30B-A3B's experts (hidden 2048, 768 per expert, top 8 of 128) at TP 2, bf16, 64 tokens.
    moe_kernel = {"vllm": "vllm_fused_moe", "sglang": "sglang_fused_moe_triton", "trtllm": "moe_torch_flow_cutlass"}
    moe = db(gpu, "moe", stack, "moe_perf").filter(
        (pl.col("kernel_source") == moe_kernel[stack]) & (pl.col("distribution") == "balanced")
        & (pl.col("moe_ep_size") == 1) & (pl.col("moe_tp_size") == 2) & (pl.col("moe_dtype") == "bfloat16")
        & (pl.col("hidden_size") == 2048) & (pl.col("inter_size") == 768) & (pl.col("num_experts") == 128)
        & (pl.col("topk") == 8) & (pl.col("num_tokens") == 64))
    assert latency(profile["moe"], dtype="bfloat16", num_tokens=64, hidden_size=2048, inter_size=384, topk=8,
                   num_experts=128) == pytest.approx(moe["latency"].median() * 1e-3)
    # All-reduce of 1 Mi bf16 elements (2 MiB) on 4 GPUs: the stack's graph-captured custom all-reduce.
    comm = db(gpu, "comm", stack, "custom_allreduce_perf").filter(
        (pl.col("num_gpus") == 4) & (pl.col("message_size") == 2**20))
    if stack != "trtllm":
        comm = comm.filter(pl.col("backend") == f"{stack}_graph")
    assert latency(profile["collectives"], num_gpus=4, message_bytes=2**21) == pytest.approx(comm["latency"][0] * 1e-3)


@needs_db
def test_the_h200s_vllm_prefill_attention_is_the_h100s_because_its_own_is_faster_than_the_gpu() -> None:
    """aiconfigurator's H200 vLLM context attention rows run up to hundreds of times the H200's
    989 TFLOP/s; the profile takes the same kernel measured on the H100 (the same compute)."""
    chosen = ((pl.col("kernel_source") == "vllm_flash_attn") & (pl.col("window_size") == 0)
              & (pl.col("attn_dtype") == "bfloat16") & (pl.col("kv_cache_dtype") == "bfloat16")
              & (pl.col("num_heads") == 64) & (pl.col("num_key_value_heads") == 8) & (pl.col("head_dim") == 128)
              & (pl.col("batch_size") == 1) & (pl.col("isl") == 8192) & (pl.col("step") == 0))
    flops = 4 * 64 * 128 * 8192 * 8193 / 2
    h200 = db("h200_sxm", "attention", "vllm", "context_attention_perf").filter(chosen)["latency"].median() * 1e-3
    h100 = db("h100_sxm", "attention", "vllm", "context_attention_perf").filter(chosen)["latency"].median() * 1e-3
    assert flops / h200 > 989e12 > flops / h100
    profile = load_profile("h200_sxm_vllm")
    assert latency(profile.tables["prefill_attention"], batch_size=1, new_tokens=8192, context=8192, num_heads=64,
                   num_kv_heads=8, head_dim=128) == pytest.approx(h100)
    assert "measured on the h100_sxm" in profile.meta["families"]["prefill_attention"]


@needs_db
@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm"])
def test_each_stacks_all_reduce_is_its_collectors_at_every_size(gpu: str) -> None:
    # aiconfigurator's collector times the stack's own tensor_model_parallel_all_reduce in a CUDA
    # graph, which picks custom all-reduce, symmetric memory or NCCL by size as a server does: its rows
    # at 64 MiB (past the custom all-reduce's 8 MiB) are what the profile holds, not NCCL's elsewhere.
    size = 2**25  # 16-bit elements
    for stack, captured in (("vllm", "vllm_graph"), ("sglang", "sglang_graph"), ("trtllm", None)):
        rows = db(gpu, "comm", stack, "custom_allreduce_perf")
        if captured is not None:
            rows = rows.filter(pl.col("backend") == captured)
        expected = rows.filter((pl.col("num_gpus") == 8) & (pl.col("message_size") == size)
                               & (pl.col("allreduce_dtype") == "bfloat16"))
        table = load_profile(f"{gpu}_{stack}").tables["collectives"]
        assert latency(table, num_gpus=8, message_bytes=2 * size) == pytest.approx(expected["latency"].median() * 1e-3)


def nccl_rows(gpu: str, op: str, num_gpus: int) -> pl.DataFrame:
    return (pl.read_parquet(NCCL / gpu / "nccl_perf.parquet")
            .filter((pl.col("op_name") == op) & (pl.col("nccl_dtype") == "half") & (pl.col("num_gpus") == num_gpus))
            .group_by("message_size").agg(pl.col("latency").median()).sort("message_size"))


@needs_db
def test_the_h200s_nccl_all_reduce_is_the_h100s_scaled_by_their_measured_halves() -> None:
    # The H200's NCCL file measures reduce-scatter, all-gather and all-to-all but no all-reduce. The
    # premise: the two boards' collectives agree (same NVLink 4 / NVSwitch generation) ...
    for op in ("reduce_scatter", "all_gather"):
        for n in (2, 4, 8):
            both = nccl_rows("h100_sxm", op, n).join(nccl_rows("h200_sxm", op, n), on="message_size", suffix="_h200")
            ratio = (both["latency_h200"] / both["latency"]).filter(both["message_size"] >= 2**18)
            assert 0.97 < float(ratio.median()) < 1.05, (op, n)
    # ... and on the H100 NCCL's all-reduce is never slower than its two halves run one after the other.
    for n in (2, 4, 8):
        h100 = (nccl_rows("h100_sxm", "all_reduce", n)
                .join(nccl_rows("h100_sxm", "reduce_scatter", n), on="message_size", suffix="_rs")
                .join(nccl_rows("h100_sxm", "all_gather", n), on="message_size", suffix="_ag"))
        assert (h100["latency"] <= h100["latency_rs"] + h100["latency_ag"]).all()
    # By hand at 8 GPUs and 32 MiB (16 Mi fp16 elements): H100 all-reduce x H200 halves / H100 halves.
    size = 2**24

    def at(gpu: str, op: str) -> float:
        rows = nccl_rows(gpu, op, 8).filter(pl.col("message_size") == size)
        return float(rows["latency"][0]) * 1e-3

    expected = at("h100_sxm", "all_reduce") * (at("h200_sxm", "reduce_scatter") + at("h200_sxm", "all_gather")) / (
        at("h100_sxm", "reduce_scatter") + at("h100_sxm", "all_gather"))
    assert latency(load_profile("h200_sxm").tables["collectives"], num_gpus=8, message_bytes=2 * size) == (
        pytest.approx(expected, rel=1e-9))  # the base profile's: vLLM 0.14's custom all-reduce to 8 MiB, NCCL above
    for profile in ("h200_sxm", "h200_sxm_vllm", "h200_sxm_sglang", "h200_sxm_trtllm"):  # with it off, every size
        table = load_profile(profile).tables["collectives_nccl"]
        assert latency(table, num_gpus=8, message_bytes=2 * size) == pytest.approx(expected, rel=1e-9)
        assert set(table["num_gpus"]) == {2, 4, 8}
        assert "derived" in json.loads((load_profile(profile).path / "profile.json").read_text())["families"][
            "collectives_nccl"]


@needs_db
@pytest.mark.parametrize("stack", ["vllm", "sglang", "trtllm"])
def test_profile_json_names_each_stack_version(stack: str) -> None:
    meta = json.loads((load_profile(f"h200_sxm_{stack}").path / "profile.json").read_text())
    assert meta["libraries"][stack] == VERSIONS[stack]
    assert f"{stack} {VERSIONS[stack]}" in meta["families"]["gemm"]
    assert "nearest" not in meta["families"]["gemm"]  # the asked-for version is there


def test_the_nearest_version_is_the_same_then_the_closest_then_the_newer() -> None:
    assert nearest_version(["0.5.10", "0.5.14"], "0.5.14") == "0.5.14"
    assert nearest_version(["0.5.10", "0.5.14"], "0.5.12") == "0.5.14"  # a tie: the newer
    assert nearest_version(["0.5.10", "0.5.14"], "0.5.1") == "0.5.10"
    assert nearest_version(["1.3.0rc10", "1.3.0rc20"], "1.3.0rc18") == "1.3.0rc20"
    assert nearest_version(["1.3.0rc10", "1.3.0rc20"], "1.3.0") == "1.3.0rc20"
    assert nearest_version(["0.12.0", "0.19.0"], "0.14.1") == "0.12.0"


def test_stack_defaults_are_their_sources() -> None:
    # vLLM 0.19 vllm/engine/arg_utils.py _set_default_args: OPENAI_API_SERVER on >= 70 GiB GPUs,
    # max_num_batched_tokens 8192, max_num_seqs 1024; V1 always chunks; prefix caching on.
    assert (DEFAULTS["vllm"].max_num_batched_tokens, DEFAULTS["vllm"].max_num_seqs) == (8192, 1024)
    assert DEFAULTS["vllm"].policy == "chunked" and DEFAULTS["vllm"].enable_prefix_caching
    # SGLang 0.5.x python/sglang/srt/server_args.py: chunked_prefill_size 8192 for 35-160 GiB GPUs
    # (H100, H200); enable_mixed_chunk False (prefill and decode batches apart); radix cache on.
    assert DEFAULTS["sglang"].max_num_batched_tokens == 8192 and DEFAULTS["sglang"].policy == "prefill-first"
    assert DEFAULTS["sglang"].enable_prefix_caching
    # TensorRT-LLM 1.x llmapi/llm_args.py: max_batch_size 2048, max_num_tokens 8192,
    # enable_chunked_prefill False, KvCacheConfig.enable_block_reuse True.
    assert (DEFAULTS["trtllm"].max_num_batched_tokens, DEFAULTS["trtllm"].max_num_seqs) == (8192, 2048)
    assert DEFAULTS["trtllm"].policy == "inflight" and DEFAULTS["trtllm"].enable_prefix_caching
    with pytest.raises(InputError, match="unknown --backend 'tgi'"):
        stack_defaults("tgi")


def test_aiconfigurator_bench_templates_budget_max_batch_plus_isl_plus_1500() -> None:
    # aiconfigurator 095f58a generator/rule_plugin/benchmark/*.rule, agg, default max batch 128.
    assert bench_scheduler("vllm", 1024).max_num_batched_tokens == 128 + 1024 + 1500
    assert bench_scheduler("vllm", 4096, 64).max_num_batched_tokens == 64 + 4096 + 1500
    assert bench_scheduler("trtllm", 1024).max_num_batched_tokens == 2656  # 2652 up to 32-token blocks
    assert not bench_scheduler("trtllm", 1024).enable_prefix_caching  # enable_block_reuse default false
    assert bench_scheduler("sglang", 1024).policy == "chunked"  # enable_mixed_chunk true


def test_backend_picks_its_profile_and_leaves_given_flags_alone() -> None:
    shipped = available_gpus()
    settings = {"backend": "sglang", "gpu": "h100_sxm", "policy": "continuous", "max_num_batched_tokens": 4096,
                "max_num_seqs": 1024, "enable_prefix_caching": True}
    chosen = stack_settings(settings, {"backend", "max_num_batched_tokens"}, shipped)
    assert chosen["gpu"] == "h100_sxm_sglang" and chosen["policy"] == "prefill-first"
    assert "max_num_batched_tokens" not in chosen  # given: the user's 4096 stays
    assert stack_settings(settings | {"gpu": "/some/folder"}, {"backend"}, shipped)["gpu"] == "/some/folder"


def test_tensorrt_llm_under_fp8_weights_takes_an_fp8_kv_cache_unless_told() -> None:
    # Its KV dtype `auto` follows the FP8 checkpoint; vLLM's is the model's dtype.
    shipped = available_gpus()
    settings = {"backend": "trtllm", "gpu": "h100_sxm", "quantization": "fp8", "kv_cache_dtype": "auto"}
    assert stack_settings(settings, {"backend", "quantization"}, shipped)["kv_cache_dtype"] == "fp8"
    assert "kv_cache_dtype" not in stack_settings(settings, {"backend", "quantization", "kv_cache_dtype"}, shipped)
    assert "kv_cache_dtype" not in stack_settings(settings | {"quantization": None}, {"backend"}, shipped)
    assert "kv_cache_dtype" not in stack_settings(settings | {"backend": "vllm"}, {"backend"}, shipped)


def test_prefill_first_runs_prefill_chunks_alone_while_decoders_wait() -> None:
    # Budget 8. A (2 prompt, 6 out) at 0; B (20, 2) at 0.5. B's prompt runs in chunks 8, 8, 4 in steps
    # of its own (A stalls), then A and B decode together.
    result, _ = run("prefill-first", [0.0, 0.5], [2, 20], [6, 2], max_num_batched_tokens=8, max_num_seqs=8)
    steps = build_tables(result).steps
    assert steps["prefill_tokens"].to_list() == [2, 8, 8, 4, 0, 0, 0, 0, 0]
    assert steps["decode_tokens"].to_list() == [0, 0, 0, 0, 2, 1, 1, 1, 1]
    assert token_times(result, 0) == [1.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert token_times(result, 1) == [4.0, 5.0]


def test_inflight_batches_whole_prompts_beside_decodes_within_the_budget() -> None:
    # Budget 8 counts the decoders. A (2, 6) at 0; B (6, 2) and C (8, 1) at 0.5. At t=1 A decodes (1)
    # and B's whole prompt fits (1 + 6); C's 8 never fits beside a decoder, so it waits for A's end.
    result, _ = run("inflight", [0.0, 0.5, 0.5], [2, 6, 8], [6, 2, 1], max_num_batched_tokens=8, max_num_seqs=8)
    steps = build_tables(result).steps
    assert steps["prefill_tokens"].to_list() == [2, 6, 0, 0, 0, 0, 8]
    assert token_times(result, 1) == [2.0, 3.0]
    assert token_times(result, 2) == [7.0]
    with pytest.raises(InputError, match="larger than --max-num-batched-tokens 8"):
        run("inflight", [0.0], [9], [1], max_num_batched_tokens=8, max_num_seqs=8)


def test_run_with_backend_uses_the_stack_profile_and_scheduler(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, _, err = simulate_cli(["run", "--backend", "trtllm", "--cost", "measured", "--num-requests", "20",
                                 "--input-len", "300", "--output-len", "20", "--out", str(out)], capsys)
    assert code == 0, err
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert (settings["gpu"], settings["policy"], settings["max_num_seqs"]) == ("h100_sxm_trtllm", "inflight", 2048)


def test_a_prompt_pool_repeats_whole_prompts_which_hit_the_prefix_cache() -> None:
    from simulator.run.clients import pool_content, pool_draws

    draws = pool_draws(250, 100, np.random.default_rng(0), shuffled=True)
    for start in (0, 100):  # each pass holds every entry once
        assert sorted(draws[start:start + 100].tolist()) == list(range(100))
    assert sorted(draws[200:].tolist()) == sorted(set(draws[200:].tolist()))
    lengths, content = pool_content(np.array([10, 20, 30]), np.array([2, 0, 2]))
    assert lengths.tolist() == [30, 10, 30] and content[0] == content[2] != content[1]
    # One entry of 64 tokens (4 blocks of 16): every prompt after the first finds 3 blocks cached (a hit
    # stops short of the last token, as vLLM's: at most 63 tokens, whole blocks) and computes 16.
    prompts, content = pool_content(np.array([64]), np.zeros(3, np.int64))
    workload = Workload(prompts, np.ones(3, np.int64), np.array([0.0, 5.0, 10.0]), None, content=content)
    cost = UnitCost()
    simulate(RunConfig(policy="chunked"), workload, cost)  # type: ignore[arg-type]
    assert [s.prefill_tokens for s in cost.shapes] == [64, 16, 16]


def test_a_row_of_a_stack_reruns_on_that_stacks_profile_and_scheduler() -> None:
    from simulator.sim2real.compare import default_profile, point_config
    from simulator.sim2real.measured import MeasuredPoint

    point = MeasuredPoint("p", "g", "qwen3-32b", "h100_sxm", 2, None, 80, 8, 8, None, 1.0, (1024,), (128,),
                          {"ttft_mean": 0.1}, "sglang", "0.5.1.post1")
    assert default_profile("h100_sxm", "sglang") == "h100_sxm_sglang"
    config = point_config(point, default_profile(point.gpu, point.backend))
    assert (config.policy, config.max_num_batched_tokens, config.backend) == ("prefill-first", 8192, "sglang")
    trt = point_config(replace(point, backend="trtllm"), "h100_sxm_trtllm")
    assert (trt.policy, trt.max_num_seqs) == ("inflight", 2048)
    assert point_config(replace(point, backend="vllm"), "h100_sxm_vllm").policy == "chunked"


def test_a_table_comes_from_the_nearest_version_that_holds_it_and_says_so(tmp_path: Path) -> None:
    from calibration.kernel_db import find_table

    root = tmp_path / "h100_sxm"
    for family, version, table in (("gemm", "0.5.10", "gemm_perf"), ("gemm", "0.5.14", "gemm_perf"),
                                   ("comm", "0.5.12", "wideep_deepep_ll_perf"),
                                   ("comm", "0.5.9", "custom_allreduce_perf")):
        folder = root / family / "sglang" / version
        folder.mkdir(parents=True)
        (folder / "collection_meta.yaml").write_text(f"runtime:\n  framework: sglang\n  version: {version}\n")
        (folder / f"{table}.parquet").write_bytes(b"")
    assert find_table(tmp_path, "h100_sxm", "gemm", "sglang", "gemm_perf", "0.5.12").version == "0.5.14"
    # 0.5.12 holds no custom all-reduce: the nearest folder that does is taken.
    assert find_table(tmp_path, "h100_sxm", "comm", "sglang", "custom_allreduce_perf", "0.5.14").version == "0.5.9"
    with pytest.raises(FileNotFoundError, match="no version holds moe_perf"):
        find_table(tmp_path, "h100_sxm", "moe", "sglang", "moe_perf", "0.5.14")


@needs_db
def test_a_profile_built_for_another_version_names_the_one_it_took(tmp_path: Path) -> None:
    from calibration.kernel_db import stack_tables

    found = stack_tables(KERNEL_DB, "h100_sxm", "sglang", NCCL / "h100_sxm" / "nccl_perf.parquet",
                         {"bfloat16": 989e12, "fp8": 1978e12}, version="0.5.9")
    assert found.versions["gemm_perf"] == "0.5.14"
    assert "sglang 0.5.14, nearest to 0.5.9" in found.families["gemm"]


def test_inflight_starts_a_request_only_when_kv_holds_it_to_its_last_token() -> None:
    # TensorRT-LLM's GUARANTEED_NO_EVICT: 3 blocks of 4 tokens; A and B (4 prompt + 4 output = 2 blocks
    # each at their end) arrive together. B's prompt fits beside A's (2 blocks of 3), but not its end
    # beside A's: it starts when A has finished, and nobody is ever preempted. Continuous batching
    # (vLLM's rule: the prompt fits now) starts both at once.
    settings = {"max_num_batched_tokens": 16, "max_num_seqs": 8, "block_size": 4, "num_gpu_blocks_override": 3}
    result, _ = run("inflight", [0.0, 0.0], [4, 4], [4, 4], **settings)
    a, b = token_times(result, 0), token_times(result, 1)
    assert b[0] > a[-1]
    assert build_tables(result).requests["preemptions"].to_list() == [0, 0]
    vllm, _ = run("continuous", [0.0, 0.0], [4, 4], [4, 4], **settings)
    assert token_times(vllm, 1)[0] == token_times(vllm, 0)[0]
