"""Build the shipped H100 SXM and H200 SXM profiles from the reference kernel measurements.

Reads aiconfigurator's measured vLLM 0.14 kernel tables (`../shared/reference/kernels/<gpu>/`,
latencies in ms) and writes `calibration/profiles/<gpu>/` in the format of `calibration/README.md`:
bf16 rows only, latencies in seconds, sizes in bytes, and in `profile.json` where every family came
from. Two families are not in the reference data and are derived, as `profile.json` says:
elementwise kernels (the GEMM floor latency plus bytes at the weight-streaming bandwidth, both
from `fit_roofline`) and the per-step overhead (0: the kernel tables hold no host time).

Each serving stack's profile (`<gpu>_vllm`, `<gpu>_sglang`, `<gpu>_trtllm`) is built the same way
from that stack's measured kernels in `../shared/reference/kernel-db/` (`calibration.kernel_db`:
vLLM 0.19.0, SGLang 0.5.14, TensorRT-LLM 1.3.0rc20, each table from the nearest version that has
it, as `profile.json` says); its elementwise table and roofline constants are its GPU's base ones.

Run: python -m calibration.build_reference [--reference ../shared/reference/kernels]
     [--kernel-db ../shared/reference/kernel-db] [--stacks vllm,sglang,trtllm]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from calibration.fit_roofline import GPUS, PROFILES_DIR, build_profile
from calibration.kernel_db import NCCL_FAMILY, STACK_VERSIONS, nccl_said, nccl_table, stack_tables
from calibration.kernel_db_models import write_profile_tables

FORMAT = 1
HOST_OVERHEAD_SOURCE = (
    "0, per step, per sequence and per token: the kernel tables hold no host time, and the one public "
    "figure here does not call for any at batch 1 (vLLM's fp8-KV blog: single-request ITL 6.44 ms + 4.37e-5 ms "
    "per context token, Llama-3.1-8B on an H100, against this profile's measured-kernel batch-1 step, see "
    "README); the sim-to-real issue fits these terms to batched end-to-end measurements")
COMMIT = "095f58a"
BF16 = 2
MS = 1e-3


# vLLM's custom all-reduce serves messages up to 8 MiB (its default max_size); NCCL the larger ones.
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20


def gemm_table(kernel_dir: Path, dtype: str = "bfloat16") -> pl.DataFrame:
    return (pl.read_parquet(kernel_dir / "gemm_perf.parquet").filter(pl.col("gemm_dtype") == dtype)
            .select("m", "n", "k", latency=pl.col("latency") * MS).sort("n", "k", "m"))


def moe_table(kernel_dir: Path) -> pl.DataFrame:
    """vLLM's fused-MoE kernels, tokens spread evenly over experts, tensor-parallel experts (no
    expert parallelism); `inter_size` becomes each GPU's share of an expert."""
    return (pl.read_parquet(kernel_dir / "moe_perf.parquet")
            .filter((pl.col("kernel_source") == "vllm_fused_moe") & (pl.col("distribution") == "balanced")
                    & (pl.col("moe_ep_size") == 1) & pl.col("moe_dtype").is_in(["bfloat16", "fp8", "fp8_block"]))
            .select(dtype="moe_dtype", num_tokens="num_tokens", hidden_size="hidden_size",
                    inter_size=pl.col("inter_size") // pl.col("moe_tp_size"), topk="topk", num_experts="num_experts",
                    latency=pl.col("latency") * MS)
            .sort("dtype", "hidden_size", "inter_size", "topk", "num_experts", "num_tokens"))


def attention_tables(kernel_dir: Path, kv_dtype: str = "bfloat16") -> tuple[pl.DataFrame, pl.DataFrame]:
    heads = (pl.col("num_heads"), pl.col("num_key_value_heads").alias("num_kv_heads"), pl.col("head_dim"))
    bf16 = (pl.col("attn_dtype") == "bfloat16") & (pl.col("kv_cache_dtype") == kv_dtype)
    # Prefill: `isl` prompt tokens with no cached prefix, so new tokens = context = isl.
    prefill = (pl.read_parquet(kernel_dir / "context_attention_perf.parquet").filter(bf16)
               .select("batch_size", *heads, new_tokens=pl.col("isl"), context=pl.col("isl") + pl.col("step"),
                       latency=pl.col("latency") * MS)
               .sort("num_heads", "num_kv_heads", "batch_size", "new_tokens"))
    # Decode: one new token attending to isl + step cached ones.
    decode = (pl.read_parquet(kernel_dir / "generation_attention_perf.parquet").filter(bf16)
              .select("batch_size", *heads, context=pl.col("isl") + pl.col("step"), latency=pl.col("latency") * MS)
              .sort("num_heads", "num_kv_heads", "batch_size", "context"))
    return prefill, decode


