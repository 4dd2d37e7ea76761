"""aiconfigurator's silicon table in its upstream format read as points for `simulate fit` and the
fidelity table: the aggregated rows of the models servesim has built in, of every stack.

A stopgap for what `simulator.sim2real.measured` reads in full (every mode, model and skip reason):
here only the columns a rerun of an aggregated row needs (`batch_size` is the client concurrency,
`gemm_quant_mode` fp8 or empty the weights), the rest skipped; rows of pipeline or attention-data
parallelism, or of a model without a built-in shape, are left out.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from simulator.sim2real.measured import MeasuredPoint

MODELS = {"Qwen/Qwen3-32B": "qwen3-32b", "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
          "meta-llama/Llama-3.1-8B": "llama-3.1-8b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b"}
"""Hub ids of the upstream rows to their built-in model (the FP8 checkpoint's weights are fp8)."""


def is_upstream(path: Path) -> bool:
    """Whether `path` is a CSV of aiconfigurator's upstream columns (`batch_size`, `mode`)."""
    if path.suffix.lower() != ".csv" or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as file:
        header = file.readline().strip().split(",")
    return {"batch_size", "mode", "silicon_ttft_ms"} <= set(header)


def read_upstream(path: Path, warmup_factor: int = 1, measured_factor: int = 10) -> list[MeasuredPoint]:
    """The aggregated rows of `path` whose model is built in: closed loops of `batch_size` clients,
    `warmup_factor` x and `measured_factor` x that many warm-up and measured requests."""
    rows = pl.read_csv(path, infer_schema_length=0).filter(
        (pl.col("mode") == "agg") & pl.col("model_path").is_in(list(MODELS))
        & (pl.col("pp_size").fill_null("1") == "1") & (pl.col("attention_dp_size").fill_null("1") == "1"))
    points = []
    for row in rows.iter_rows(named=True):
        concurrency, model = int(row["batch_size"]), MODELS[row["model_path"]]
        quant = "fp8" if (row["gemm_quant_mode"] or "") == "fp8" or "FP8" in row["model_path"] else None
        points.append(MeasuredPoint(
            name=row["id"], group=f"{row['backend']} {model} {row['system']}", model=model, gpu=row["system"],
            tensor_parallel_size=int(row["tp_size"]), quantization=quant, num_requests=measured_factor * concurrency,
            warmup=warmup_factor * concurrency, concurrency=concurrency, rate=None, burstiness=1.0,
            input_lens=(int(row["isl"]),), output_lens=(int(row["osl"]),),
            measured={"ttft_mean": float(row["silicon_ttft_ms"]) / 1e3,
                      "tpot_mean": float(row["silicon_tpot_ms"]) / 1e3},
            backend=row["backend"], backend_version=row["backend_version"]))
    return points
