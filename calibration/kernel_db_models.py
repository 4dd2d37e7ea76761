"""Profile tables for issue 25's models from `../shared/reference/kernel-db/`: MLA attention kernels,
fused MoE by quantization (mxfp4, int4, fp8 blocks) and expert parallelism, and DeepEP's all-to-all.

`model_tables(kernel_db, gpu, stack)` returns {file name: table} for one GPU and serving stack
(`vllm`, `sglang`, `trtllm`), in the profile format of `calibration/README.md` (latencies in
seconds); a table the stack has no rows for is left out, and the cost model prices that operator by
roofline, saying so. Where the stack has no per-kernel measurements of its own the nearest stack's
stand in, as `SOURCES` says (vLLM's MLA rows are per module, GEMMs included; DeepEP is one library
measured once, under SGLang), and where its rows time another kernel than its server runs, the
rows of the kernel it does run (`INT4_STACK`). Latencies in the kernel-db are milliseconds
(DeepEP's microseconds).

Run: python -m calibration.kernel_db_models [--kernel-db ../shared/reference/kernel-db]
writes the tables into the shipped `h100_sxm` and `h200_sxm` profiles (vLLM's stack) and says in
their profile.json where each came from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl

MS, US = 1e-3, 1e-6
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
KERNEL_DB = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernel-db"
MLA_STACK = {"vllm": "sglang", "sglang": "sglang", "trtllm": "trtllm"}
"""Whose per-kernel MLA decode measurements each stack's profile takes (vLLM's are whole modules)."""
MLA_PREFILL_STACK = {"vllm": "trtllm", "sglang": "trtllm", "trtllm": "trtllm"}
"""Whose per-kernel MLA prefill measurements each stack's profile takes: TensorRT-LLM's. SGLang
0.5.14's context_mla rows, the only other per-kernel ones, take longer than the whole MLA module
(its attention and its projections) as three collectors measured it, vLLM 0.19's, TensorRT-LLM's
and SGLang 0.5.10's wide-EP one: up to 3x longer from 8,192-token prompts (128 heads, 16,384
tokens on the H200: 62.8 ms against modules of 20.6-26.3 ms). A part cannot take longer than the
whole, so those rows do not time the kernel a server runs; TensorRT-LLM's stay under every module
measurement (tests/test_new_models.py)."""
INT4_STACK = {"vllm": "sglang", "sglang": "sglang"}
"""Whose int4 fused-MoE rows each stack's profile takes: Marlin's (`sglang_marlin_moe`). vLLM
serves a compressed-tensors int4 checkpoint (Kimi-K2.5's) on Hopper with its Marlin MoE kernel
(`CompressedTensorsWNA16MarlinMoEMethod`), but its kernel-db rows (`vllm_marlin_int4_moe`) time
`fused_experts` with an int4 w4a16 config, the Triton kernel (aiconfigurator's
collector/vllm/collect_moe.py): 1.6-6.4x SGLang's Marlin rows of the same shapes, where vLLM's and
SGLang's bf16 and fp8-block rows agree within 0.8-1.4x (medians per token count). TensorRT-LLM's
table has no int4 experts."""
MOE_DTYPES = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "w4a16_mxfp4": "mxfp4",
              "int4_wo": "int4"}
"""kernel-db's moe_dtype -> servesim's weight or expert dtype."""
SOURCES = {
    "mla_decode_attention": "generation_mla_perf.parquet ({stack} {version}): MLA decode kernels over the latent "
                            "cache, by KV dtype, batch, context and heads per GPU",
    "mla_prefill_attention": "context_mla_perf.parquet ({stack} {version}): MLA prefill kernels, a prompt with no "
                             "cached prefix, by KV dtype, batch, prompt and heads per GPU",
    "moe_quant": "moe_perf.parquet ({stack} {version}): fused MoE of mxfp4 and int4 experts, and of every dtype "
                 "under expert parallelism, balanced routing; inter_size per GPU",
    "all_to_all": "wideep_deepep_ll_perf.parquet ({stack} {version}): DeepEP low-latency dispatch and combine on "
                  "one node, by tokens per GPU, hidden size, top-k and experts",
}


def _latest(folder: Path, name: str) -> tuple[Path, str] | None:
    """The newest version's `name` under `folder/<version>/` (versions compared as numbers)."""
    def key(path: Path) -> tuple[int, ...]:
        return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in path.parent.name.split("."))
    found = sorted(folder.glob(f"*/{name}"), key=key)
    return (found[-1], found[-1].parent.name) if found else None


def mla_tables(kernel_db: Path, gpu: str, stack: str) -> dict[str, tuple[pl.DataFrame, str]]:
    source = MLA_STACK[stack]
    tables = {}
    decode = _latest(kernel_db / gpu / "mla" / source, "generation_mla_perf.parquet")
    if decode is not None:
        rows = pl.read_parquet(decode[0]).filter(pl.col("mla_dtype") == "bfloat16")
        tables["mla_decode_attention"] = (rows.select(
            dtype="kv_cache_dtype", batch_size="batch_size",
            context=pl.col("isl") + pl.col("step"), num_heads="num_heads", latency=pl.col("latency") * MS)
            .sort("dtype", "num_heads", "batch_size", "context"), f"{source} {decode[1]}")
    prefill_source = MLA_PREFILL_STACK[stack]
    prefill = _latest(kernel_db / gpu / "mla" / prefill_source, "context_mla_perf.parquet")
    if prefill is not None:
        rows = pl.read_parquet(prefill[0]).filter((pl.col("mla_dtype") == "bfloat16") & (pl.col("step") == 0))
        tables["mla_prefill_attention"] = (rows.select(
            dtype="kv_cache_dtype", batch_size="batch_size", new_tokens="isl", context="isl", num_heads="num_heads",
            latency=pl.col("latency") * MS).sort("dtype", "num_heads", "batch_size", "new_tokens"),
            f"{prefill_source} {prefill[1]}")
    return tables


