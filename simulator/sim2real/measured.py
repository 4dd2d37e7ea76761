"""Measured serving results read as points to rerun: aiconfigurator's silicon CSV and `vllm bench
serve --save-result` JSON. Everything read is untrusted: every field is checked for type and range,
and what cannot be mapped onto servesim's options is refused with one line naming it.

A point holds the deployment (model, GPU, tensor parallelism, weight dtype), the workload as the
client sent it (lengths, closed loop or arrival rate, warm-up, request count) and the measured
statistics in seconds (`ttft_mean`, `tpot_median`, ..., throughputs in requests or tokens per s).
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.deploy.hardware import available_gpus
from simulator.errors import InputError, clip

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
    backend: str = "vllm"
    """The serving stack that was measured (`simulator.deploy.backends`)."""
    backend_version: str | None = None


MAX_TOKENS = 1 << 31
"""The longest prompt or output a measured request may have: past every model's context."""
MAX_REQUESTS = 1_000_000
"""The most requests a measured point may hold (each is rerun): more than one benchmark sends."""
MAX_CONCURRENCY = 100_000
MAX_TENSOR_PARALLEL = 1024
MAX_MS = 86_400_000.0
"""The longest measured latency taken as a measurement (a day), in ms."""
MIN_MS = 1e-3
"""The shortest non-zero latency taken as measured (a microsecond), in ms: an error relative to less
is a number of hundreds of digits."""
MAX_RATE = 1e6
"""The highest request rate taken as measured, per second."""
MIN_RATE = 1e-6
"""The lowest throughput taken as measured, per second."""
BURSTINESS = (1e-3, 1e3)


def map_model(model_path: str, where: str) -> tuple[str, str | None]:
    try:
        return HF_MODELS[model_path.lower()]
    except KeyError:
        close = difflib.get_close_matches(model_path.lower(), HF_MODELS, n=1)
        known = f"did you mean {close[0]!r}?" if close else f"known: {clip(', '.join(sorted(HF_MODELS)))}"
        raise InputError(f"{where}: model {clip(repr(model_path))} cannot be mapped to a servesim model "
                         f"({known})") from None


def map_gpu(system: str, where: str) -> str:
    if system not in available_gpus():
        raise InputError(f"{where}: system {clip(repr(system))} has no shipped GPU profile "
                         f"({', '.join(available_gpus())})")
    return system


def positive_int(value: Any, name: str, where: str, most: int) -> int:
    """An integer in [1, most]: a JSON integer, or a CSV cell of ASCII digits."""
    number = int(value) if isinstance(value, str) and re.fullmatch(r"[0-9]{1,30}", value.strip()) else value
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= most:
        raise InputError(f"{where}: {name} must be an integer in [1, {most}], got {clip(repr(value))}")
    return number


def positive_float(value: Any, name: str, where: str, most: float, least: float = 0.0) -> float:
    """A number in [least, most] ((0, most] where `least` is 0): a JSON number, or a CSV cell that reads as one."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"{where}: {name} must be a number, got {clip(repr(value))}") from None
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number <= most or number < least:
        bounds = f"[{least:g}, {most:g}]" if least else f"(0, {most:g}]"
        raise InputError(f"{where}: {name} must be a number in {bounds}, got {clip(repr(value))}")
    return float(number)


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


def read_text(path: Path) -> str:
    """The file as text; a byte that is not UTF-8 is refused naming its line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path.name} line {line}: not UTF-8 text ({clip(repr(data[exc.start:exc.end + 8]))})"
                         ) from None


