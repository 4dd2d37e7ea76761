"""Fit the roofline constants of a GPU profile from measured kernel latencies.

Reads aiconfigurator's measured vLLM kernel tables (`../shared/reference/kernels/<gpu>/`) and writes
`calibration/profiles/<gpu>/roofline.json`. Every constant is a median over a regime where the
kernel is plainly bound by one thing, so each is an achieved rate, not a datasheet peak:

- mem_bw: bf16 GEMMs with m <= 16 tokens and >= 32 Mi weight elements (weight streaming);
- gemm_flops: bf16 GEMMs with m >= 2048 and n, k >= 4096 (tensor cores saturated);
- fp8_gemm_flops, fp8_mem_bw: the same two regimes over the fp8 GEMMs (fp8 weights, bf16
  activations); on the H100 data both come out below bf16's;
- attn_bw: decode attention reading >= 256 MiB of bf16 KV cache;
- attn_flops: prefill attention doing >= 1e11 FLOPs (causal);
- kernel_latency: bf16 GEMMs with m <= 16 and n, k <= 128 (launch and setup only);
- attn_kernel_latency: decode attention reading <= 1 MiB of KV.
The kernel tables hold no host-side time, so the host overheads (per step, sequence, token) are 0
here; whole-pass calibration measures them. interconnect_bw and interconnect_latency (NVLink per GPU,
one direction, and a collective's fixed time) are system.yaml's intra_node_bw and p2p_latency: the
all-reduce roofline beyond the measured collectives; host_link_bw (PCIe, one direction: the KV host
tier's loads) is its pcie_bw.

`python -m calibration.build_reference` writes these constants into each shipped profile.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
GPUS = {"h100_sxm": "NVIDIA H100 SXM 80GB", "h200_sxm": "NVIDIA H200 SXM 141GB"}
BF16 = 2


def _median(frame: pl.DataFrame, numerator: pl.Expr, denominator: pl.Expr) -> float:
    value = frame.select((numerator / denominator).median()).item()
    if value is None:
        raise ValueError("no measured points in the fitting regime")
    return float(value)


def fit(kernel_dir: Path) -> dict[str, float]:
    seconds = pl.col("latency") * 1e-3
    gemm = pl.read_parquet(kernel_dir / "gemm_perf.parquet").filter(pl.col("gemm_dtype") == "bfloat16")
    m, n, k = pl.col("m"), pl.col("n"), pl.col("k")
    gemm_bytes = (n * k + m * k + m * n) * BF16
    weight_bound = gemm.filter((m <= 16) & (n * k >= 32 * 2**20))
    compute_bound = gemm.filter((m >= 2048) & (n >= 4096) & (k >= 4096))
    tiny = gemm.filter((m <= 16) & (n <= 128) & (k <= 128))
    fp8 = pl.read_parquet(kernel_dir / "gemm_perf.parquet").filter(pl.col("gemm_dtype") == "fp8")
    fp8_compute_bound = fp8.filter((m >= 2048) & (n >= 4096) & (k >= 4096))
    fp8_weight_bound = fp8.filter((m <= 16) & (n * k >= 32 * 2**20))
    fp8_bytes = n * k + (m * k + m * n) * BF16  # fp8 weights, bf16 activations

    decode = pl.read_parquet(kernel_dir / "generation_attention_perf.parquet").filter(
        pl.col("kv_cache_dtype") == "bfloat16")
    kv_bytes = (pl.col("batch_size") * (pl.col("isl") + pl.col("step"))
                * pl.col("num_key_value_heads") * pl.col("head_dim") * 2 * BF16)
    decode = decode.with_columns(kv_bytes=kv_bytes)

    prefill = pl.read_parquet(kernel_dir / "context_attention_perf.parquet").filter(
        pl.col("kv_cache_dtype") == "bfloat16")
    isl = pl.col("isl").cast(pl.Float64)
    causal_flops = 4 * pl.col("batch_size") * pl.col("num_heads") * pl.col("head_dim") * isl * (isl + 1) / 2
    prefill = prefill.with_columns(flops=causal_flops)

    return {
        "mem_bw": _median(weight_bound, gemm_bytes, seconds),
        "gemm_flops": _median(compute_bound, 2 * m * n * k, seconds),
        "attn_bw": _median(decode.filter(pl.col("kv_bytes") >= 256 * 2**20), pl.col("kv_bytes"), seconds),
        "attn_flops": _median(prefill.filter(pl.col("flops") >= 1e11), pl.col("flops"), seconds),
        "fp8_gemm_flops": _median(fp8_compute_bound, 2 * m * n * k, seconds),
        "fp8_mem_bw": _median(fp8_weight_bound, fp8_bytes, seconds),
        "kernel_latency": float(tiny.select(seconds.median()).item()),
        "attn_kernel_latency": float(decode.filter(pl.col("kv_bytes") <= 2**20).select(seconds.median()).item()),
    }


def build_profile(gpu: str, reference: Path) -> dict[str, object]:
    kernel_dir = reference / gpu
    system_file = yaml.safe_load((kernel_dir / "system.yaml").read_text())
    system, node = system_file["gpu"], system_file["node"]
    profile: dict[str, object] = {
        "name": gpu,
        "memory_bytes": int(system["mem_capacity"]),
        "datasheet_mem_bw": float(system["mem_bw"]),
        "datasheet_flops": float(system["bfloat16_tc_flops"]),
        **fit(kernel_dir),
        "step_overhead": 0.0,
        "per_sequence_overhead": 0.0,
        "per_token_overhead": 0.0,
        "interconnect_bw": float(node["intra_node_bw"]),
        "interconnect_latency": float(node["p2p_latency"]),
        "host_link_bw": float(node["pcie_bw"]),
        "source": (f"{GPUS[gpu]}: achieved rates fitted by calibration/fit_roofline.py from aiconfigurator "
                   f"(ai-dynamo/aiconfigurator, commit 095f58a, Apache-2.0) measured vLLM 0.14.0 kernels, "
                   f"systems/data/{gpu}; memory and datasheet rates from its system.yaml"),
    }
    return profile
