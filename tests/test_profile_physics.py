"""No measured kernel in a shipped profile is faster than its GPU's datasheet allows, and a kernel
table that is (aiconfigurator's H200 vLLM prefill attention, up to 260x the peak) is not used:
the same kernel measured on a GPU of the same compute stands in (`calibration.kernel_db`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from calibration.kernel_db import Source, checked_prefill
from simulator.deploy.hardware import available_gpus, load_profile
from simulator.deploy.physics import row_flops

FP8_OVER_BF16 = 2.0
"""Hopper's dense fp8 tensor rate over its bf16 one (H100 and H200 SXM datasheets: 1,979 and 989
TFLOP/s); profiles carry the bf16 one."""


def causal_pairs(frame: pl.DataFrame) -> pl.Series:
    """Query-key pairs of prompts with no cached prefix: sum over queries i = 1..n of i."""
    assert (frame["new_tokens"] == frame["context"]).all()
    n = frame["new_tokens"].cast(pl.Float64)
    return n * (n + 1) / 2


def fastest(frame: pl.DataFrame, work: pl.Series, rate: float) -> float:
    """The largest ratio of a row's work at `rate` to its measured latency (over 1: impossible)."""
    return float((work / rate / frame["latency"]).max() or 0.0)


@pytest.mark.parametrize("gpu", available_gpus())
def test_no_shipped_kernel_is_faster_than_its_gpus_datasheet(gpu: str) -> None:
    profile = load_profile(gpu)
    flops, bandwidth = float(profile.meta["datasheet_flops"]), float(profile.meta["datasheet_mem_bw"])
    tables = profile.tables
    for name, rate in (("prefill_attention", flops), ("prefill_attention_fp8", FP8_OVER_BF16 * flops)):
        if name in tables and tables[name].height:
            t = tables[name]
            work = 4.0 * t["batch_size"] * t["num_heads"] * t["head_dim"] * causal_pairs(t)
            assert fastest(t, work, rate) <= 1.0, (gpu, name)
    for name, rate in (("prefill_attention_window", flops), ("prefill_attention_window_fp8", FP8_OVER_BF16 * flops)):
        if name in tables:  # query i sees min(i, window) keys
            t = tables[name]
            n, w = t["new_tokens"].cast(pl.Float64), t["window"].cast(pl.Float64)
            past = w * (w + 1) / 2 + (n - w) * w
            pairs = causal_pairs(t).zip_with(n <= w, past)
            work = 4.0 * t["batch_size"] * t["num_heads"] * t["head_dim"] * pairs
            assert fastest(t, work, rate) <= 1.0, (gpu, name)
    for name, weight_bytes, rate in (("gemm", 2, flops), ("gemm_fp8", 1, FP8_OVER_BF16 * flops),
                                     ("gemm_fp8_block", 1, FP8_OVER_BF16 * flops)):
        if name in tables:
            t = tables[name]
            assert fastest(t, 2.0 * t["m"] * t["n"] * t["k"], rate) <= 1.0, (gpu, name, "FLOPs")
            assert fastest(t, (t["n"] * t["k"] * weight_bytes).cast(pl.Float64), bandwidth) <= 1.0, (gpu, name, "bytes")
    for name, kv_bytes in (("decode_attention", 2), ("decode_attention_fp8", 1)):
        if name in tables:
            # Keys and values of head_dim each: heads up to 128 wide (wider ones may carry narrower values).
            t = tables[name].filter(pl.col("head_dim") <= 128)
            work = (t["batch_size"] * t["context"] * 2 * t["num_kv_heads"] * t["head_dim"] * kv_bytes).cast(pl.Float64)
            assert fastest(t, work, bandwidth) <= 1.0, (gpu, name)
    if "moe" in tables:  # gate, up and down for every routed token, at the fp8 rate whatever the dtype
        t = tables["moe"]
        work = 2.0 * t["num_tokens"] * t["topk"] * 3 * t["hidden_size"] * t["inter_size"]
        assert fastest(t, work, FP8_OVER_BF16 * flops) <= 1.0, (gpu, "moe")


