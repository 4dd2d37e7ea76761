"""Experts split by tensor parallelism more finely than any split the tables measured.

A GPU holding 1/N of every expert (tensor parallel N) reads 1/N of the touched experts' weights and
does 1/N of their FLOPs; so does a GPU holding 1/N of the experts whole (expert parallel N). Where a
profile measured the N-way split neither of its family nor finer, servesim prices it as the measured
expert-parallel-N kernel times the split / expert-parallel ratio at the finest split measured both
ways (`finer_split_curve`). Checked by hand on a tiny table, and against the measured splits of the
shipped profiles themselves, each held out of the table that predicts it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from simulator.cost import MoeTable
from simulator.cost.model_tables import finer_split_curve
from simulator.deploy.hardware import Profile, load_profile
from simulator.deploy.model import QWEN3_30B_A3B
from simulator.deploy.spec import ModelSpec

KERNEL_DB = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernel-db"
needs_kernel_db = pytest.mark.skipif(not KERNEL_DB.exists(), reason=f"reference data missing: {KERNEL_DB}")
DTYPES = ("bfloat16", "fp8", "fp8_block")
SHAPE = {"hidden_size": 64, "topk": 2, "num_experts": 8}
TOKENS = [4, 8]  # from E / k = 4 tokens on, balanced and uniform routing read every expert alike
RATES = (2.0, 1e12, 1e15)


def tiny(expert_parallel_four: list[float]) -> tuple[Profile, ModelSpec]:
    """A profile whose experts (64 x 32, top-2 of 8) were measured whole (1, 2 ms at 4, 8 tokens),
    split two ways (0.6, 1.1 ms), and whole over 2 GPUs (0.8, 1.0) and over 4 (as given)."""
    profile = load_profile("h200_sxm")
    split = pl.DataFrame({"dtype": "bfloat16", **SHAPE, "inter_size": [32, 32, 16, 16], "num_tokens": TOKENS * 2,
                          "latency": [1.0, 2.0, 0.6, 1.1]})
    spread = pl.DataFrame({"dtype": "bfloat16", **SHAPE, "inter_size": 32, "num_tokens": TOKENS * 2,
                           "expert_parallel": [2, 2, 4, 4], "latency": [0.8, 1.0, *expert_parallel_four]})
    model = replace(QWEN3_30B_A3B, hidden_size=64, moe_intermediate_size=32, num_experts_per_tok=2, num_experts=8)
    return replace(profile, tables={**profile.tables, "moe": split, "moe_quant": spread}), model


def split_table(profile: Profile) -> MoeTable:
    """The tiny profile's table of split experts, as `moe_curves` builds it."""
    return MoeTable(profile.tables["moe"], 2, RATES)


def test_a_four_way_split_is_the_four_gpu_spread_times_the_two_way_ratio() -> None:
    """Four ways, finer than the measured two: the four-GPU spread (0.5, 0.7 ms) times the two-way
    split over the two-GPU spread (0.6 / 0.8, 1.1 / 1.0): 0.375 and 0.77 ms."""
    profile, model = tiny([0.5, 0.7])
    notes: list[str] = []
    curve = finer_split_curve(profile, model, 4, replace(model, moe_intermediate_size=8), split_table(profile), notes)
    assert curve is not None
    assert curve.xs == (4.0, 8.0)
    assert curve.ys == pytest.approx((0.5 * 0.6 / 0.8, 0.7 * 1.1 / 1.0))
    assert "expert-parallel 4 kernel" in notes[0] and "at 2 ways" in notes[0]


def test_measured_splits_and_spreads_that_do_not_spread_are_left_alone() -> None:
    profile, model = tiny([0.5, 0.7])
    two_ways = replace(model, moe_intermediate_size=16)
    assert finer_split_curve(profile, model, 2, two_ways, split_table(profile), []) is None  # measured itself
    # Four GPUs that took as long as one (2 ms at 8 tokens, not nearer 0.5 than 2): no stand-in.
    profile, model = tiny([1.0, 2.0])
    four_ways = replace(model, moe_intermediate_size=8)
    assert finer_split_curve(profile, model, 4, four_ways, split_table(profile), []) is None


def whole_shapes(gpu: str, stack: str) -> list[tuple[str, int, int, int, int]]:
    """The expert shapes kernel-db spread whole over several GPUs (its `moe_tp_size` 1 rows; the
    profile's table also holds splits spread over GPUs, which it cannot tell from whole shapes)."""
    rows = pl.concat([pl.read_parquet(path) for path in (KERNEL_DB / gpu / "moe" / stack).glob("*/moe_perf.parquet")])
    rows = rows.filter((pl.col("moe_tp_size") == 1) & (pl.col("moe_ep_size") > 1)
                       & pl.col("moe_dtype").is_in(list(DTYPES)))
    return rows.select("moe_dtype", "hidden_size", "topk", "num_experts", "inter_size").unique().sort("*").rows()


def held_out_errors(gpu: str, stack: str) -> tuple[list[float], list[float]]:
    """Every measured N-way split (N = 4, 8) of a whole expert shape that kernel-db also measured
    spread over N GPUs, predicted from the profile's table without that split and anything finer
    in its family: by the stand-in, and by the roofline-scaled edge it replaces. |error| per
    token count."""
    profile = load_profile(f"{gpu}_{stack}")
    moe = profile.tables["moe"]
    stand_in, edge = [], []
    for dtype, hidden, top_k, experts, inter in whole_shapes(gpu, stack):
        rows = moe.filter((pl.col("dtype") == dtype) & (pl.col("hidden_size") == hidden) & (pl.col("topk") == top_k)
                          & (pl.col("num_experts") == experts))
        for ways in (4, 8):
            held = rows.filter(pl.col("inter_size") == inter // ways)
            if inter % ways or held.height == 0:
                continue
            kept = moe.filter(~((pl.col("dtype") == dtype) & (pl.col("hidden_size") == hidden)
                                & (pl.col("topk") == top_k) & (pl.col("num_experts") == experts)
                                & (pl.col("inter_size") <= inter // ways)))
            model = replace(QWEN3_30B_A3B, hidden_size=hidden, moe_intermediate_size=inter, num_experts_per_tok=top_k,
                            num_experts=experts, weight_dtype=None if dtype == "bfloat16" else dtype)
            rank = replace(model, moe_intermediate_size=inter // ways)
            table = MoeTable(kept.filter(pl.col("dtype") == dtype), 2, RATES)
            found = finer_split_curve(profile, model, ways, rank, table, [])
            if found is None:
                continue
            shape = (hidden, inter // ways, top_k, experts)
            tokens, truth = MoeTable(held, 2, RATES).series[shape]
            old = table.curve("edge", shape, [])
            for x, t in zip(tokens.tolist(), truth.tolist(), strict=True):
                stand_in.append(abs(found.at(x, lambda _: 0.0, Counter()) / t - 1))
                edge.append(abs(old.at(x, lambda _: 0.0, Counter()) / t - 1))
    return stand_in, edge


@needs_kernel_db
@pytest.mark.parametrize(("gpu", "stack"), [("h200_sxm", "trtllm"), ("h200_sxm", "sglang"), ("h100_sxm", "vllm")])
def test_held_out_splits_are_nearer_the_spread_than_the_scaled_edge(gpu: str, stack: str) -> None:
    stand_in, edge = held_out_errors(gpu, stack)
    assert len(stand_in) > 100
    assert float(np.median(stand_in)) < 0.15
    assert float(np.median(stand_in)) < 0.8 * float(np.median(edge))
