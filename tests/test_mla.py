"""Step costs of issue 25's models against hand-computed references: MLA attention in its two forms
(decode absorbed over the latent cache, prefill up-projected), a sliding window bounding attention,
an expert-parallel dispatch's bytes, and `simulate batch-table` for each deployment the issue names,
every step between the active- and total-parameter rooflines where that bound holds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from simulator.cli.main import run
from simulator.config import RunConfig
from simulator.cost import RooflineCost, StepShape, build_cost_model
from simulator.cost.batch_table import batch_table
from simulator.cost.operators import all_to_all_bytes
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.run.sizing import gpu_shard, kv_cache_blocks

H200 = load_gpu("h200_sxm")


def decode(batch: int, context: int) -> StepShape:
    return StepShape.from_rows([(1, context)] * batch)


def test_mla_decode_reads_the_latent_not_full_heads() -> None:
    """Beyond the kernel's fixed time, decode attention at TP 8 is memory-bound (16 heads x 2 x 1088
    FLOPs per 1152 bytes) and each cached token costs (512 + 64) x 2 bytes per layer."""
    cost = RooflineCost(load_model("deepseek-v3"), H200, 8)
    extra = cost.step_time(decode(8, 4000)) - cost.step_time(decode(8, 2000))
    assert extra == pytest.approx(61 * 8 * 2000 * 1152 / H200.attn_bw, rel=1e-9)


def test_mla_attention_forms_by_hand() -> None:
    """FLOPs per query-key pair at 16 heads a GPU: absorbed decode scores 512 + 64 latent dimensions
    and sums 512; prefill scores keys of 128 + 64 and sums values of 128."""
    cost = RooflineCost(load_model("deepseek-v3"), H200, 8)
    pairs = 1e9
    assert cost.attention_time(0, pairs) - cost.attention_time(0, 0) == pytest.approx(
        16 * 2 * (576 + 512) * pairs / H200.attn_flops)
    assert cost.attention_time(0, pairs, True) - cost.attention_time(0, 0, True) == pytest.approx(
        16 * 2 * (192 + 128) * pairs / H200.attn_flops)


def test_a_window_bounds_attention() -> None:
    """gpt-oss: past 128 tokens only the 18 full-attention layers read more KV (2048 bytes a token);
    inside the window all 36 do."""
    gpu = load_gpu("h100_sxm")
    cost = RooflineCost(load_model("gpt-oss-120b"), gpu)
    far = cost.step_time(decode(4, 4000)) - cost.step_time(decode(4, 2000))
    assert far == pytest.approx(18 * 4 * 2000 * 2048 / gpu.attn_bw, rel=1e-9)
    near = cost.step_time(decode(4, 100)) - cost.step_time(decode(4, 50))
    assert near == pytest.approx(36 * 4 * 50 * 2048 / gpu.attn_bw, rel=1e-9)
    # The array form, used for runs of decode steps, gives the same numbers.
    times = cost.decode_step_times(4, np.array([4 * 2000, 4 * 100]))
    assert list(times) == [cost.step_time(decode(4, 2000)), cost.step_time(decode(4, 100))]


def test_expert_parallel_dispatch_bytes_by_hand() -> None:
    """4 tokens, each to 8 experts, 7168 bf16 values, 7 of 8 GPUs' experts remote."""
    ep8 = load_model("deepseek-v3").shard(1, 8)
    assert all_to_all_bytes(ep8, 4) == 4 * 8 * 7168 * 2 * 7 / 8
    assert all_to_all_bytes(load_model("deepseek-v3").shard(8), 4) == 0  # no expert parallelism, no all-to-all


KERNEL_DB = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernel-db"
needs_kernel_db = pytest.mark.skipif(not KERNEL_DB.exists(), reason=f"kernel-db missing: {KERNEL_DB}")


@needs_kernel_db
def test_measured_mla_decode_is_the_kernel_dbs() -> None:
    """Decode attention of 8 sequences of 2048 tokens at 16 heads a GPU: the SGLang MLA kernel's
    measured time (ms in the kernel-db), in each of 61 layers."""
    config = RunConfig(model="deepseek-v3", gpu="h200_sxm", cost="measured", tensor_parallel_size=8)
    cost = build_cost_model(config, load_model("deepseek-v3"), H200)
    raw = pl.read_parquet(KERNEL_DB / "h200_sxm" / "mla" / "sglang" / "0.5.14" / "generation_mla_perf.parquet")
    ms = raw.filter((pl.col("num_heads") == 16) & (pl.col("batch_size") == 8) & (pl.col("isl") + pl.col("step") == 2048)
                    & (pl.col("kv_cache_dtype") == "bfloat16") & (pl.col("mla_dtype") == "bfloat16"))["latency"]
    assert cost.breakdown(decode(8, 2048))["decode_attention"] == pytest.approx(61 * ms.median() * 1e-3)