def csv_rows(path: Path) -> list[tuple[str, dict[str, str]]]:
    """A CSV's rows, each with where it is ("points.csv line 7": the header is line 1, and a quoted
    cell may hold line breaks, as in an editor); blank lines skipped."""
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    rows = []
    begun = 1
    try:
        header = next(reader, [])
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise InputError(f"{path.name} line 1: column(s) {clip(', '.join(repeated))} given twice")
        missing = [c for c in CSV_COLUMNS if c not in header]
        if missing:
            raise InputError(f"{str(path)!r} lacks the column(s) {', '.join(missing)} of a silicon CSV")
        begun = reader.line_num + 1
        for cells in reader:
            if cells and len(cells) != len(header):
                raise InputError(f"{path.name} line {begun}: {len(cells)} fields where the header has {len(header)}")
            if cells:
                rows.append((f"{path.name} line {begun}", dict(zip(header, cells, strict=True))))
            begun = reader.line_num + 1
    except csv.Error as exc:
        raise InputError(f"{path.name} line {begun}: {clip(str(exc))}") from None
    return rows


def read_silicon_csv(path: Path) -> list[MeasuredPoint]:
    """aiconfigurator's silicon table (`../shared/reference/serving/README.md`): closed loops of
    `concurrency` clients, `concurrency` warm-up requests, 10 x `concurrency` measured."""
    rows = csv_rows(path)
    if not rows:
        raise InputError(f"{str(path)!r} has no rows")
    return [_silicon_point(row, where) for where, row in rows]


def _silicon_point(row: dict[str, str], where: str) -> MeasuredPoint:
    if row["backend"] != "vllm":
        raise InputError(f"{where}: backend {clip(repr(row['backend']))} cannot be mapped (servesim models vllm)")
    model, quantization = map_model(row["model_path"], where)
    precision, gemm = row["precision"].strip(), row["gemm_quant_mode"].strip()
    if precision not in ("", "bfloat16", "fp8") or gemm not in ("", "fp8"):
        raise InputError(f"{where}: precision {clip(repr(precision))} / gemm_quant_mode {clip(repr(gemm))} cannot "
                         "be mapped (servesim has bf16 and per-tensor fp8 weights)")
    if precision == "fp8" or gemm == "fp8":
        quantization = "fp8"
    concurrency = positive_int(row["concurrency"], "concurrency", where, MAX_CONCURRENCY)
    return MeasuredPoint(
        name=row["id"] or where, group=f"{model} {row['system']}", model=model, gpu=map_gpu(row["system"], where),
        tensor_parallel_size=positive_int(row["tp_size"], "tp_size", where, MAX_TENSOR_PARALLEL),
        quantization=quantization, num_requests=10 * concurrency, warmup=concurrency, concurrency=concurrency,
        rate=None, burstiness=1.0, input_lens=(positive_int(row["isl"], "isl", where, MAX_TOKENS),),
        output_lens=(positive_int(row["osl"], "osl", where, MAX_TOKENS),),
        measured={"ttft_mean": positive_float(row["silicon_ttft_ms"], "silicon_ttft_ms", where, MAX_MS, MIN_MS) / 1e3,
                  "tpot_mean": positive_float(row["silicon_tpot_ms"], "silicon_tpot_ms", where, MAX_MS, MIN_MS) / 1e3})


