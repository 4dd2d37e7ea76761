"""aiperf's summary exports: `profile_export_aiperf.json` and `profile_export_aiperf.csv`.

The JSON (aiperf's `JsonExportData`) holds one object per metric (`{"unit": "ms", "avg": ..., "p50":
..., "p99": ...}`) under the metric's tag, and `input_config`, the user's settings as given (unset
ones left out): `endpoint.model_names`, `loadgen.concurrency` / `loadgen.request_rate` (with
`request_rate_mode`, `poisson` by default) and `loadgen.warmup_request_count`. Neither concurrency
nor rate given is aiperf's concurrency 1. The CSV holds the same statistics in two sections
(`Metric,avg,min,max,p1,...` rows named `Time to First Token (ms)`, then `Metric,Value` rows) and no
settings: it is read with the `profile_export_aiperf.json` aiperf writes beside it.

Mapped onto servesim's statistics: `time_to_first_token` is TTFT; aiperf's `inter_token_latency`
is per request (latency - TTFT) / (output tokens - 1), vLLM bench's TPOT; `request_latency` is E2EL.
The lengths are the measured means (`input_sequence_length`, `output_sequence_length`), replayed
fixed; the measured requests are `request_count`. The GPU is not recorded: it is `--gpu`.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from simulator.deploy.resolve import ModelResolver
from simulator.errors import InputError, clip
from simulator.sim2real import points as limits
from simulator.sim2real.points import Reading, Unmappable, one_run, positive_float, positive_int, read_json_object

JSON_NAME = "profile_export_aiperf.json"
TIMES = {"time_to_first_token": "ttft", "inter_token_latency": "tpot", "request_latency": "e2el"}
"""aiperf's latency metrics and the statistic each is in servesim."""
RATES = {"request_throughput": "request_throughput", "output_token_throughput": "output_throughput"}
STATS = {"avg": "mean", "p50": "median", "p99": "p99"}
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}
HEADERS = {"Time to First Token": "time_to_first_token", "Inter Token Latency": "inter_token_latency",
           "Request Latency": "request_latency", "Request Throughput": "request_throughput",
           "Output Token Throughput": "output_token_throughput", "Request Count": "request_count",
           "Input Sequence Length": "input_sequence_length", "Output Sequence Length": "output_sequence_length"}
"""aiperf's metric headers (its CSV names rows by them, the unit in brackets) and their tags."""
NEEDED = ("time_to_first_token", "request_count", "input_sequence_length", "output_sequence_length")


def is_aiperf_json(data: dict[str, Any]) -> bool:
    return "input_config" in data or isinstance(data.get("time_to_first_token"), dict)


def read_aiperf_json(path: Path, data: dict[str, Any], resolver: ModelResolver, model: str | None) -> Reading:
    return aiperf_reading(path.name, data, data.get("input_config"), resolver, model)


def read_aiperf_csv(path: Path, text: str, resolver: ModelResolver, model: str | None) -> Reading:
    """The CSV's statistics with the settings of the JSON aiperf wrote beside it."""
    metrics = csv_metrics(path.name, text)
    beside = path.with_name(JSON_NAME)
    if not beside.is_file():
        raise InputError(f"{path.name} is aiperf's CSV export, which does not record the model nor the load: "
                         f"it is read with the {JSON_NAME} beside it (not found)")
    settings = read_json_object(beside).get("input_config")
    return aiperf_reading(path.name, metrics, settings, resolver, model)


def csv_metrics(where: str, text: str) -> dict[str, dict[str, Any]]:
    """The CSV's rows as the JSON's metric objects: {tag: {"unit": ..., "avg": ..., ...}}."""
    metrics: dict[str, dict[str, Any]] = {}
    columns: list[str] = []
    try:
        for number, cells in enumerate(csv.reader(io.StringIO(text, newline="")), start=1):
            if not cells or not any(c.strip() for c in cells):
                continue
            if cells[0] == "Metric":
                columns = ["avg" if c == "Value" else c for c in cells[1:]]
                continue
            found = re.fullmatch(r"(.*?)(?: \(([^()]*)\))?", cells[0].strip())
            assert found is not None
            tag = HEADERS.get(found.group(1))
            if tag is None:
                continue
            if len(cells) - 1 != len(columns):
                raise InputError(f"{where} line {number}: {len(cells) - 1} values where the header has {len(columns)}")
            metrics[tag] = {"unit": found.group(2) or ""} | {c: v for c, v in zip(columns, cells[1:], strict=True)
                                                              if v.strip()}
    except csv.Error as exc:
        raise InputError(f"{where}: {clip(str(exc))}") from None
    if not metrics:
        raise InputError(f"{where} is not aiperf's CSV export: it has no row named "
                         f"{', '.join(f'{h!r}' for h in list(HEADERS)[:3])}, ...")
    return metrics