def test_measured_cost_prices_what_its_tables_lack_by_roofline() -> None:
    """The shipped H100 profile has no mxfp4 fused-MoE rows nor any sliding-window attention kernels."""
    gpu = load_gpu("h100_sxm")
    config = RunConfig(model="gpt-oss-120b", gpu="h100_sxm", cost="measured")
    cost = build_cost_model(config, load_model("gpt-oss-120b"), gpu)
    assert any("routed experts (mxfp4): priced by roofline" in note for note in cost.notes)
    assert any("sliding-window layers, attention sinks: priced by roofline" in note for note in cost.notes)
    roofline = RooflineCost(load_model("gpt-oss-120b"), gpu)
    parts = cost.breakdown(decode(8, 2000))
    assert parts["decode_attention"] == pytest.approx(roofline.attention_all_layers(decode(8, 2000)))
    assert parts["moe"] == pytest.approx(36 * roofline.moe_time(8))


@needs_kernel_db
def test_measured_all_to_all_is_deepeps() -> None:
    """Data-parallel attention over 8 H200s (TP 1): the collectives of a step of 8 tokens a rank are
    58 MoE layers of DeepEP's measured low-latency dispatch and combine (microseconds in the
    kernel-db), no all-reduce."""
    config = RunConfig(model="deepseek-v3", gpu="h200_sxm", cost="measured", data_parallel_size=8,
                       enable_expert_parallel=True, num_replicas=8)
    cost = build_cost_model(config, load_model("deepseek-v3"), H200)
    raw = pl.read_parquet(KERNEL_DB / "h200_sxm" / "comm" / "sglang" / "0.5.12" / "wideep_deepep_ll_perf.parquet")
    row = raw.filter((pl.col("hidden_size") == 7168) & (pl.col("num_topk") == 8) & (pl.col("num_experts") == 256)
                     & (pl.col("num_token") == 8))
    assert row.height == 1
    both = (row["dispatch_avg_t_us"][0] + row["combine_avg_t_us"][0]) * 1e-6
    assert cost.breakdown(decode(8, 2000))["collectives"] == pytest.approx(58 * both)


@needs_kernel_db
def test_model_tables_from_the_kernel_db() -> None:
    from calibration.kernel_db_models import model_tables

    tables = model_tables(KERNEL_DB, "h200_sxm", "vllm")
    assert set(tables) == {"mla_decode_attention.parquet", "mla_prefill_attention.parquet", "moe_quant.parquet",
                           "all_to_all.parquet"}
    moe = tables["moe_quant.parquet"]
    assert {"mxfp4", "int4"} <= set(moe["dtype"].to_list())
    kimi = moe.filter((pl.col("dtype") == "int4") & (pl.col("num_experts") == 384) & (pl.col("inter_size") == 256)
                      & (pl.col("expert_parallel") == 1))
    assert kimi.height > 0  # Kimi-K2.5's experts at tensor parallel 8: 2048 / 8 per GPU
    assert set(tables["all_to_all.parquet"]["op"].to_list()) == {"dispatch", "combine"}


@needs_kernel_db
def test_vllm_int4_experts_are_the_marlin_kernels() -> None:
    """vLLM's int4 experts (Kimi-K2.5 at TP 8, 64 tokens) are the Marlin MoE kernel's measured time
    (ms in the kernel-db, SGLang's collection), not vLLM's rows of the Triton w4a16 kernel, which take
    several times longer for the same shape."""
    from calibration.kernel_db_models import model_tables

    def kernel_db_ms(stack: str, version: str) -> float:
        raw = pl.read_parquet(KERNEL_DB / "h200_sxm" / "moe" / stack / version / "moe_perf.parquet")
        return float(raw.filter((pl.col("moe_dtype") == "int4_wo") & (pl.col("num_experts") == 384)
                                & (pl.col("moe_tp_size") == 8) & (pl.col("moe_ep_size") == 1)
                                & (pl.col("distribution") == "balanced") & (pl.col("num_tokens") == 64)
                                )["latency"].median())

    moe = model_tables(KERNEL_DB, "h200_sxm", "vllm")["moe_quant.parquet"]
    row = moe.filter((pl.col("dtype") == "int4") & (pl.col("num_experts") == 384) & (pl.col("inter_size") == 256)
                     & (pl.col("expert_parallel") == 1) & (pl.col("num_tokens") == 64))
    marlin = kernel_db_ms("sglang", "0.5.14")
    assert row["latency"].to_list() == [pytest.approx(marlin * 1e-3)]
    assert kernel_db_ms("vllm", "0.19.0") > 2 * marlin


