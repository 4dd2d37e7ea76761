"""What no measured kernel can do: compute faster than its GPU's datasheet allows.

A profile's tables are measurements someone made (`calibration/measure.py` on a user's GPU,
`calibration/kernel_db.py` from aiconfigurator's kernel database), and a row that computes faster
than the GPU's dense tensor rate is a measurement gone wrong: aiconfigurator's H200 vLLM prefill
attention ran up to 260 times the H200's peak, and every prediction built on it came out too fast.
`too_fast` finds such rows by the FLOPs each row must do, which no cache can skip: a GEMM's
2 m n k, prefill attention's 4 x heads x head size per causal query-key pair (under a window, each
query's pairs capped at the window). Bytes are not checked: a small operand held in the L2 cache
can move faster than the HBM datasheet. The rate is the datasheet's bf16 dense one, twice that for
fp8 operands (weights, or a KV cache an attention kernel may compute over in fp8): the fp8 dense
rate of every GPU with fp8 tensor cores (Ada, Hopper, Blackwell).
"""

from __future__ import annotations

import polars as pl

FP8_OVER_BF16 = 2.0

CHECKED = {
    "gemm": 1.0, "gemm_fp8": FP8_OVER_BF16, "gemm_fp8_block": FP8_OVER_BF16,
    "prefill_attention": 1.0, "prefill_attention_fp8": FP8_OVER_BF16,
    "prefill_attention_window": 1.0, "prefill_attention_window_fp8": FP8_OVER_BF16,
}
"""The tables checked, and the multiple of the bf16 dense rate that bounds their rows."""


def _keys_seen(positions: pl.Expr, window: pl.Expr) -> pl.Expr:
    """Query-key pairs of the queries at positions 1..`positions` when each sees min(position, window) keys."""
    return (pl.when(positions <= window).then(positions * (positions + 1) / 2)
            .otherwise(window * (window + 1) / 2 + (positions - window) * window))


def row_flops(family: str) -> pl.Expr:
    """The floating-point operations of a row of `family` (a key of CHECKED)."""
    if family.startswith("gemm"):
        return 2.0 * pl.col("m").cast(pl.Float64) * pl.col("n") * pl.col("k")
    context, cached = pl.col("context").cast(pl.Float64), (pl.col("context") - pl.col("new_tokens")).cast(pl.Float64)
    window = pl.col("window").cast(pl.Float64) if "window" in family else context  # a window of all: causal
    pairs = _keys_seen(context, window) - _keys_seen(cached, window)
    return 4.0 * pl.col("batch_size").cast(pl.Float64) * pl.col("num_heads") * pl.col("head_dim") * pairs


LOAD_ALLOWANCE = 1.5
"""How far past its profile's rate a row may compute when a profile is loaded: a profile that
`calibration/measure.py` wrote records its best measured GEMM rate as the datasheet rate, which
another kernel may pass by a little; no kernel passes it by half again. (The shipped profiles hold
to their true datasheets exactly: tests/test_profile_physics.py.)"""


def too_fast(family: str, table: pl.DataFrame, bf16_flops: float, allowance: float = 1.0) -> pl.DataFrame:
    """The rows of `table` (latency in seconds) that compute faster than `allowance` x the GPU's
    dense rate for `family`'s operands, with the multiple of that rate they would need (`share`);
    empty if none, or if `family` is not checked."""
    if family not in CHECKED or table.height == 0:
        return table.clear().with_columns(share=pl.lit(0.0))
    rate = CHECKED[family] * bf16_flops
    return (table.with_row_index("row").with_columns(share=row_flops(family) / pl.col("latency") / rate)
            .filter(pl.col("share") > allowance))
