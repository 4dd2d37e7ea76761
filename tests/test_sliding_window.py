"""gpt-oss's sliding-window layers priced from each stack's measured windowed attention kernels
(`simulator.cost.window`), read here independently from the kernel database, and the rule that
keeps a windowed table only where the window was applied (`calibration.kernel_db.windowed_share`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from calibration.kernel_db import WINDOW_APPLIED, windowed_share
from simulator.cost import StepShape
from simulator.cost.measured import build_tables, measured_cost
from simulator.deploy.hardware import load_profile
from simulator.deploy.model import load_model

KERNEL_DB = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernel-db"
needs_db = pytest.mark.skipif(not KERNEL_DB.exists(), reason=f"reference kernel database missing: {KERNEL_DB}")
GPT_OSS = dict(num_heads=64, num_key_value_heads=8, head_dim=64)
"""gpt-oss-120b's attention on one GPU: 64 query heads of 64 over 8 KV heads; 18 of its 36 layers
attend to the last 128 tokens."""


def kernel(gpu: str, stack: str, version: str, table: str, window: int, **key: int) -> float:
    """The median latency (s) of the kernel-database rows of `key`, bf16 math over a bf16 cache."""
    source = {"trtllm": "torch_flow", "vllm": "vllm_flash_attn", "sglang": "fa3"}[stack]
    rows = pl.read_parquet(KERNEL_DB / gpu / "attention" / stack / version / f"{table}.parquet").filter(
        (pl.col("kernel_source") == source) & (pl.col("window_size") == window) & (pl.col("attn_dtype") == "bfloat16")
        & (pl.col("kv_cache_dtype") == "bfloat16"), *(pl.col(k) == v for k, v in (GPT_OSS | key).items()))
    assert rows.height, key
    return float(rows["latency"].median()) * 1e-3  # type: ignore[arg-type]


@needs_db
@pytest.mark.parametrize(("gpu", "stack", "version"), [("h200_sxm", "trtllm", "1.3.0rc20"),
                                                       ("h100_sxm", "sglang", "0.5.14")])
def test_gpt_oss_sliding_layers_take_the_measured_windowed_kernel_and_the_others_the_full_one(
        gpu: str, stack: str, version: str) -> None:
    model = load_model("gpt-oss-120b")
    assert (model.sliding_layers, model.sliding_window, model.num_layers) == (18, 128, 36)
    tables = build_tables(model, load_profile(f"{gpu}_{stack}"))
    assert tables.sliding is not None and tables.fallback is not None
    cost = measured_cost(model, f"{gpu}_{stack}")
    # 16 sequences at 4,096 tokens of context, one token each: a measured batch and context.
    decode = StepShape.from_rows([(1, 4096)] * 16)
    windowed = kernel(gpu, stack, version, "generation_attention_perf", 128, batch_size=16, isl=1, step=4095)
    full = kernel(gpu, stack, version, "generation_attention_perf", 0, batch_size=16, isl=1, step=4095)
    assert cost.sliding_attention(decode)[0] == pytest.approx(18 * windowed)
    assert cost.breakdown(decode)["decode_attention"] == pytest.approx(18 * windowed + 18 * full)
    assert windowed < full / 2  # it reads 128 of 4,096 keys
    # One 8,192-token prompt: 8,192 x 128 windowed query-key pairs, the measured prompt's own.
    prompt = StepShape.from_rows([(8192, 8192)])
    windowed = kernel(gpu, stack, version, "context_attention_perf", 128, batch_size=1, isl=8192, step=0)
    full = kernel(gpu, stack, version, "context_attention_perf", 0, batch_size=1, isl=8192, step=0)
    assert cost.sliding_attention(prompt)[1] == pytest.approx(18 * windowed)
    assert cost.breakdown(prompt)["prefill_attention"] == pytest.approx(18 * windowed + 18 * full)
    assert not any("attention" in note for note in tables.notes)


@needs_db
def test_vllms_h200_windowed_decode_rows_take_full_attentions_time_and_are_not_used() -> None:
    windowed = kernel("h200_sxm", "vllm", "0.19.0", "generation_attention_perf", 128, batch_size=16, isl=1, step=8191)
    full = kernel("h200_sxm", "vllm", "0.19.0", "generation_attention_perf", 0, batch_size=16, isl=1, step=8191)
    assert windowed == pytest.approx(full, rel=0.05)  # 128 of 8,192 keys read in the time of all of them
    h200, h100 = load_profile("h200_sxm_vllm"), load_profile("h100_sxm_vllm")
    assert "decode_attention_window" not in h200.tables and "decode_attention_window" in h100.tables
    assert "the window not applied" in h200.meta["families"]["decode_attention"]
    tables = build_tables(load_model("gpt-oss-120b"), h200)
    assert tables.sliding is not None and tables.sliding.decode is None and tables.sliding.prefill is not None
    assert any("sliding layers by roofline" in note for note in tables.notes)


def test_a_windowed_table_whose_rows_take_full_attentions_time_did_not_apply_the_window() -> None:
    keys = {"batch_size": [4, 4, 4], "num_heads": [8] * 3, "num_kv_heads": [1] * 3, "head_dim": [64] * 3,
            "context": [128, 2048, 8192]}
    full = pl.DataFrame(keys | {"latency": [1.0, 4.0, 10.0]})
    applied = pl.DataFrame(keys | {"window": [128] * 3, "latency": [1.0, 1.2, 1.5]})
    # From 16 windows (2,048 tokens) on: 1.2 / 4 and 1.5 / 10, median 0.225; the copy: 1.
    assert windowed_share(applied, full) == pytest.approx((0.3 + 0.15) / 2)
    assert windowed_share(applied.with_columns(latency=full["latency"]), full) == 1.0
    assert windowed_share(applied.filter(pl.col("context") < 2048), full) == 1.0  # nothing far enough to tell
    assert windowed_share(applied, full) < WINDOW_APPLIED <= 1.0


def test_a_stand_in_windowed_tables_extrapolation_is_priced_in_the_ranks_own_heads() -> None:
    # A windowed table of other heads (16 query heads over 2 KV heads, for a rank of 8 over 1: scaled
    # by 0.5) extrapolates past its largest context and pairs by the rank's own rooflines, which
    # the scale must not touch again. By hand, two layers: decode at 400 tokens = 2 x (0.5 x 2 ms
    # + (400 - 200) x 0.01 ms) = 6 ms; prefill of 500 pairs = 2 x (0.5 x 4 ms + (500 - 300) x 0.02 ms)
    # = 12 ms.
    from collections import Counter

    from simulator.cost import BatchCurves, attention_rows
    from simulator.cost.window import SlidingCurves

    rank = load_model("gpt-oss-120b").shard(8)
    assert (rank.num_heads, rank.num_kv_heads, rank.head_dim) == (8, 1, 64)
    heads = {"num_heads": 16, "num_kv_heads": 2, "head_dim": 64, "batch_size": 1}
    notes: list[str] = []
    decode = pl.DataFrame([heads | {"context": c, "latency": t} for c, t in ((100, 1.0), (200, 2.0))])
    prefill = pl.DataFrame([heads | {"pairs": p, "latency": t} for p, t in ((100, 2.0), (300, 4.0))])
    decode_rows, prefill_rows = (attention_rows(frame, rank, family, notes)
                                 for frame, family in ((decode, "decode"), (prefill, "prefill")))
    assert notes and all("scaled by 0.5" in note for note in notes)
    curves = SlidingCurves(2, 10_000, BatchCurves.from_frame("decode (window)", decode_rows, "context"),
                           BatchCurves.from_frame("prefill (window)", prefill_rows, "pairs"))
    shape = StepShape.from_rows([(1, 400)])
    decode_ms, _ = curves.time(shape, None, Counter(), lambda b, c: b * c * 0.01, 0.02)  # type: ignore[arg-type]
    assert decode_ms == pytest.approx(6.0)
    prompt = StepShape(1, 0, 0, 1, 10, 10, 500.0)  # one prompt whose windowed pairs are 500
    _, prefill_ms = curves.time(prompt, None, Counter(), lambda b, c: b * c * 0.01, 0.02)  # type: ignore[arg-type]
    assert prefill_ms == pytest.approx(12.0)