def collectives_table(kernel_dir: Path) -> pl.DataFrame:
    """All-reduce as vLLM runs it: its custom all-reduce (as captured in CUDA graphs) up to 8 MiB,
    NCCL's above. Both files' message_size counts 16-bit elements."""
    columns = {"op": pl.lit("all_reduce"), "num_gpus": pl.col("num_gpus"),
               "message_bytes": pl.col("message_size") * BF16, "latency": pl.col("latency") * MS}
    custom = (pl.read_parquet(kernel_dir / "custom_allreduce_perf.parquet")
              .filter((pl.col("backend") == "vllm_graph") & (pl.col("allreduce_dtype") == "bfloat16"))
              .select(**columns).filter(pl.col("message_bytes") <= CUSTOM_ALLREDUCE_MAX_BYTES))
    nccl = nccl_table(kernel_dir / "nccl_perf.parquet").filter(pl.col("message_bytes") > CUSTOM_ALLREDUCE_MAX_BYTES)
    return pl.concat([custom, nccl]).sort("num_gpus", "message_bytes")


def elementwise_table(kernel_latency: float, mem_bw: float) -> pl.DataFrame:
    """Derived, not measured: floor latency plus bytes over the achieved streaming bandwidth."""
    nbytes = np.geomspace(2**10, 2**34, 25).round()
    return pl.DataFrame({"op": "elementwise", "tokens": 0, "bytes": nbytes.astype(np.int64),
                         "latency": kernel_latency + nbytes / mem_bw})


