"""A measured point and the checks every reader of measured results shares.

A point holds the deployment (model, GPU, serving stack, parallelism, weight dtype; for a
disaggregated row its prefill and decode pools), the workload as the client sent it (lengths, closed
loop or arrival rate, warm-up, request count) and the measured statistics in seconds (`ttft_mean`,
`tpot_median`, ..., throughputs in requests or tokens per s).

Two kinds of trouble are told apart: a value that is malformed (not a number, out of range) makes
the file unreadable (`InputError`, one line naming it); a well-formed row servesim cannot express
(a model it cannot price, a GPU without a profile, a parallelism it does not model) is `Unmappable`:
the row is skipped and counted by its reason, and the rest of the file is rerun.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.deploy.hardware import available_gpus
from simulator.deploy.resolve import ModelResolver, Resolved
from simulator.errors import InputError, clip

BACKENDS = ("vllm", "sglang", "trtllm")
MODES = ("agg", "disagg")


class Unmappable(Exception):
    """A well-formed row servesim cannot express; `reason` is the same for every row it applies to."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PoolShape:
    """One pool of a disaggregated deployment: its workers and the parallelism of each."""

    workers: int
    tensor_parallel_size: int
    batch_size: int | None = None
    """The pool's per-worker batch size as the row gives it (None: not given)."""
    pp_size: int = 1
    attention_dp_size: int = 1
    moe_tp_size: int | None = None
    moe_ep_size: int = 1


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured benchmark to rerun. Times in seconds, lengths in tokens."""

    name: str
    group: str
    """Rows compared together in the summary (model on GPU)."""
    model: str
    """A built-in model's name or a config.json's path (`simulator.deploy.resolve`)."""
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
    """The serving stack measured: vllm, sglang or trtllm."""
    backend_version: str | None = None
    mode: str = "agg"
    """`agg`: every server prefills and decodes; `disagg`: `prefill` and `decode` pools."""
    pp_size: int = 1
    attention_dp_size: int = 1
    moe_tp_size: int | None = None
    moe_ep_size: int = 1
    moe_quantization: str | None = None
    prefill: PoolShape | None = None
    decode: PoolShape | None = None


@dataclass
class Reading:
    """What a file gave: the points to rerun and each skipped row's (where, reason)."""

    points: list[MeasuredPoint] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


MAX_TOKENS = 1 << 31
"""The longest prompt or output a measured request may have: past every model's context."""
MAX_REQUESTS = 1_000_000
"""The most requests a measured point may hold (each is rerun): more than one benchmark sends."""
MAX_CONCURRENCY = 100_000
MAX_TENSOR_PARALLEL = 1024
MAX_WORKERS = 4096
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
STATS = ("mean", "median", "p99")
METRICS = ("ttft", "tpot", "itl", "e2el")


def positive_int(value: Any, name: str, where: str, most: int) -> int:
    """An integer in [1, most]: a JSON integer, or a CSV cell of ASCII digits."""
    number = int(value) if isinstance(value, str) and re.fullmatch(r"[0-9]{1,30}", value.strip()) else value
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= most:
        raise InputError(f"{where}: {name} must be an integer in [1, {most}], got {clip(repr(value))}")
    return number


def optional_int(value: str, name: str, where: str, most: int, default: int | None) -> int | None:
    """A CSV cell that may be empty (or 0, as aiconfigurator writes "not used"): `default` then."""
    return default if value.strip() in ("", "0") else positive_int(value, name, where, most)


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


def map_gpu(system: str) -> str:
    """The shipped GPU profile of a row's system; a system without one is unmappable."""
    if system not in available_gpus():
        raise Unmappable(f"system {clip(repr(system))} has no shipped GPU profile")
    return system


def map_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise Unmappable(f"backend {clip(repr(backend))} (servesim models {', '.join(BACKENDS)})")
    return backend


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_text(path))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"cannot read {str(path)!r}: {clip(str(exc))}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path.name} is not a vllm bench serve result nor an aiperf export (not a JSON object)")
    return data


def resolve(resolver: ModelResolver, model_path: str) -> Resolved:
    """The row's model; one servesim cannot find or price is unmappable, naming the field that stops it."""
    try:
        return resolver.resolve(model_path)
    except InputError as exc:
        message = re.sub(r" \(supported: [^)]*\)$", "", re.sub(r"^model config '[^']*': ", "", str(exc)))
        if message.startswith("model "):
            raise Unmappable(message) from None
        raise Unmappable(f"model {clip(repr(model_path.strip()))}: {message}") from None


def one_run(where: str, model_id: str, model: str | None, resolver: ModelResolver, **fields: Any) -> Reading:
    """The reading of a file of one benchmark run (vLLM, aiperf), which does not record its GPU nor
    its parallelism: one point of `model` (a servesim model) if given, else of `model_id` resolved,
    or its skip where that model is one servesim cannot find or price."""
    if model is not None:
        name = group = model
    else:
        try:
            resolved = resolve(resolver, model_id)
        except Unmappable as skip:
            return Reading(skipped=[(where, skip.reason)])
        name, group = resolved.model, resolved.name
    return Reading(points=[MeasuredPoint(name=where, group=group, model=name, gpu="", tensor_parallel_size=1,
                                         quantization=None, **fields)])
