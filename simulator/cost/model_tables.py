"""The measured tables of issue 25's models, made into interpolators when a profile has them
(`calibration/kernel_db_models.py` writes them): MLA attention kernels, fused MoE of 4-bit or
expert-parallel experts, and DeepEP's dispatch and combine. Each is optional: without it, or
without rows for the model's shape, the operator is priced by roofline and `notes` says so. Also
which fused-MoE curve a GPU's experts take (`moe_curves`), tensor-parallel splits finer than any
measured included (`finer_split_curve`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from simulator.cost.curves import BatchCurves, Curve
from simulator.cost.moe import MoeTable
from simulator.deploy.hardware import Profile
from simulator.deploy.spec import ModelSpec
from simulator.errors import InputError


@dataclass(frozen=True)
class MlaCurves:
    """MLA decode and prefill kernels for the model's heads per GPU (or the nearest measured head
    count, its times scaled linearly in heads), by the KV cache's dtype."""

    decode: BatchCurves
    prefill: BatchCurves


def _heads(frame: pl.DataFrame, heads: int, family: str, notes: list[str]) -> pl.DataFrame:
    measured = frame["num_heads"].unique().to_list()
    nearest = min(measured, key=lambda h: abs(math.log(h / heads)))
    if nearest != heads:
        notes.append(f"{family}: no measurements for {heads} heads per GPU; {nearest}-head ones scaled by "
                     f"{heads / nearest:g}")
    return frame.filter(pl.col("num_heads") == nearest).with_columns(pl.col("latency") * (heads / nearest))


def mla_curves(profile: Profile, rank: ModelSpec, notes: list[str]) -> MlaCurves | None:
    """The MLA tables for `rank` (one GPU's shard), or None (with a note) when the profile lacks them."""
    dtype = rank.kv_cache_dtype or rank.dtype
    frames = [profile.tables.get(name) for name in ("mla_decode_attention", "mla_prefill_attention")]
    frames = [None if f is None else f.filter(pl.col("dtype") == dtype) for f in frames]
    decode, prefill = frames
    if decode is None or prefill is None or decode.height == 0 or prefill.height == 0:
        notes.append(f"MLA attention ({dtype} KV): priced by roofline (the profile has no such MLA kernels)")
        return None
    decode_rows = _heads(decode, rank.num_heads, "MLA decode attention", notes)
    prefill_rows = _heads(prefill, rank.num_heads, "MLA prefill attention", notes)
    prefill_rows = prefill_rows.with_columns(
        pairs=pl.col("new_tokens") * (pl.col("context") - pl.col("new_tokens") + (pl.col("new_tokens") + 1) / 2))
    return MlaCurves(BatchCurves.from_frame("MLA decode attention", decode_rows, "context"),
                     BatchCurves.from_frame("MLA prefill attention", prefill_rows, "pairs"))


def experts_dtype(rank: ModelSpec) -> str:
    """The dtype a fused-MoE table is read in for `rank`'s routed experts: their own (4-bit
    checkpoints), else the linear layers' weights', else the activations'."""
    return rank.expert_dtype or rank.weight_dtype or rank.dtype


def moe_quant_table(profile: Profile, rank: ModelSpec, rates: tuple[float, float, float]) -> MoeTable | None:
    """The fused-MoE rows of 4-bit or expert-parallel experts of `rank`'s dtype and expert
    parallelism, or None when the profile has none. `rates`: (bytes per weight, bandwidth, FLOP/s) of
    one GPU's experts, which under expert parallelism over E GPUs does 1/E of the work (the table's
    roofline is scaled so)."""
    dtype = experts_dtype(rank)
    table = profile.tables.get("moe_quant")
    frame = None if table is None else table.filter((pl.col("dtype") == dtype)
                                                    & (pl.col("expert_parallel") == rank.expert_parallel))
    if frame is None or frame.height == 0:
        return None
    ep = rank.expert_parallel
    return MoeTable(frame, rank.dtype_bytes / ep, (rates[0] / ep, rates[1], rates[2] * ep))


