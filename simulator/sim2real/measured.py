"""Measured serving results read as points to rerun: aiconfigurator's silicon CSV and `vllm bench
serve --save-result` JSON. Everything read is untrusted: every field is checked for type and range,
and what cannot be mapped onto servesim's options is refused with one line naming it.

A point holds the deployment (model, GPU, tensor parallelism, weight dtype), the workload as the
client sent it (lengths, closed loop or arrival rate, warm-up, request count) and the measured
statistics in seconds (`ttft_mean`, `tpot_median`, ..., throughputs in requests or tokens per s).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.deploy.hardware import available_gpus
from simulator.errors import InputError

HF_MODELS: dict[str, tuple[str, str | None]] = {
    "qwen/qwen3-32b": ("qwen3-32b", None),
    "qwen/qwen3-32b-fp8": ("qwen3-32b", "fp8"),
    "meta-llama/llama-3.1-8b": ("llama-3.1-8b", None),
    "meta-llama/llama-3.1-8b-instruct": ("llama-3.1-8b", None),
    "meta-llama/meta-llama-3.1-8b-instruct": ("llama-3.1-8b", None),
    "nvidia/llama-3.1-8b-instruct-fp8": ("llama-3.1-8b", "fp8"),
    "meta-llama/llama-3.1-70b-instruct": ("llama-3.1-70b", None),
    "nvidia/llama-3.1-70b-instruct-fp8": ("llama-3.1-70b", "fp8"),
}
"""Hugging Face ids of the measured models: the built-in model and the weights' quantization."""
CSV_COLUMNS = ("id", "backend", "backend_version", "model_path", "system", "precision", "gemm_quant_mode", "isl",
               "osl", "concurrency", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms")
STATS = ("mean", "median", "p99")
METRICS = ("ttft", "tpot", "itl", "e2el")
VLLM_REQUIRED = ("model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency", "completed",
                 "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput")
"""What every `vllm bench serve --save-result` file holds; of the latency statistics it holds those of
`--percentile-metrics` (ttft, tpot, itl by default), and at least the TTFT's."""
DETAIL = ("input_lens", "output_lens", "ttfts", "itls")


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured benchmark to rerun. Times in seconds, lengths in tokens."""

    name: str
    group: str
    """Rows compared together in the summary (model on GPU)."""
    model: str
    gpu: str
    tensor_parallel_size: int
    quantization: str | None
    num_requests: int
    """Measured requests (warm-up not counted)."""
    warmup: int
    concurrency: int | None
    """Closed loop of this many clients; None: open loop at `rate`."""
    rate: float | None
    burstiness: float
    input_lens: tuple[int, ...]
    """One length for every request (fixed lengths), or each measured request's own."""
    output_lens: tuple[int, ...]
    measured: dict[str, float] = field(default_factory=dict)
    """Statistic name (`ttft_mean`, `request_throughput`, ...) to its measured value."""


def map_model(model_path: str, where: str) -> tuple[str, str | None]:
    try:
        return HF_MODELS[model_path.lower()]
    except KeyError:
        raise InputError(f"{where}: model {model_path!r} cannot be mapped to a servesim model "
                         f"(known: {', '.join(sorted(HF_MODELS))})") from None


def map_gpu(system: str, where: str) -> str:
    if system not in available_gpus():
        raise InputError(f"{where}: system {system!r} has no shipped GPU profile ({', '.join(available_gpus())})")
    return system


def positive_int(value: Any, name: str, where: str) -> int:
    number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise InputError(f"{where}: {name} must be a positive integer, got {value!r}")
    return number


def positive_float(value: Any, name: str, where: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InputError(f"{where}: {name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise InputError(f"{where}: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def read_points(path: Path, model: str | None = None) -> list[MeasuredPoint]:
    """The points of one measured-results file: a silicon CSV or a vLLM result JSON (whose model is
    `model` if given, else its model_id's)."""
    if not path.is_file():
        raise InputError(f"no such result file {str(path)!r}")
    if path.suffix.lower() == ".csv":
        return read_silicon_csv(path)
    if path.suffix.lower() == ".json":
        return [read_vllm_result(path, model)]
    raise InputError(f"{str(path)!r} is neither a measured-points CSV nor a vllm bench serve result JSON")


def read_silicon_csv(path: Path) -> list[MeasuredPoint]:
    """aiconfigurator's silicon table (`../shared/reference/serving/README.md`): closed loops of
    `concurrency` clients, `concurrency` warm-up requests, 10 x `concurrency` measured."""
    try:
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(f"{str(path)!r} lacks the column(s) {', '.join(missing)} of a silicon CSV")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc}") from None
    if not rows:
        raise InputError(f"{str(path)!r} has no rows")
    return [_silicon_point(row, f"{path.name} row {i}") for i, row in enumerate(rows, start=2)]


def _silicon_point(row: dict[str, str], where: str) -> MeasuredPoint:
    if row["backend"] != "vllm":
        raise InputError(f"{where}: backend {row['backend']!r} cannot be mapped (servesim models vllm)")
    model, quantization = map_model(row["model_path"], where)
    precision, gemm = row["precision"].strip(), row["gemm_quant_mode"].strip()
    if precision not in ("", "bfloat16", "fp8") or gemm not in ("", "fp8"):
        raise InputError(f"{where}: precision {precision!r} / gemm_quant_mode {gemm!r} cannot be mapped "
                         "(servesim has bf16 and per-tensor fp8 weights)")
    if precision == "fp8" or gemm == "fp8":
        quantization = "fp8"
    concurrency = positive_int(row["concurrency"], "concurrency", where)
    return MeasuredPoint(
        name=row["id"] or where, group=f"{model} {row['system']}", model=model, gpu=map_gpu(row["system"], where),
        tensor_parallel_size=positive_int(row["tp_size"], "tp_size", where), quantization=quantization,
        num_requests=10 * concurrency, warmup=concurrency, concurrency=concurrency, rate=None, burstiness=1.0,
        input_lens=(positive_int(row["isl"], "isl", where),), output_lens=(positive_int(row["osl"], "osl", where),),
        measured={"ttft_mean": positive_float(row["silicon_ttft_ms"], "silicon_ttft_ms", where) / 1e3,
                  "tpot_mean": positive_float(row["silicon_tpot_ms"], "silicon_tpot_ms", where) / 1e3})


def read_vllm_result(path: Path, model: str | None = None) -> MeasuredPoint:
    """A `vllm bench serve --save-result` file; with `--save-detailed`, each request's lengths. Its
    model is `model` (a servesim model) if given, else its model_id's."""
    where = path.name
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{where} is not a vllm bench serve result (not a JSON object)")
    missing = [key for key in VLLM_REQUIRED if key not in data]
    if missing:
        raise InputError(f"{where} is not a whole vllm bench serve result: it lacks {', '.join(missing)}")
    model_id = data["model_id"]
    if not isinstance(model_id, str):
        raise InputError(f"{where}: model_id must be a string, got {model_id!r}")
    model_name, quantization = (model, None) if model is not None else map_model(model_id, where)
    rate_text = data["request_rate"]
    rate = math.inf if rate_text in ("inf", math.inf) else positive_float(rate_text, "request_rate", where)
    concurrency = data["max_concurrency"]
    if concurrency is not None:
        concurrency = positive_int(concurrency, "max_concurrency", where)
        if rate != math.inf:
            raise InputError(f"{where}: request_rate {rate:g} with max_concurrency {concurrency} (an open loop "
                             "held to a concurrency) cannot be mapped: servesim runs one or the other")
    completed = positive_int(data["completed"], "completed", where)
    num_prompts = positive_int(data["num_prompts"], "num_prompts", where)
    input_lens, output_lens = _lengths(data, where, completed)
    if "mean_ttft_ms" not in data:
        raise InputError(f"{where} is not a whole vllm bench serve result: it lacks mean_ttft_ms")
    measured = {f"{metric}_{stat}": _ms(data, f"{stat}_{metric}_ms", where)
                for metric in METRICS for stat in STATS if f"{stat}_{metric}_ms" in data}
    measured |= {key: positive_float(data[key], key, where) for key in ("request_throughput", "output_throughput")}
    return MeasuredPoint(
        name=where, group=model_name, model=model_name, gpu="", tensor_parallel_size=1, quantization=quantization,
        num_requests=num_prompts, warmup=0, concurrency=concurrency, rate=None if concurrency else rate,
        burstiness=positive_float(data["burstiness"], "burstiness", where), input_lens=input_lens,
        output_lens=output_lens, measured=measured)


def _ms(data: dict[str, Any], key: str, where: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
        raise InputError(f"{where}: {key} must be a number of ms >= 0, got {value!r}")
    return float(value) / 1e3


def _lengths(data: dict[str, Any], where: str, completed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each request's lengths from the detail lists, else the means from the totals (fixed)."""
    present = [key for key in DETAIL if key in data]
    if present and len(present) < len(DETAIL):
        raise InputError(f"{where} has per-request detail but lacks {', '.join(k for k in DETAIL if k not in data)}")
    if present:
        inputs, outputs = data["input_lens"], data["output_lens"]
        if not (isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs) > 0):
            raise InputError(f"{where}: input_lens and output_lens must be lists of one length per request")
        done = [(i, o) for i, o in zip(inputs, outputs, strict=True) if o != 0]  # 0: a failed request
        return (tuple(positive_int(i, "input_lens", where) for i, _ in done),
                tuple(positive_int(o, "output_lens", where) for _, o in done))
    mean_in = positive_int(data["total_input_tokens"], "total_input_tokens", where) / completed
    mean_out = positive_int(data["total_output_tokens"], "total_output_tokens", where) / completed
    return (max(1, round(mean_in)),), (max(1, round(mean_out)),)