def moe_quant_table(kernel_db: Path, gpu: str, stack: str) -> tuple[pl.DataFrame, str] | None:
    found = _latest(kernel_db / gpu / "moe" / stack, "moe_perf.parquet")
    if found is None:
        return None
    # The 4-bit experts at any parallelism, and every dtype under expert parallelism: what the profile's
    # moe table (tensor-parallel bf16, fp8 and fp8-block experts) lacks; int4 from `INT4_STACK`'s Marlin rows.
    int4 = _latest(kernel_db / gpu / "moe" / INT4_STACK[stack], "moe_perf.parquet") if stack in INT4_STACK else None
    source = f"{stack} {found[1]}"
    rows = pl.read_parquet(found[0]).filter(pl.col("moe_dtype") != "int4_wo")
    if int4 is not None:
        marlin = pl.read_parquet(int4[0]).filter((pl.col("moe_dtype") == "int4_wo")
                                                 & (pl.col("kernel_source") == "sglang_marlin_moe"))
        rows = pl.concat([rows, marlin.select(rows.columns)])
        source += f"; int4 experts: {INT4_STACK[stack]} {int4[1]} Marlin"
    rows = rows.filter(
        (pl.col("distribution") == "balanced") & pl.col("moe_dtype").is_in(list(MOE_DTYPES))
        & (pl.col("moe_dtype").is_in(["w4a16_mxfp4", "int4_wo"]) | (pl.col("moe_ep_size") > 1)))
    table = (rows.select(dtype=pl.col("moe_dtype").replace(MOE_DTYPES), num_tokens="num_tokens",
                         hidden_size="hidden_size", inter_size=pl.col("inter_size") // pl.col("moe_tp_size"),
                         topk="topk", num_experts="num_experts", expert_parallel="moe_ep_size",
                         latency=pl.col("latency") * MS)
             .group_by("dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "expert_parallel")
             .agg(pl.col("latency").median())
             .sort("dtype", "expert_parallel", "hidden_size", "inter_size", "topk", "num_experts", "num_tokens"))
    return table, source


def all_to_all_table(kernel_db: Path, gpu: str) -> tuple[pl.DataFrame, str] | None:
    found = _latest(kernel_db / gpu / "comm" / "sglang", "wideep_deepep_ll_perf.parquet")
    if found is None:
        return None
    rows = pl.read_parquet(found[0]).filter(pl.col("node_num") == 1)
    parts = [rows.select(op=pl.lit(op), num_tokens="num_token", hidden_size="hidden_size", topk="num_topk",
                         num_experts="num_experts", latency=pl.col(f"{op}_avg_t_us") * US)
             for op in ("dispatch", "combine")]
    return pl.concat(parts).sort("op", "hidden_size", "topk", "num_experts", "num_tokens"), f"sglang {found[1]}"


def _with_sources(kernel_db: Path, gpu: str, stack: str) -> dict[str, tuple[pl.DataFrame, str]]:
    tables = mla_tables(kernel_db, gpu, stack)
    for name, found in (("moe_quant", moe_quant_table(kernel_db, gpu, stack)),
                        ("all_to_all", all_to_all_table(kernel_db, gpu))):
        if found is not None:
            tables[name] = found
    return {name: (table, source) for name, (table, source) in tables.items() if table.height}


def model_tables(kernel_db: Path, gpu: str, stack: str) -> dict[str, pl.DataFrame]:
    """{file name: table} of the new models' operators measured for `gpu` (`h100_sxm`, `h200_sxm`)
    under `stack` (`vllm`, `sglang`, `trtllm`)."""
    if stack not in MLA_STACK:
        raise ValueError(f"unknown stack {stack!r} (known: {', '.join(MLA_STACK)})")
    return {f"{name}.parquet": table for name, (table, _) in _with_sources(kernel_db, gpu, stack).items()}


def write_profile_tables(kernel_db: Path, gpu: str, stack: str, folder: Path) -> list[str]:
    """Write the tables into a profile folder and record their sources in its profile.json."""
    meta_path = folder / "profile.json"
    meta = json.loads(meta_path.read_text())
    written = []
    for name, (table, source) in _with_sources(kernel_db, gpu, stack).items():
        table.write_parquet(folder / f"{name}.parquet")
        version = source.split(" ", 1)[1]
        meta["families"][name] = "measured: " + SOURCES[name].format(stack=source.split(" ")[0], version=version)
        written.append(f"{name} ({table.height} rows, {source})")
    meta["model_tables_stack"] = f"{stack} (calibration/kernel_db_models.py)"
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel-db", type=Path, default=KERNEL_DB)
    args = parser.parse_args()
    for gpu in ("h100_sxm", "h200_sxm"):
        for line in write_profile_tables(args.kernel_db, gpu, "vllm", PROFILES_DIR / gpu):
            print(f"{gpu}: {line}")


if __name__ == "__main__":
    main()