def moe_curves(profile: Profile, model: ModelSpec, rank: ModelSpec, tensor_parallel_size: int,
               rates: tuple[float, float, float], notes: list[str]) -> tuple[Curve | None, MoeTable | None]:
    """The fused-MoE curve of one GPU's experts (`rank`, the shard of `model`) and the table whose
    roofline extrapolates it; (None, None) where only the roofline can price them (noted). `rates`:
    (bytes per weight, bandwidth, FLOP/s) of the linear layers' weights. 4-bit and expert-parallel
    experts take `moe_quant`'s rows, the others `moe`'s; a split finer than any measured,
    `finer_split_curve`."""
    if not rank.is_moe:
        return None, None
    dtype = experts_dtype(rank)
    if rank.expert_dtype is not None or rank.expert_parallel > 1:
        gpu = profile.gpu
        expert_rates = rates if rank.expert_dtype is None else (rank.expert_weight_bytes, gpu.mem_bw, gpu.gemm_flops)
        found = moe_quant_table(profile, rank, expert_rates)
        if found is None:
            notes.append(f"routed experts ({dtype}"
                         + (f", spread over {rank.expert_parallel} GPUs" if rank.expert_parallel > 1 else "")
                         + "): priced by roofline (no such fused-MoE rows in the profile)")
            return None, None
        table, name = found, f"moe experts ({dtype}, expert parallel {rank.expert_parallel})"
    else:
        if "moe" not in profile.tables:
            raise InputError(f"profile {profile.meta['name']!r} has no mixture-of-experts measurements "
                             "(moe.parquet): use --cost roofline")
        frame = profile.tables["moe"].filter(pl.col("dtype") == dtype)
        if frame.height == 0:
            raise InputError(f"profile {profile.meta['name']!r} has no {dtype} MoE measurements: use --cost roofline")
        table, name = MoeTable(frame, rank.dtype_bytes, rates), "moe experts"
    finer = finer_split_curve(profile, model, tensor_parallel_size, rank, table, notes)
    if finer is not None:
        return finer, table
    shape = (rank.hidden_size, rank.moe_intermediate_size, rank.num_experts_per_tok, rank.num_experts)
    return table.curve(name, shape, notes), table


def finer_split_curve(profile: Profile, model: ModelSpec, ways: int, rank: ModelSpec, split: MoeTable,
                      notes: list[str]) -> Curve | None:
    """Experts split `ways` (N) ways by tensor parallelism, finer than the profile measured any split
    of their family (hidden size, top-k, experts), priced as the measured kernel that does the same
    share of the experts' weights and FLOPs on each GPU: the whole experts spread over N GPUs (expert
    parallel N, its own rows in `moe_quant`), times the N-way split's time over the expert-parallel
    one at the finest split measured both ways (1 at one way: the whole experts on one GPU, the same
    kernel). Where the tables measure both, the split kernel's time follows the expert-parallel one:
    scaling the finest measured split down by its roofline, as an off-grid shape otherwise is, leaves
    out the kernel's fixed time and comes out short (docs/validation/stack-fidelity.md). `split`: the
    table of `rank`'s split experts (`moe_curves` builds it). None where the split is measured, lies
    within the measured ones, or the profile lacks those expert-parallel rows."""
    hidden, inter, top_k, experts = (model.hidden_size, model.moe_intermediate_size, model.num_experts_per_tok,
                                     model.num_experts)
    if ways < 2 or rank.expert_parallel > 1 or experts % ways or "moe_quant" not in profile.tables:
        return None
    measured = [s[1] for s in split.series if (s[0], s[2], s[3]) == (hidden, top_k, experts)]
    if not measured or inter // ways >= min(measured):
        return None
    dtype = experts_dtype(rank)
    whole = (hidden, inter, top_k, experts)
    one = split.series.get(whole)

    def spread(gpus: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The expert-parallel rows over `gpus`, if they spread the work: at the most tokens measured
        they take nearer 1/gpus of the whole experts' time on one GPU than all of it (rows that
        took as long did not spread the experts; kernel-db's vLLM mxfp4 ones, for one)."""
        frame = profile.tables["moe_quant"].filter((pl.col("dtype") == dtype) & (pl.col("expert_parallel") == gpus))
        rates = (split.weight_bytes, split.mem_bw, split.flops)
        found = MoeTable(frame, split.dtype_bytes, rates).series.get(whole) if frame.height else None
        if found is None or one is None:
            return found
        most = min(found[0][-1], one[0][-1])
        spreads = np.interp(most, *found) < np.interp(most, *one) * (1 + 1 / gpus) / 2
        return found if spreads else None

    target = spread(ways)
    if target is None:
        return None
    tokens, times = target
    ratio, at = np.ones_like(times), 1
    for finer in sorted((w for w in range(2, ways) if ways % w == 0 and inter % w == 0), reverse=True):
        measured_split, spread_finer = split.series.get((hidden, inter // finer, top_k, experts)), spread(finer)
        if measured_split is not None and spread_finer is not None:
            ratio = np.interp(tokens, *measured_split) / np.interp(tokens, *spread_finer)
            at = finer
            break
    name = f"moe experts ({dtype}, split {ways} ways)"
    notes.append(f"{name}: finer than the measured splits (intermediate {min(measured)} and up): the "
                 f"expert-parallel {ways} kernel of the whole experts, times the split / expert-parallel time at "
                 f"{at} way{'s' if at > 1 else ''}")
    return Curve(name, tuple(tokens.tolist()), tuple((times * ratio).tolist()))


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