def read_vllm_result(path: Path, model: str | None = None) -> MeasuredPoint:
    """A `vllm bench serve --save-result` file; with `--save-detailed`, each request's lengths. Its
    model is `model` (a servesim model) if given, else its model_id's."""
    where = path.name
    try:
        data = json.loads(read_text(path))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"cannot read {str(path)!r}: {clip(str(exc))}") from None
    if not isinstance(data, dict):
        raise InputError(f"{where} is not a vllm bench serve result (not a JSON object)")
    missing = [key for key in VLLM_REQUIRED if key not in data]
    if missing:
        raise InputError(f"{where} is not a whole vllm bench serve result: it lacks {', '.join(missing)}")
    model_id = data["model_id"]
    if not isinstance(model_id, str):
        raise InputError(f"{where}: model_id must be a string, got {clip(repr(model_id))}")
    model_name, quantization = (model, None) if model is not None else map_model(model_id, where)
    rate_text = data["request_rate"]
    rate = (math.inf if rate_text in ("inf", math.inf)
            else positive_float(rate_text, "request_rate", where, MAX_RATE, MIN_RATE))
    concurrency = data["max_concurrency"]
    if concurrency is not None:
        concurrency = positive_int(concurrency, "max_concurrency", where, MAX_CONCURRENCY)
        if rate != math.inf:
            raise InputError(f"{where}: request_rate {rate:g} with max_concurrency {concurrency} (an open loop "
                             "held to a concurrency) cannot be mapped: servesim runs one or the other")
    num_prompts = positive_int(data["num_prompts"], "num_prompts", where, MAX_REQUESTS)
    completed = positive_int(data["completed"], "completed", where, num_prompts)
    input_lens, output_lens = _lengths(data, where, completed)
    if "mean_ttft_ms" not in data:
        raise InputError(f"{where} is not a whole vllm bench serve result: it lacks mean_ttft_ms")
    measured = {f"{metric}_{stat}": _ms(data, f"{stat}_{metric}_ms", where)
                for metric in METRICS for stat in STATS if f"{stat}_{metric}_ms" in data}
    measured["request_throughput"] = positive_float(data["request_throughput"], "request_throughput", where,
                                                    MAX_RATE, MIN_RATE)
    measured["output_throughput"] = positive_float(data["output_throughput"], "output_throughput", where,
                                                   MAX_RATE * MAX_TOKENS, MIN_RATE)
    burstiness = data["burstiness"]
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) or not (
            BURSTINESS[0] <= burstiness <= BURSTINESS[1]):
        raise InputError(f"{where}: burstiness must be a number in [{BURSTINESS[0]:g}, {BURSTINESS[1]:g}], "
                         f"got {clip(repr(burstiness))}")
    return MeasuredPoint(
        name=where, group=model_name, model=model_name, gpu="", tensor_parallel_size=1, quantization=quantization,
        num_requests=num_prompts, warmup=0, concurrency=concurrency, rate=None if concurrency else rate,
        burstiness=float(burstiness), input_lens=input_lens, output_lens=output_lens, measured=measured)


def _ms(data: dict[str, Any], key: str, where: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value == 0 or MIN_MS <= value <= MAX_MS):
        raise InputError(f"{where}: {key} must be 0 or a number of ms in [{MIN_MS:g}, {MAX_MS:g}], "
                         f"got {clip(repr(value))}")
    return float(value) / 1e3


def _lengths(data: dict[str, Any], where: str, completed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each request's lengths from the detail lists, else the means from the totals (fixed)."""
    present = [key for key in DETAIL if key in data]
    if present and len(present) < len(DETAIL):
        raise InputError(f"{where} has per-request detail but lacks {', '.join(k for k in DETAIL if k not in data)}")
    if present:
        inputs, outputs = data["input_lens"], data["output_lens"]
        if not (isinstance(inputs, list) and isinstance(outputs, list)
                and 0 < len(inputs) == len(outputs) <= MAX_REQUESTS):
            raise InputError(f"{where}: input_lens and output_lens must be lists of one length per request "
                             f"(at most {MAX_REQUESTS})")
        done = [(i, o) for i, o in zip(inputs, outputs, strict=True) if o != 0]  # 0: a failed request
        if not done:
            raise InputError(f"{where}: output_lens are all 0, yet {completed} requests completed")
        return (tuple(positive_int(i, "input_lens", where, MAX_TOKENS) for i, _ in done),
                tuple(positive_int(o, "output_lens", where, MAX_TOKENS) for _, o in done))
    total = MAX_REQUESTS * MAX_TOKENS
    mean_in = positive_int(data["total_input_tokens"], "total_input_tokens", where, total) / completed
    mean_out = positive_int(data["total_output_tokens"], "total_output_tokens", where, total) / completed
    return (max(1, round(mean_in)),), (max(1, round(mean_out)),)
