"""The measured tables of issue 25's models, made into interpolators when a profile has them
(`calibration/kernel_db_models.py` writes them): MLA attention kernels, fused MoE of 4-bit or
expert-parallel experts, and DeepEP's dispatch and combine. Each is optional: without it, or
without rows for the model's shape, the operator is priced by roofline and `notes` says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from simulator.cost.curves import BatchCurves, Curve
from simulator.cost.moe import MoeTable
from simulator.deploy.hardware import Profile
from simulator.deploy.spec import ModelSpec


@dataclass(frozen=True)
class MlaCurves:
    """MLA decode and prefill kernels for the model's heads per GPU (or the nearest measured head
    count, scaled linearly in heads), by the KV cache's dtype."""

    decode: BatchCurves
    decode_scale: float
    prefill: BatchCurves
    prefill_scale: float


def _heads(frame: pl.DataFrame, heads: int, family: str, notes: list[str]) -> tuple[pl.DataFrame, float]:
    measured = frame["num_heads"].unique().to_list()
    nearest = min(measured, key=lambda h: abs(math.log(h / heads)))
    if nearest != heads:
        notes.append(f"{family}: no measurements for {heads} heads per GPU; {nearest}-head ones scaled by "
                     f"{heads / nearest:g}")
    return frame.filter(pl.col("num_heads") == nearest), heads / nearest


def mla_curves(profile: Profile, rank: ModelSpec, notes: list[str]) -> MlaCurves | None:
    """The MLA tables for `rank` (one GPU's shard), or None (with a note) when the profile lacks them."""
    dtype = rank.kv_cache_dtype or rank.dtype
    frames = [profile.tables.get(name) for name in ("mla_decode_attention", "mla_prefill_attention")]
    frames = [None if f is None else f.filter(pl.col("dtype") == dtype) for f in frames]
    decode, prefill = frames
    if decode is None or prefill is None or decode.height == 0 or prefill.height == 0:
        notes.append(f"MLA attention ({dtype} KV): priced by roofline (the profile has no such MLA kernels)")
        return None
    decode_rows, decode_scale = _heads(decode, rank.num_heads, "MLA decode attention", notes)
    prefill_rows, prefill_scale = _heads(prefill, rank.num_heads, "MLA prefill attention", notes)
    prefill_rows = prefill_rows.with_columns(
        pairs=pl.col("new_tokens") * (pl.col("context") - pl.col("new_tokens") + (pl.col("new_tokens") + 1) / 2))
    return MlaCurves(BatchCurves.from_frame("MLA decode attention", decode_rows, "context"), decode_scale,
                     BatchCurves.from_frame("MLA prefill attention", prefill_rows, "pairs"), prefill_scale)


def moe_quant_curve(profile: Profile, rank: ModelSpec, rates: tuple[float, float, float],
                    notes: list[str]) -> tuple[Curve, MoeTable] | None:
    """Fused-MoE times over the tokens entering the layer for 4-bit or expert-parallel experts, or
    None when the profile has no rows of that dtype and expert parallelism. `rates`: (bytes per
    weight, bandwidth, FLOP/s) of one GPU's experts, which under expert parallelism over E GPUs does
    1/E of the work (the table's roofline is scaled so)."""
    dtype = rank.expert_dtype or rank.weight_dtype or rank.dtype
    table = profile.tables.get("moe_quant")
    frame = None if table is None else table.filter((pl.col("dtype") == dtype)
                                                    & (pl.col("expert_parallel") == rank.expert_parallel))
    if frame is None or frame.height == 0:
        return None
    ep = rank.expert_parallel
    moe = MoeTable(frame, rank.dtype_bytes / ep, (rates[0] / ep, rates[1], rates[2] * ep))
    shape = (rank.hidden_size, rank.moe_intermediate_size, rank.num_experts_per_tok, rank.num_experts)
    return moe.curve(f"moe experts ({dtype}, expert parallel {ep})", shape, notes), moe


DEEPEP_GPUS = 8
"""The kernel-db's DeepEP rows ran on one node (node_num 1) of 8 GPUs."""


class AllToAll:
    """DeepEP's low-latency dispatch plus combine of one MoE layer, by tokens per GPU, from the
    measured shape nearest the model's (hidden size, top-k, experts); beyond the measured tokens,
    `roofline` (seconds of both, by tokens) extrapolates."""

    def __init__(self, table: pl.DataFrame, rank: ModelSpec, notes: list[str]) -> None:
        shapes = table.select("hidden_size", "topk", "num_experts").unique().rows()
        want = (rank.hidden_size, rank.num_experts_per_tok, rank.num_experts)
        nearest = min(shapes, key=lambda s: sum(abs(math.log(a / b)) for a, b in zip(s, want, strict=True)))
        if rank.expert_parallel != DEEPEP_GPUS:
            notes.append(f"all-to-all: DeepEP measured on one node of {DEEPEP_GPUS} GPUs stands in for "
                         f"{rank.expert_parallel}")
        if tuple(nearest) != want:
            notes.append(f"all-to-all: no DeepEP measurements for hidden {want[0]}, top-{want[1]} of {want[2]} "
                         f"experts; those of {tuple(nearest)} stand in")
        rows = table.filter((pl.col("hidden_size") == nearest[0]) & (pl.col("topk") == nearest[1])
                            & (pl.col("num_experts") == nearest[2]))
        both = rows.group_by("num_tokens").agg(pl.col("latency").sum()).sort("num_tokens")
        self.curve = Curve.from_points("all-to-all", both["num_tokens"].to_list(), both["latency"].to_list())

    def time(self, tokens: int, roofline: Callable[[float], float], record: Counter[str]) -> float:
        return self.curve.at(tokens, roofline, record)
