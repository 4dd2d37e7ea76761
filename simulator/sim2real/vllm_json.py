"""`vllm bench serve --save-result` JSON: one benchmark, with `--save-detailed` each request's lengths.

The file does not record the GPU, the tensor parallelism nor the weights' dtype: they come from the
command line (`with_deployment`). Its model is `--model` (a servesim model) if given, else its
`model_id` resolved (`simulator.deploy.resolve`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from simulator.deploy.resolve import ModelResolver
from simulator.errors import InputError, clip
from simulator.sim2real.points import (
    BURSTINESS,
    MAX_CONCURRENCY,
    MAX_MS,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_TOKENS,
    METRICS,
    MIN_MS,
    MIN_RATE,
    STATS,
    Reading,
    one_run,
    positive_float,
    positive_int,
)

VLLM_REQUIRED = ("model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency", "completed",
                 "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput")
"""What every `vllm bench serve --save-result` file holds; of the latency statistics it holds those of
`--percentile-metrics` (ttft, tpot, itl by default), and at least the TTFT's."""
DETAIL = ("input_lens", "output_lens", "ttfts", "itls")


def read_vllm_result(path: Path, data: dict[str, Any], resolver: ModelResolver, model: str | None = None) -> Reading:
    """The file's one point, or its skip (a model_id that resolves to no model servesim prices)."""
    where = path.name
    missing = [key for key in VLLM_REQUIRED if key not in data]
    if missing:
        raise InputError(f"{where} is not a whole vllm bench serve result: it lacks {', '.join(missing)}")
    model_id = data["model_id"]
    if not isinstance(model_id, str):
        raise InputError(f"{where}: model_id must be a string, got {clip(repr(model_id))}")
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
    return one_run(where, model_id, model, resolver, num_requests=num_prompts, warmup=0, concurrency=concurrency,
                   rate=None if concurrency else rate, burstiness=float(burstiness), input_lens=input_lens,
                   output_lens=output_lens, measured=measured)


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