# (model, GPU, tensor parallel, data parallel, model-card active and total parameters, fewest and most
# bytes a weight takes): DeepSeek-V3 37B/671B in fp8 blocks; Kimi-K2.5 32B/1.04T, experts int4 (4.5
# bits), the rest bf16; gpt-oss-120b 5.13B (without embeddings)/116.8B, experts mxfp4 (4.25 bits);
# MiniMax-M2.5 10B/230B in fp8 blocks.
DEPLOYMENTS = [
    ("deepseek-v3", "h200_sxm", 8, 1, 37e9, 671e9, 1.0, 1.0),
    ("deepseek-v3", "h200_sxm", 1, 8, 37e9, 671e9, 1.0, 1.0),
    ("kimi-k2.5", "h200_sxm", 8, 1, 32e9, 1.04e12, 4.5 / 8, 2.0),
    ("gpt-oss-120b", "h100_sxm", 1, 1, 5.13e9, 116.8e9, 4.25 / 8, 2.0),
    ("minimax-m2.5", "h200_sxm", 4, 1, 10e9, 230e9, 1.0, 1.0),
]
CONTEXT = 2300


@pytest.mark.parametrize(("name", "gpu_name", "tp", "dp", "active", "total", "least", "most"), DEPLOYMENTS)
def test_batch_table_steps_lie_between_the_parameter_rooflines(name: str, gpu_name: str, tp: int, dp: int,
                                                               active: float, total: float, least: float,
                                                               most: float) -> None:
    """A decode step reads at least the active weights' share of one GPU at the datasheet's bandwidth,
    and at small batches at most every weight the GPU holds at its slowest achieved rate, plus the KV,
    the collectives and a generous 30 kernel launches per layer."""
    model, gpu = load_model(name), load_gpu(gpu_name)
    config = RunConfig(model=name, gpu=gpu_name, tensor_parallel_size=tp, data_parallel_size=dp,
                       enable_expert_parallel=dp > 1, num_replicas=dp)
    shard = gpu_shard(config, model)
    capacity = kv_cache_blocks(config, model, gpu, CONTEXT) * config.block_size
    cost = build_cost_model(config, model, gpu)
    table = batch_table(shard, cost, CONTEXT, [1, 8], capacity, dp)
    assert table.max_batch >= 8
    slowest = min(gpu.mem_bw, gpu.fp8_mem_bw or gpu.mem_bw, gpu.attn_bw)
    latencies = model.num_layers * 30 * max(gpu.kernel_latency, gpu.attn_kernel_latency)
    for row in table.rows.iter_rows(named=True):
        lower = active * least / (tp * dp) / gpu.datasheet_mem_bw
        upper = (total * most / (tp * dp) + row["kv_bytes"]) / slowest + row["all_reduce_time"] + latencies
        assert lower < row["step_time"] < upper, row
        assert row["kv_bytes"] == row["batch"] * shard.kv_bytes_for_context(CONTEXT)  # per GPU


def test_batch_table_kv_is_the_hand_computed_size() -> None:
    assert load_model("deepseek-v3").kv_bytes_for_context(CONTEXT) == CONTEXT * 61 * (512 + 64) * 2
    assert load_model("gpt-oss-120b").kv_bytes_for_context(CONTEXT) == (CONTEXT + 128) * 18 * 2 * 8 * 64 * 2


@pytest.mark.parametrize("argv", [
    ["--model", "deepseek-v3", "--gpu", "h200_sxm", "--tensor-parallel-size", "8"],
    ["--model", "deepseek-v3", "--gpu", "h200_sxm", "--data-parallel-size", "8", "--enable-expert-parallel"],
    ["--model", "kimi-k2.5", "--gpu", "h200_sxm", "--tensor-parallel-size", "8"],
    ["--model", "gpt-oss-120b", "--gpu", "h100_sxm"],
    ["--model", "minimax-m2.5", "--gpu", "h200_sxm", "--tensor-parallel-size", "4", "--cost", "measured"],
])
def test_simulate_batch_table_runs_each_deployment(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    codes: list[int] = []
    run(["batch-table", *argv, "--batch", "1,64"], exit=codes.append)
    out, err = capsys.readouterr()
    assert codes == [0], err
    steps = [float(line.split()[1]) for line in out.splitlines() if re.match(r"\s+(1|64)\s", line)]
    assert len(steps) == 2 and 0 < steps[0] < steps[1]


def test_data_parallel_without_expert_parallelism_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    codes: list[int] = []
    run(["batch-table", "--model", "deepseek-v3", "--gpu", "h200_sxm", "--data-parallel-size", "8"],
        exit=codes.append)
    _, err = capsys.readouterr()
    assert codes == [2] and err.count("\n") == 1 and "add --enable-expert-parallel" in err