def build(gpu: str, reference: Path, out: Path) -> None:
    kernel_dir = reference / gpu
    roofline = build_profile(gpu, reference)
    kernel_latency, mem_bw = float(roofline["kernel_latency"]), float(roofline["mem_bw"])  # type: ignore[arg-type]
    system = yaml.safe_load((kernel_dir / "system.yaml").read_text())["gpu"]
    gemm, fp8_gemm = gemm_table(kernel_dir), gemm_table(kernel_dir, "fp8")
    block_gemm = gemm_table(kernel_dir, "fp8_block")
    prefill, decode = attention_tables(kernel_dir)
    fp8_prefill, fp8_decode = attention_tables(kernel_dir, "fp8")
    moe = moe_table(kernel_dir)
    device = pl.read_parquet(kernel_dir / "gemm_perf.parquet")["device"][0]
    vllm = pl.read_parquet(kernel_dir / "gemm_perf.parquet")["version"][0]
    origin = (f"aiconfigurator (github.com/ai-dynamo/aiconfigurator, commit {COMMIT}, Apache-2.0), "
              f"systems/data/{gpu}")
    meta = {
        "format": FORMAT,
        "name": gpu,
        "device": device,
        "memory_bytes": int(system["mem_capacity"]),
        "datasheet_mem_bw": float(system["mem_bw"]),
        "datasheet_flops": float(system["bfloat16_tc_flops"]),
        "dtype": "bfloat16",
        "libraries": {"vllm": vllm},
        "date": "aiconfigurator data at commit " + COMMIT,
        "source": f"{GPUS[gpu]}: measured vLLM {vllm} kernels from {origin}; built by "
                  "calibration/build_reference.py",
        "step_overhead": 0.0,
        "model": None,
        "families": {
            "gemm": f"measured: gemm_perf.parquet, bf16 ({gemm.height} shapes)",
            "prefill_attention": f"measured: context_attention_perf.parquet, bf16 KV ({prefill.height} shapes)",
            "decode_attention": f"measured: generation_attention_perf.parquet, bf16 KV ({decode.height} shapes)",
            "elementwise": (f"derived: {kernel_latency * 1e6:.2f} us (median bf16 GEMM with m <= 16, "
                            f"n, k <= 128) + bytes / {mem_bw / 1e12:.2f} TB/s (weight-streaming GEMMs)"),
            "collectives": ("measured: custom_allreduce_perf.parquet (vllm_graph backend, bf16) up to 8 MiB, "
                            f"NCCL above ({nccl_said(kernel_dir / 'nccl_perf.parquet')})"),
            "collectives_nccl": NCCL_FAMILY.format(said=nccl_said(kernel_dir / "nccl_perf.parquet")),
            "gemm_fp8": f"measured: gemm_perf.parquet, fp8 ({fp8_gemm.height} shapes)",
            "gemm_fp8_block": f"measured: gemm_perf.parquet, fp8_block ({block_gemm.height} shapes)",
            "prefill_attention_fp8": f"measured: context_attention_perf.parquet, fp8 KV ({fp8_prefill.height} shapes)",
            "decode_attention_fp8": f"measured: generation_attention_perf.parquet, fp8 KV ({fp8_decode.height} shapes)",
            "moe": (f"measured: moe_perf.parquet, vllm_fused_moe, balanced routing, no expert parallelism, "
                    f"bf16/fp8/fp8_block ({moe.height} rows)"),
            "step_overhead": HOST_OVERHEAD_SOURCE,
            "per_sequence_overhead": HOST_OVERHEAD_SOURCE,
            "per_token_overhead": HOST_OVERHEAD_SOURCE,
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    gemm.write_parquet(out / "gemm.parquet")
    prefill.write_parquet(out / "prefill_attention.parquet")
    decode.write_parquet(out / "decode_attention.parquet")
    elementwise_table(kernel_latency, mem_bw).write_parquet(out / "elementwise.parquet")
    collectives_table(kernel_dir).write_parquet(out / "collectives.parquet")
    nccl_table(kernel_dir / "nccl_perf.parquet").write_parquet(out / "collectives_nccl.parquet")
    fp8_gemm.write_parquet(out / "gemm_fp8.parquet")
    block_gemm.write_parquet(out / "gemm_fp8_block.parquet")
    fp8_prefill.write_parquet(out / "prefill_attention_fp8.parquet")
    fp8_decode.write_parquet(out / "decode_attention_fp8.parquet")
    moe.write_parquet(out / "moe.parquet")
    (out / "profile.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / "roofline.json").write_text(json.dumps(roofline, indent=2) + "\n")


def build_stack(gpu: str, stack: str, kernel_db: Path, reference: Path, out: Path) -> None:
    """`stack`'s profile on `gpu`: its kernel-database tables, the base profile's elementwise table
    and roofline constants (`build`), no host time (`simulate fit` adds what survives held-out)."""
    system = yaml.safe_load((reference / gpu / "system.yaml").read_text())["gpu"]
    peaks = {"bfloat16": float(system["bfloat16_tc_flops"]), "fp8": float(system["fp8_tc_flops"])}
    found = stack_tables(kernel_db, gpu, stack, reference / gpu / "nccl_perf.parquet", peaks)
    roofline = build_profile(gpu, reference)
    kernel_latency, mem_bw = float(roofline["kernel_latency"]), float(roofline["mem_bw"])  # type: ignore[arg-type]
    version = STACK_VERSIONS[stack]
    meta = {
        "format": FORMAT, "name": gpu, "device": found.device, "memory_bytes": int(system["mem_capacity"]),
        "datasheet_mem_bw": float(system["mem_bw"]), "datasheet_flops": float(system["bfloat16_tc_flops"]),
        "dtype": "bfloat16", "libraries": {stack: version, "kernel_db_tables": found.versions},
        "date": "aiconfigurator kernel database (../shared/reference/kernel-db)",
        "source": (f"{GPUS[gpu]}: {stack} {version} kernels measured by aiconfigurator's collectors "
                   f"(../shared/reference/kernel-db, Apache-2.0), built by calibration/build_reference.py "
                   f"(calibration/kernel_db.py); elementwise and roofline constants from the {gpu} profile"),
        "step_overhead": 0.0, "model": None,
        "families": found.families | {
            "elementwise": (f"derived, as {gpu}'s: {kernel_latency * 1e6:.2f} us + bytes / "
                            f"{mem_bw / 1e12:.2f} TB/s (vLLM 0.14 weight-streaming GEMMs)"),
            "step_overhead": HOST_OVERHEAD_SOURCE, "per_sequence_overhead": HOST_OVERHEAD_SOURCE,
            "per_token_overhead": HOST_OVERHEAD_SOURCE},
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in found.tables.items():
        frame.write_parquet(out / f"{name}.parquet")
    elementwise_table(kernel_latency, mem_bw).write_parquet(out / "elementwise.parquet")
    (out / "profile.json").write_text(json.dumps(meta, indent=2) + "\n")
    (out / "roofline.json").write_text(json.dumps(roofline, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = Path(__file__).resolve().parent.parent.parent / "shared" / "reference"
    parser.add_argument("--reference", type=Path, default=shared / "kernels")
    parser.add_argument("--kernel-db", type=Path, default=shared / "kernel-db")
    parser.add_argument("--stacks", default=",".join(STACK_VERSIONS), help="stack profiles to build ('' for none)")
    parser.add_argument("--out", type=Path, default=PROFILES_DIR)
    args = parser.parse_args()
    for gpu in GPUS:
        build(gpu, args.reference, args.out / gpu)
        write_profile_tables(args.kernel_db, gpu, "vllm", args.out / gpu)
        print(f"wrote {args.out / gpu}")
        for stack in filter(None, args.stacks.split(",")):
            build_stack(gpu, stack, args.kernel_db, args.reference, args.out / f"{gpu}_{stack}")
            write_profile_tables(args.kernel_db, gpu, stack, args.out / f"{gpu}_{stack}")
            print(f"wrote {args.out / f'{gpu}_{stack}'}")


if __name__ == "__main__":
    main()
