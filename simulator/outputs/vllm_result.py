"""A run written as `vllm bench serve --save-result` writes its result JSON, so tools that read
vLLM's results read servesim's.

The field names and their meaning follow vLLM's `vllm/benchmarks/serve.py`: times in the
`*_ms` statistics are milliseconds, the per-request lists (`ttfts`, `itls`, `latencies`,
`start_times`, `queue_times`) are seconds, `failed` counts requests that did not finish (here:
cut off by `--time-limit`), and percentiles are keyed `p{P}_{metric}_ms` for the metrics named in
`--percentile-metrics`. The per-request lists of inputs, outputs, TTFTs, ITLs, start times and
errors are written only with `--save-detailed`, as vLLM does. `queue_times` is vLLM's client-side
wait for a concurrency slot, which a simulated client never has (0); servesim's server-side
queueing is in `requests.parquet`. There are no generated texts.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.config import RunConfig
from simulator.errors import InputError, clip
from simulator.metrics.tables import Tables
from simulator.outputs.run_folder import atomic_file, check_writable, json_safe

if TYPE_CHECKING:
    pass

BACKEND = "servesim"
DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")


def result_path(config: RunConfig, result_dir: Path | None, result_filename: str | None, now: dt.datetime) -> Path:
    """Where --save-result writes, checked before the run so that no run's result is lost to a bad
    path: vLLM's default name, `{backend}-{rate}qps[-concurrency{N}]-{model}-{date}.json`, or
    --result-filename, in --result-dir (never outside it: `../x.json` is refused), a file that does
    not exist yet in a folder that takes new files."""
    rate = config.rate if config.rate is not None else math.inf
    concurrency = f"-concurrency{config.concurrency}" if config.concurrency is not None else ""
    # A model given as a path is named by its folder: its slashes would make folders of the name.
    model = Path(config.model).parent.name if config.model.endswith(".json") else Path(config.model).name
    name = result_filename or f"{BACKEND}-{rate}qps{concurrency}-{model}-{now:%Y%m%d-%H%M%S}.json"
    path = (result_dir or Path()) / name
    folder = (result_dir or Path()).resolve()
    if Path(name).is_absolute() or ".." in Path(name).parts or not path.resolve().is_relative_to(folder) \
            or path.resolve() == folder:
        given = "--result-filename" if result_filename is not None else "the result file's name"
        raise InputError(f"{given} {clip(repr(name))} leads outside --result-dir; give a name in it")
    if path.is_dir():
        raise InputError(f"--result-filename {str(path)!r} is a folder; give the name of the file to write")
    if path.exists():
        raise InputError(f"--result-filename {str(path)!r} already exists")
    check_writable(path, "--result-dir" if result_filename is None else "--result-filename")
    return path


def peak_output_rate(token_times: np.ndarray, first_arrival: float) -> float:
    """Most output tokens in any one-second bucket counted from the first arrival (vLLM's
    `max_output_tokens_per_s`)."""
    if not len(token_times):
        return 0.0
    return float(np.bincount(((token_times - first_arrival) // 1.0).astype(np.int64)).max())


def peak_concurrency(starts: np.ndarray, ends: np.ndarray) -> int:
    """Most requests in flight at once over half-open [start, end): an end precedes a start at the
    same instant (vLLM's `max_concurrent_requests`)."""
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.lexsort((deltas, times))
    return int(np.cumsum(deltas[order]).max()) if len(times) else 0


def vllm_result(summary: dict[str, Any], config: RunConfig, tables: Tables, percentile_metrics: tuple[str, ...],
                detailed: bool, now: dt.datetime) -> dict[str, Any]:
    import polars as pl

    requests = tables.requests
    finished = requests["finished"].to_numpy()
    done = requests.filter(pl.col("finished"))
    tokens = tables.tokens.filter(pl.col("request_id").is_in(done["request_id"].implode()))
    # Tokens of one step (speculative decoding) stream as one chunk: no gap between them.
    gaps = tokens.sort("request_id", "index").group_by("request_id", maintain_order=True).agg(
        pl.col("time").diff().drop_nulls().filter(pl.col("time").diff().drop_nulls() != 0).alias("itl"))
    itl_by_request = dict(zip(gaps["request_id"].to_list(), gaps["itl"].to_list(), strict=True))
    ids = requests["request_id"].to_list()
    result: dict[str, Any] = {
        "date": f"{now:%Y%m%d-%H%M%S}",
        "endpoint_type": BACKEND,
        "backend": BACKEND,
        "label": None,
        "model_id": config.model,
        "tokenizer_id": config.model,
        "num_prompts": summary["num_requests"],
        "request_rate": "inf" if config.rate is None or math.isinf(config.rate) else config.rate,
        "burstiness": config.burstiness,
        "max_concurrency": config.concurrency,
        "duration": summary["duration"],
        "completed": summary["completed"],
        "failed": summary["unfinished"],
        "total_input_tokens": summary["total_input_tokens"],
        "total_output_tokens": summary["total_output_tokens"],
        "request_throughput": summary["request_throughput"],
        "request_goodput": summary.get("request_goodput"),
        "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
        "input_lens": requests["prompt_tokens"].to_list(),
        "output_lens": np.where(finished, requests["output_tokens"].to_numpy(), 0).tolist(),
        "ttfts": requests["ttft"].fill_null(0.0).to_list(),
        "itls": [itl_by_request.get(i, []) for i in ids],
        "latencies": requests["e2el"].fill_null(0.0).to_list(),
        "start_times": requests["arrival"].to_list(),
        "queue_times": [0.0] * len(ids),
        "errors": ["" if ok else f"unfinished at --time-limit {config.time_limit} s" for ok in finished],
        "max_output_tokens_per_s": peak_output_rate(tokens["time"].to_numpy(), float(requests["arrival"][0])),
        "max_concurrent_requests": peak_concurrency(done["arrival"].to_numpy(), done["finish"].to_numpy()),
    }
    if not detailed:
        for name in DETAILED:
            del result[name]
    for metric in percentile_metrics:
        for stat in ("mean", "median", "std", *(f"p{q:g}" for q in config.percentiles)):
            value = summary[f"{stat}_{metric}"]
            result[f"{stat}_{metric}_ms"] = None if value is None else value * 1e3
    return result


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Whole or not at all (written beside its place and renamed into it), with the mode of every
    other output."""
    with atomic_file(path) as partial, partial.open("w") as file:
        json.dump(json_safe(result), file)