def aiperf_reading(where: str, data: dict[str, Any], settings: Any, resolver: ModelResolver,
                   model: str | None) -> Reading:
    missing = [key for key in NEEDED if not isinstance(data.get(key), dict)]
    if not isinstance(settings, dict):
        missing.append("input_config")
    if missing:
        raise InputError(f"{where} is not a whole aiperf export: it lacks {', '.join(missing)}")
    endpoint, loadgen = section(settings, "endpoint", where), section(settings, "loadgen", where)
    names = endpoint.get("model_names")
    if not (isinstance(names, list) and names and isinstance(names[0], str)):
        raise InputError(f"{where}: input_config.endpoint.model_names must be a list of model names, "
                         f"got {clip(repr(names))}")
    try:
        concurrency, rate, burstiness = load(loadgen, where)
    except Unmappable as skip:
        return Reading(skipped=[(where, skip.reason)])
    warmup = loadgen.get("warmup_request_count", 0)
    warmup = 0 if warmup == 0 else positive_int(warmup, "loadgen.warmup_request_count", where, limits.MAX_REQUESTS)
    count = round(number(data, "request_count", "avg", where))
    count = positive_int(count, "request_count", where, limits.MAX_REQUESTS)
    lengths = [positive_int(max(1, round(number(data, tag, "avg", where))), tag, where, limits.MAX_TOKENS)
               for tag in ("input_sequence_length", "output_sequence_length")]
    measured: dict[str, float] = {}
    for tag, metric in TIMES.items():
        if isinstance(data.get(tag), dict):
            scale = TIME_UNITS.get(str(data[tag].get("unit")))
            if scale is None:
                raise InputError(f"{where}: {tag} has unit {clip(repr(data[tag].get('unit')))}, not a time")
            measured |= {f"{metric}_{stat}": number(data, tag, key, where) * scale
                         for key, stat in STATS.items() if data[tag].get(key) is not None}
    measured |= {name: number(data, tag, "avg", where) for tag, name in RATES.items()
                 if isinstance(data.get(tag), dict)}
    return one_run(where, names[0], model, resolver, num_requests=count, warmup=warmup, concurrency=concurrency,
                   rate=rate, burstiness=burstiness, input_lens=(lengths[0],), output_lens=(lengths[1],),
                   measured=measured)


def section(settings: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = settings.get(name, {})
    if not isinstance(value, dict):
        raise InputError(f"{where}: input_config.{name} must be an object, got {clip(repr(value))}")
    return value


def load(loadgen: dict[str, Any], where: str) -> tuple[int | None, float | None, float]:
    """(concurrency, rate, burstiness) of the client: a closed loop, or Poisson (or constant) arrivals."""
    concurrency, rate = loadgen.get("concurrency"), loadgen.get("request_rate")
    if rate is None:
        given = 1 if concurrency is None else concurrency
        return positive_int(given, "loadgen.concurrency", where, limits.MAX_CONCURRENCY), None, 1.0
    if concurrency is not None:
        raise Unmappable("a request rate held to a concurrency (servesim runs one or the other)")
    mode = loadgen.get("request_rate_mode", "poisson")
    if mode not in ("poisson", "constant"):
        raise InputError(f"{where}: loadgen.request_rate_mode {clip(repr(mode))} is not poisson nor constant")
    # Constant arrivals: the gamma of the largest shape taken (a coefficient of variation of 3%).
    burstiness = 1.0 if mode == "poisson" else limits.BURSTINESS[1]
    return None, positive_float(rate, "loadgen.request_rate", where, limits.MAX_RATE, limits.MIN_RATE), burstiness


def number(data: dict[str, Any], tag: str, key: str, where: str) -> float:
    """A statistic's value: a JSON number, or a CSV cell that reads as one, finite and >= 0."""
    value = data[tag].get(key)
    try:
        result = float(value) if isinstance(value, str) else value
    except ValueError:
        result = None
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not 0 <= result <= limits.MAX_MS * 1e6:
        raise InputError(f"{where}: {tag}.{key} must be a number >= 0, got {clip(repr(value))}")
    return float(result)
