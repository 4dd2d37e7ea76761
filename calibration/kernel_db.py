"""One serving stack's measured kernels, from aiconfigurator's kernel database, as profile tables.

`../shared/reference/kernel-db/<gpu>/<family>/<stack>/<version>/` holds each stack's measured
kernels (vLLM 0.19.0, SGLang 0.5.14, TensorRT-LLM 1.3.0rc20 on H100 and H200 SXM; latencies in ms),
each folder with a `collection_meta.yaml` naming its framework and version. `stack_tables` reads
the tables a profile has (`calibration/README.md`) for one stack, each from the version nearest the
one asked for among the folders that hold that table, and says which it took.

What each stack runs on Hopper, and so which rows are kept where a table holds several kernels:
- attention: the stack's own (vLLM's flash-attn, SGLang's FA3 backend, its Hopper default;
  TensorRT-LLM's), full attention only (`window_size` 0), bf16 math over a bf16 or fp8 KV cache;
- GEMM: the stack's bf16, fp8 per-tensor and fp8 128x128-block GEMMs (one kernel each);
- MoE: vLLM's fused MoE, SGLang's Triton fused MoE (its default runner), TensorRT-LLM's CUTLASS
  MoE; balanced routing, no expert parallelism, `inter_size` one GPU's share of an expert;
- all-reduce: each stack's as its collector measured it, at every size: aiconfigurator's
  collector/network/collect_all_reduce.py times vLLM's and SGLang's `tensor_model_parallel_all_reduce`
  captured in a CUDA graph, which picks the stack's custom all-reduce, symmetric memory or NCCL by
  message size, as a server does; TensorRT-LLM's own all-reduce (it picks its strategy itself, NCCL
  included). And NCCL's at every size (`collectives_nccl`, from
  `../shared/reference/kernels/<gpu>/nccl_perf.parquet`; the H200's file measures no all-reduce,
  which is derived from the H100's, `nccl_all_reduce`): a server whose custom all-reduce is off
  (`--disable-custom-all-reduce`).
Rows measured twice with the same key are merged to their median.

The model-specific tables (MLA, quantized experts, all-to-all) are written into the same folders
afterwards by `calibration.kernel_db_models.write_profile_tables`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from simulator.deploy.physics import too_fast

MS = 1e-3
BF16 = 2
STACK_VERSIONS = {"vllm": "0.19.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
"""The version each stack's profile is built for (the kernel database's)."""


@dataclass(frozen=True)
class StackKernels:
    """Which measured kernels of a table a stack runs."""

    attention: str
    gemm: dict[str, str]
    """gemm_dtype -> kernel_source."""
    moe: str
    allreduce: tuple[str, str] | None
    """(column, value) of the rows captured in a CUDA graph; None: the whole table."""


KERNELS = {
    "vllm": StackKernels("vllm_flash_attn", dict.fromkeys(("bfloat16", "fp8", "fp8_block"), "vllm_default"),
                         "vllm_fused_moe", ("backend", "vllm_graph")),
    "sglang": StackKernels("fa3", {"bfloat16": "sglang_torch_linear", "fp8": "sglang_sgl_kernel_fp8_scaled_mm",
                                   "fp8_block": "sglang_deepgemm_gemm_nt_f8f8bf16"},
                           "sglang_fused_moe_triton", ("backend", "sglang_graph")),
    "trtllm": StackKernels("torch_flow", dict.fromkeys(("bfloat16", "fp8", "fp8_block"), "torch_flow"),
                           "moe_torch_flow_cutlass", None),
}


def version_key(version: str) -> tuple[int, int, int, int]:
    """`0.5.14` -> (0, 5, 14, inf-ish); `1.3.0rc20` -> (1, 3, 0, 20): a release sorts after its candidates."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:rc(\d+))?", version)
    if match is None:
        raise ValueError(f"unreadable version {version!r}")
    major, minor, patch, rc = match.groups()
    return int(major), int(minor), int(patch), int(rc) if rc is not None else 10**6


def nearest_version(available: Sequence[str], wanted: str) -> str:
    """The version of `available` nearest `wanted`: the same one, else the closest by (major, minor,
    patch, release candidate), a newer one winning a tie."""
    if not available:
        raise ValueError("no version to choose from")
    target = version_key(wanted)

    def distance(version: str) -> tuple[int, ...]:
        key = version_key(version)
        return (*(abs(a - b) for a, b in zip(key, target, strict=True)), 0 if key >= target else 1)

    return min(available, key=distance)