COLUMNS = {"kernel_source": "fa3", "window_size": 0, "beam_width": 1, "attn_dtype": "bfloat16",
           "kv_cache_dtype": "bfloat16", "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "step": 0}
PEAK = 989e12


def context_table(path: Path, latencies_ms: dict[tuple[int, int], float]) -> Source:
    """A kernel-database context attention file of (batch, isl) -> latency rows of one head shape."""
    rows = [COLUMNS | {"batch_size": b, "isl": isl, "latency": ms} for (b, isl), ms in latencies_ms.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(path)
    return Source(path, "0.0.1")


def test_a_prefill_table_faster_than_the_peak_is_replaced_by_the_same_kernel_on_a_twin(tmp_path: Path) -> None:
    # One prompt of 8,192 tokens, 32 heads of 128: 4 x 32 x 128 x 8192 x 8193 / 2 = 5.50e11 FLOPs,
    # 0.556 ms at 989 TFLOP/s. The H200-like table says 0.05 ms: impossible.
    own = context_table(tmp_path / "own.parquet", {(1, 1024): 0.05, (1, 8192): 0.05})
    twin = context_table(tmp_path / "twin.parquet", {(1, 1024): 0.06, (1, 8192): 1.0})
    table, source, wrong = checked_prefill(own, lambda: twin, "fa3", "bfloat16", PEAK)
    assert source is twin
    assert wrong is not None and "1 of 2" in wrong
    assert sorted(table["latency"].to_list()) == pytest.approx([0.06e-3, 1.0e-3])


def test_a_prefill_table_within_the_peak_is_its_own(tmp_path: Path) -> None:
    own = context_table(tmp_path / "own.parquet", {(1, 1024): 0.06, (1, 8192): 1.0})

    def no_stand_in() -> Source:
        raise AssertionError("a table within the peak needs no stand-in")

    table, source, wrong = checked_prefill(own, no_stand_in, "fa3", "bfloat16", PEAK)
    assert (source, wrong) == (own, None)
    assert sorted(table["latency"].to_list()) == pytest.approx([0.06e-3, 1.0e-3])


def test_a_prefill_table_faster_than_the_peak_with_nothing_sound_to_stand_in_stops_the_build(tmp_path: Path) -> None:
    own = context_table(tmp_path / "own.parquet", {(1, 8192): 0.05})
    with pytest.raises(ValueError, match="1 of 1 bfloat16 KV rows faster than the GPU's 989 TFLOP/s"):
        checked_prefill(own, lambda: None, "fa3", "bfloat16", PEAK)
    bad_twin = context_table(tmp_path / "twin.parquet", {(1, 8192): 0.3})
    with pytest.raises(ValueError, match="so are rows of"):
        checked_prefill(own, lambda: bad_twin, "fa3", "bfloat16", PEAK)


def test_a_profile_with_a_row_faster_than_its_gpu_is_refused_in_one_line_naming_the_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's profile (`calibration/measure.py` on their GPU, or one shared with them) whose prefill
    kernel is timed 1,000 times too fast: every prediction on it would be too fast."""
    from test_cli import simulate_cli

    shutil.copytree(load_profile("h100_sxm_vllm").path, tmp_path / "gpu")
    path = tmp_path / "gpu" / "prefill_attention.parquet"
    table = pl.read_parquet(path)
    # 8,192 tokens of 32 heads of 128: 4 x 32 x 128 x 8192 x 8193 / 2 = 0.55 TFLOP, 0.56 ms at 989 TFLOP/s.
    row = table.with_row_index().filter((pl.col("batch_size") == 1) & (pl.col("new_tokens") == 8192)
                                        & (pl.col("context") == 8192) & (pl.col("num_heads") == 32)
                                        & (pl.col("num_kv_heads") == 8) & (pl.col("head_dim") == 128))["index"][0]
    latency = table["latency"].to_list()
    assert latency[row] > 4 * 32 * 128 * 8192 * 8193 / 2 / 989e12
    latency[row] /= 1000
    table.with_columns(latency=pl.Series(latency)).write_parquet(path)
    code, _, err = simulate_cli(["batch-table", "--gpu", str(tmp_path / "gpu"), "--cost", "measured",
                                 "--batch", "1,4"], capsys)
    assert code != 0
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"prefill_attention.parquet': row {row + 1} (" in line and "989 TFLOP/s" in line, line
    assert len(line) <= 300, line


def test_the_flops_of_a_prompt_under_a_window_are_counted_query_by_query() -> None:
    """Ten tokens under a 4-token window: queries 1..10 see 1, 2, 3, 4, 4, ... keys, 34 pairs; a
    chunk of 4 after 4 cached sees 4 each, 16; a 3-token prompt 1 + 2 + 3. Without the window, the
    same rows are 55, 26 and 6 pairs; 4 FLOPs per pair, head and head size."""
    rows = pl.DataFrame({"batch_size": [1, 2, 1], "num_heads": [1, 1, 3], "head_dim": [1, 1, 2],
                         "new_tokens": [10, 4, 3], "context": [10, 8, 3], "window": [4, 4, 4]})
    windowed = rows.select(row_flops("prefill_attention_window")).to_series().to_list()
    full = rows.select(row_flops("prefill_attention")).to_series().to_list()
    assert windowed == [4 * 34, 4 * 2 * 16, 4 * 6 * 6]
    assert full == [4 * 55, 4 * 2 * 26, 4 * 6 * 6]