@dataclass(frozen=True)
class Source:
    """One kernel-database table as read: its file and the framework version its metadata gives."""

    path: Path
    version: str


def find_table(kernel_db: Path, gpu: str, family: str, stack: str, table: str, wanted: str) -> Source:
    """The `table` of `family` for `stack` on `gpu`, from the version nearest `wanted` that holds it."""
    root = kernel_db / gpu / family / stack
    holding = [d.name for d in sorted(root.iterdir()) if (d / f"{table}.parquet").is_file()] if root.is_dir() else []
    if not holding:
        raise FileNotFoundError(f"{root}: no version holds {table}.parquet")
    version = nearest_version(holding, wanted)
    meta = yaml.safe_load((root / version / "collection_meta.yaml").read_text())
    said = str(meta["runtime"]["version"])
    if said != version:
        raise ValueError(f"{root / version}: collection_meta.yaml says version {said}")
    return Source(root / version / f"{table}.parquet", version)


def _median_of_repeats(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return frame.group_by(keys, maintain_order=True).agg(pl.col("latency").median()).sort(keys)


def gemm_table(source: Source, dtype: str, kernel: str) -> pl.DataFrame:
    rows = pl.read_parquet(source.path).filter((pl.col("gemm_dtype") == dtype) & (pl.col("kernel_source") == kernel))
    return _median_of_repeats(rows.select("n", "k", "m", latency=pl.col("latency") * MS), ["n", "k", "m"]
                              ).select("m", "n", "k", "latency")


def _chosen(kernel: str, kv_dtype: str, windowed: bool) -> pl.Expr:
    window = pl.col("window_size") > 0 if windowed else pl.col("window_size") == 0
    return ((pl.col("kernel_source") == kernel) & window & (pl.col("beam_width") == 1)
            & (pl.col("attn_dtype") == "bfloat16") & (pl.col("kv_cache_dtype") == kv_dtype))


HEADS = ("num_heads", "num_kv_heads", "head_dim")


def prefill_table(context: Source, kernel: str, kv_dtype: str, windowed: bool = False) -> pl.DataFrame:
    """Prefill attention (no cached prefix: new tokens = isl), latency in seconds; `windowed`: the
    rows with a sliding window instead, its tokens in `window`."""
    window = ("window",) if windowed else ()
    rows = pl.read_parquet(context.path).filter(_chosen(kernel, kv_dtype, windowed)).select(
        "batch_size", "num_heads", num_kv_heads="num_key_value_heads", head_dim="head_dim", window="window_size",
        new_tokens="isl", context=pl.col("isl") + pl.col("step"), latency=pl.col("latency") * MS)
    return _median_of_repeats(rows, [*HEADS, *window, "batch_size", "new_tokens", "context"]).select(
        "batch_size", *HEADS, *window, "new_tokens", "context", "latency")


def decode_table(generation: Source, kernel: str, kv_dtype: str, windowed: bool = False) -> pl.DataFrame:
    """Decode attention (one token over isl + step), latency in seconds; `windowed` as `prefill_table`."""
    window = ("window",) if windowed else ()
    rows = pl.read_parquet(generation.path).filter(_chosen(kernel, kv_dtype, windowed)).select(
        "batch_size", "num_heads", num_kv_heads="num_key_value_heads", head_dim="head_dim", window="window_size",
        context=pl.col("isl") + pl.col("step"), latency=pl.col("latency") * MS)
    return _median_of_repeats(rows, [*HEADS, *window, "batch_size", "context"]).select(
        "batch_size", *HEADS, *window, "context", "latency")


WINDOW_APPLIED = 0.9
"""A table of sliding-window kernels is kept only if, at contexts of 16 windows and more, its rows
take under this share of the same shapes' full-attention time (median): such a kernel reads at most
1/16 of the keys. The kernel database's windowed rows take 0.21-0.50 of it, except vLLM's on the
H200, which take 1.00 (prefill and decode alike): the window was not applied there."""


def windowed_share(windowed: pl.DataFrame, full: pl.DataFrame) -> float:
    """The median of windowed / full-attention latency over the shapes both measured at contexts of
    16 windows and more (1.0 where none is)."""
    keys = [c for c in full.columns if c != "latency"]
    far = windowed.filter(pl.col("context") >= 16 * pl.col("window")).join(full, on=keys, suffix="_full")
    if far.height == 0:
        return 1.0
    return float((far["latency"] / far["latency_full"]).median())  # type: ignore[arg-type]


SAME_COMPUTE = {"h200_sxm": "h100_sxm", "h100_sxm": "h200_sxm"}
"""GPUs of the same compute: the H100 SXM and H200 SXM are one GH100 (132 SMs, the same clocks,
989 TFLOP/s bf16 dense on both datasheets) with different HBM. Prefill attention is compute-bound:
SGLang's and TensorRT-LLM's measured H200 / H100 ratio over every shared shape from 1,024 tokens
is 0.997 and 0.986 (median; 10th-90th percentile 0.92-1.13 and 0.93-1.02), so one GPU's measured
prefill kernel stands in for the other's (`checked_prefill`)."""


def over_peak(prefill: pl.DataFrame, peak_flops: float) -> int:
    """Prefill attention rows (latency in seconds) faster than `peak_flops` allows: physically
    impossible, a table measured wrong (`simulator.deploy.physics.too_fast`, at that rate)."""
    return too_fast("prefill_attention", prefill, peak_flops).height


def checked_prefill(context: Source, stand_in: Callable[[], Source | None], kernel: str, kv_dtype: str,
                    peak_flops: float) -> tuple[pl.DataFrame, Source, str | None]:
    """`prefill_table(context, ...)`, unless any of its rows is faster than `peak_flops` allows
    (`over_peak`): then the table of the source `stand_in()` gives (the same kernel on a GPU of the
    same compute), which must hold no such row. Returns the table, its source, and what was wrong
    with `context`'s own (None: nothing, its own table). Raises ValueError where nothing stands in."""
    table = prefill_table(context, kernel, kv_dtype)
    bad = over_peak(table, peak_flops)
    if not bad:
        return table, context, None
    wrong = (f"{bad} of {table.height} {kv_dtype} KV rows faster than the GPU's {peak_flops / 1e12:.0f} TFLOP/s "
             f"{kv_dtype} peak")
    other = stand_in()
    if other is None:
        raise ValueError(f"{context.path}: {wrong}, and no GPU of the same compute has the table")
    replacement = prefill_table(other, kernel, kv_dtype)
    if over_peak(replacement, peak_flops):
        raise ValueError(f"{context.path}: {wrong}, and so are rows of {other.path}")
    return replacement, other, wrong


def moe_table(source: Source, kernel: str) -> pl.DataFrame:
    rows = (pl.read_parquet(source.path)
            .filter((pl.col("kernel_source") == kernel) & (pl.col("distribution") == "balanced")
                    & (pl.col("moe_ep_size") == 1) & pl.col("moe_dtype").is_in(["bfloat16", "fp8", "fp8_block"]))
            .select(dtype="moe_dtype", num_tokens="num_tokens", hidden_size="hidden_size",
                    inter_size=pl.col("inter_size") // pl.col("moe_tp_size"), topk="topk",
                    num_experts="num_experts", latency=pl.col("latency") * MS))
    return _median_of_repeats(rows, ["dtype", "hidden_size", "inter_size", "topk", "num_experts", "num_tokens"])


def collectives_table(source: Source, chosen: tuple[str, str] | None) -> pl.DataFrame:
    """All-reduce as the stack runs it, at every size its collector measured; message_size counts
    16-bit elements."""
    columns = {"op": pl.lit("all_reduce"), "num_gpus": pl.col("num_gpus"),
               "message_bytes": pl.col("message_size") * BF16, "latency": pl.col("latency") * MS}
    rows = pl.read_parquet(source.path).filter(pl.col("allreduce_dtype") == "bfloat16")
    if chosen is not None:
        rows = rows.filter(pl.col(chosen[0]) == chosen[1])
    return _median_of_repeats(rows.select(**columns), ["op", "num_gpus", "message_bytes"])


SAME_FABRIC = {"h200_sxm": "h100_sxm"}
"""A GPU whose NCCL measurements hold no all-reduce -> one on the same NVLink 4 / NVSwitch board
whose do: the H200's reduce-scatter, all-gather and all-to-all latencies are within 0-3% of the
H100's (median per GPU count, messages from 512 KiB; tests/test_backends.py)."""


def _nccl_ops(nccl: Path) -> pl.DataFrame:
    """(op_name, num_gpus, message_size, latency ms) of a file's fp16 NCCL rows, repeats merged."""
    rows = pl.read_parquet(nccl).filter(pl.col("nccl_dtype") == "half").select(
        "op_name", "num_gpus", "message_size", "latency")
    return _median_of_repeats(rows, ["op_name", "num_gpus", "message_size"])


def nccl_all_reduce(nccl: Path) -> tuple[pl.DataFrame, Path | None]:
    """NCCL's fp16 all-reduce as (num_gpus, message_size, latency ms), and the file it was derived
    from if `nccl` measured none: then its same-fabric GPU's all-reduce (`SAME_FABRIC`) times, at
    each GPU count and size both files measured, the ratio of this GPU's reduce-scatter +
    all-gather to that GPU's, the two halves of a ring all-reduce. The ratio measures what differs
    between the two GPUs' collectives; the all-reduce's own algorithm (faster than the two halves
    on the H100, 0.75-0.96 of their sum) is taken as measured on the other."""
    ops = _nccl_ops(nccl)
    measured = ops.filter(pl.col("op_name") == "all_reduce").drop("op_name")
    twin = nccl.parent.parent / SAME_FABRIC.get(nccl.parent.name, "") / nccl.name
    if measured.height or nccl.parent.name not in SAME_FABRIC or not twin.is_file():
        return measured, None
    other = _nccl_ops(twin)

    def halves(frame: pl.DataFrame) -> pl.DataFrame:
        return (frame.filter(pl.col("op_name").is_in(["reduce_scatter", "all_gather"]))
                .group_by("num_gpus", "message_size").agg(pl.col("latency").sum(), pl.len().alias("parts"))
                .filter(pl.col("parts") == 2).drop("parts"))

    derived = (other.filter(pl.col("op_name") == "all_reduce").drop("op_name")
               .join(halves(ops), on=["num_gpus", "message_size"], suffix="_here")
               .join(halves(other), on=["num_gpus", "message_size"], suffix="_there")
               .select("num_gpus", "message_size",
                       latency=pl.col("latency") * pl.col("latency_here") / pl.col("latency_there")))
    return derived.sort("num_gpus", "message_size"), twin


def nccl_table(nccl: Path) -> pl.DataFrame:
    """NCCL's all-reduce (fp16) at every message size, as a server without its custom all-reduce
    runs every one (`nccl_all_reduce`: measured, or derived for a GPU whose file has none);
    message_size counts 16-bit elements."""
    rows, _ = nccl_all_reduce(nccl)
    return rows.select(op=pl.lit("all_reduce"), num_gpus=pl.col("num_gpus"),
                       message_bytes=pl.col("message_size") * BF16, latency=pl.col("latency") * MS)


def nccl_said(nccl: Path) -> str:
    """Where `nccl_table`'s rows come from, for profile.json's families."""
    _, twin = nccl_all_reduce(nccl)
    here = f"{nccl.parent.name}/{nccl.name}"
    if twin is None:
        return f"measured: {here}, NCCL all-reduce (half)"
    return (f"derived: {twin.parent.name}/{twin.name}'s NCCL all-reduce (half) x {here}'s reduce-scatter + "
            f"all-gather over {twin.parent.name}'s, per GPU count and size (calibration/kernel_db.py, "
            "nccl_all_reduce; the file measures no all-reduce)")


NCCL_FAMILY = ("{said} at every size (vLLM 0.14 data): a server whose custom all-reduce is off "
               "(--disable-custom-all-reduce)")


@dataclass(frozen=True)
class StackTables:
    tables: dict[str, pl.DataFrame]
    families: dict[str, str]
    """Family -> where its rows came from (profile.json's `families`)."""
    versions: dict[str, str]
    """Kernel-database table -> the version it was read from."""
    device: str


def stack_tables(kernel_db: Path, gpu: str, stack: str, nccl: Path, peak_flops: dict[str, float],
                 version: str | None = None) -> StackTables:
    """The profile tables of `stack` (at `version`, default its STACK_VERSIONS one) on `gpu`, whose
    datasheet dense rate per dtype is `peak_flops` ("bfloat16", "fp8"). A prefill attention table
    with any row faster than its KV dtype's rate allows (`over_peak`: over an fp8 cache a kernel may
    compute in fp8) is not used: the same stack's from the GPU of the same compute (`SAME_COMPUTE`)
    stands in, said so; with no such table to take, the build stops."""
    kernels, wanted = KERNELS[stack], version or STACK_VERSIONS[stack]
    found = {table: find_table(kernel_db, gpu, family, stack, table, wanted) for family, table in (
        ("gemm", "gemm_perf"), ("attention", "context_attention_perf"), ("attention", "generation_attention_perf"),
        ("moe", "moe_perf"), ("comm", "custom_allreduce_perf"))}

    def said(table: str) -> str:
        source = found[table]
        near = "" if source.version == wanted else f", nearest to {wanted}"
        return f"kernel-db/{gpu}/{source.path.parent.parent.parent.name}/{stack}/{source.version}/{table}" \
               f".parquet ({stack} {source.version}{near})"

    tables: dict[str, pl.DataFrame] = {}
    families: dict[str, str] = {}
    for suffix, dtype in (("", "bfloat16"), ("_fp8", "fp8"), ("_fp8_block", "fp8_block")):
        tables["gemm" + suffix] = table = gemm_table(found["gemm_perf"], dtype, kernels.gemm[dtype])
        families["gemm" + suffix] = (f"measured: {said('gemm_perf')}, {kernels.gemm[dtype]} {dtype} "
                                     f"({table.height} shapes)")
    twin = SAME_COMPUTE.get(gpu)

    def stand_in() -> Source | None:
        if twin is None:
            return None
        return find_table(kernel_db, twin, "attention", stack, "context_attention_perf", wanted)

    for suffix, kv in (("", "bfloat16"), ("_fp8", "fp8")):
        prefill, source, wrong = checked_prefill(found["context_attention_perf"], stand_in, kernels.attention, kv,
                                                 peak_flops[kv])
        said_prefill = f"measured: {said('context_attention_perf')}" if wrong is None else (
            f"measured on the {twin}: kernel-db/{twin}/attention/{stack}/{source.version}/"
            f"context_attention_perf.parquet, the same compute (calibration/kernel_db.py, SAME_COMPUTE); {gpu}'s own "
            f"table has {wrong}")
        decode = decode_table(found["generation_attention_perf"], kernels.attention, kv)
        tables["prefill_attention" + suffix], tables["decode_attention" + suffix] = prefill, decode
        families["prefill_attention" + suffix] = (f"{said_prefill}, {kernels.attention}, {kv} KV "
                                                  f"({prefill.height} shapes)")
        families["decode_attention" + suffix] = (f"measured: {said('generation_attention_perf')}, {kernels.attention}, "
                                                 f"{kv} KV ({decode.height} shapes)")
        for family, windowed, full, where in (
                ("prefill_attention", prefill_table(source, kernels.attention, kv, True), prefill, said_prefill),
                ("decode_attention", decode_table(found["generation_attention_perf"], kernels.attention, kv, True),
                 decode, f"measured: {said('generation_attention_perf')}")):
            share = windowed_share(windowed, full)
            what = f"sliding-window rows ({', '.join(map(str, sorted(set(windowed['window'].to_list()))))} tokens)"
            if windowed.height and share < WINDOW_APPLIED:
                tables[f"{family}_window{suffix}"] = windowed
                families[f"{family}_window{suffix}"] = (f"{where}, {kernels.attention}, {kv} KV, its {what}, "
                                                        f"{share:.2f} of full attention's time from 16 windows "
                                                        f"({windowed.height} shapes)")
            elif windowed.height:
                families[family + suffix] += (f"; its {what} are not used: they take {share:.2f} of full "
                                              "attention's time from 16 windows, the window not applied")
    tables["moe"] = moe = moe_table(found["moe_perf"], kernels.moe)
    families["moe"] = (f"measured: {said('moe_perf')}, {kernels.moe}, balanced routing, no expert parallelism "
                       f"({moe.height} rows)")
    tables["collectives"] = collectives_table(found["custom_allreduce_perf"], kernels.allreduce)
    families["collectives"] = (f"measured: {said('custom_allreduce_perf')}, " + (
        f"{kernels.allreduce[1]} at every size (the stack's tensor_model_parallel_all_reduce in a CUDA graph: its "
        "custom all-reduce, symmetric memory or NCCL by size)" if kernels.allreduce else "every size"))
    tables["collectives_nccl"] = nccl_table(nccl)
    families["collectives_nccl"] = NCCL_FAMILY.format(said=nccl_said(nccl))
    device = str(pl.read_parquet(found["gemm_perf"].path, n_rows=1)["device"][0])
    return StackTables(tables, families, {t: s.version for t, s in found.items()}, device)
