"""The run's tables (requests, tokens, steps) and its summary metrics.

Metrics follow `vllm bench serve`: TTFT = first token - arrival, E2EL = finish - arrival,
TPOT = (E2EL - TTFT) / (output tokens - 1) for outputs longer than one token, ITL = every gap
between consecutive tokens pooled over requests, throughputs = totals / (last finish - first
arrival), goodput = requests meeting every SLO / that duration. Latencies are summarised over
finished requests as mean, median, population std and numpy's linear percentiles. All in seconds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.steplog import STEP_COUNTS, StepLog
from simulator.metrics.fleet import fleet_columns, fleet_totals, server_summaries
from simulator.metrics.tables import Columns, Tables
from simulator.metrics.tokens import describe_histogram, empty_tokens, itl_histogram, tokens_table
from simulator.run.result import RunResult

if TYPE_CHECKING:
    import polars as pl

LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")
LATENCY_STAT = re.compile(rf"(mean|median|std|p\d+(?:\.\d+)?)_({'|'.join(LATENCIES)})")
"""A summary's latency statistic by name: `p99_ttft` is the 99th percentile of TTFT (s)."""
# The overload verdict (`load_state`): growth of the requests in the system that is material (this
# share of the arrival rate: a server 5% past its capacity) and beyond its own noise (this many
# standard errors); a backlog that lasted (the later requests waited for a first token this many
# times as long as nearly all of the first did); waits that grew (this many times the first's).
SATURATED_GROWTH_FRACTION = 0.05
GROWTH_STANDARD_ERRORS = 3.0
BACKLOG_WAIT_FACTOR = 4.0
GROWN_WAIT_FACTOR = 3.0
NOISE_POINTS = 400
"""Evenly spaced instants at which the count's departures from its fitted line are taken, to measure
their spread and how long they stay correlated."""


REQUEST_NULLABLE = frozenset({"scheduled", "first_token", "finish", "ttft", "tpot", "e2el", "queue"})
"""The requests table's columns that are null for a request that never got that far."""


def build_tables(result: RunResult, tokens: bool = True) -> Tables:
    """The run's requests, tokens and steps tables; `tokens=False` leaves the (large) tokens table
    empty for callers that only want the summary."""
    log = result.log
    columns = ("start", "duration", *STEP_COUNTS)
    # Each column made when first read (a summary reads a few; a run folder writes them all).
    prefix_cache = cache(partial(prefix_cache_columns, log))
    steps = Columns({"step": partial(np.arange, len(log), dtype=np.int64)}
                    | {name: partial(log.column, name) for name in columns}
                    | {name: partial(_item, prefix_cache, name) for name in PREFIX_CACHE_COLUMNS},
                    nullable=frozenset({"prefix_cache_hit_rate"}), height=len(log))
    token_rows = tokens_table(log) if tokens else empty_tokens()

    reqs = result.requests
    arrival, first_token, finish, output = reqs.arrival, reqs.first_token, reqs.finish, reqs.output_tokens
    e2el = finish - arrival
    ttft = first_token - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (e2el - ttft) / (output - 1), np.nan)
    requests = Columns({
        "request_id": np.arange(len(reqs), dtype=np.int64),
        "arrival": arrival,
        "prompt_tokens": reqs.prompt_tokens,
        "output_tokens": output,
        "emitted_tokens": reqs.emitted,
        "scheduled": reqs.scheduled,
        "first_token": first_token,
        "finish": finish,
        "ttft": ttft,
        "tpot": tpot,
        "e2el": e2el,
        "queue": reqs.scheduled - arrival,
        "preemptions": reqs.preemptions,
        "priority": reqs.priority,
        "cached_tokens": reqs.cached_tokens,
        "cached_tokens_gpu": reqs.cached_tokens - reqs.cached_tokens_host,
        "cached_tokens_host": reqs.cached_tokens_host,
        "finished": ~np.isnan(finish),
    }, nullable=REQUEST_NULLABLE)
    if result.fleet is not None:
        frames = fleet_columns(result.fleet, requests.frame(), steps.frame())
        return Tables(frames[0], token_rows, frames[1])
    return Tables(requests, token_rows, steps)


PREFIX_CACHE_COLUMNS = ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "prefix_cache_host_hit_tokens",
                        "prefix_cache_hit_rate")


def _item(columns: Callable[[], dict[str, np.ndarray]], name: str) -> np.ndarray:
    return columns()[name]


def prefix_cache_columns(log: StepLog) -> dict[str, np.ndarray]:
    """Per step, the prompt tokens its admissions queried in the prefix cache and found there (of
    them, loaded from the host tier); and the hit rate so far (hits / queries up to that step, NaN
    before the first query), as vLLM's prefix-cache hit rate."""
    steps = log.column("cache_step")
    if not len(steps):  # no admission queried the cache (none kept): the same columns, built directly
        n = len(log)
        return {"prefix_cache_queried_tokens": np.zeros(n, np.int64), "prefix_cache_hit_tokens": np.zeros(n, np.int64),
                "prefix_cache_host_hit_tokens": np.zeros(n, np.int64), "prefix_cache_hit_rate": np.full(n, np.nan)}
    queried = np.bincount(steps, weights=log.column("cache_queried"), minlength=len(log)).astype(np.int64)
    hit = np.bincount(steps, weights=log.column("cache_hit"), minlength=len(log)).astype(np.int64)
    host_hit = np.bincount(steps, weights=log.column("cache_host_hit"), minlength=len(log)).astype(np.int64)
    total = np.cumsum(queried)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(total > 0, np.cumsum(hit) / total, np.nan)
    return {"prefix_cache_queried_tokens": queried, "prefix_cache_hit_tokens": hit,
            "prefix_cache_host_hit_tokens": host_hit, "prefix_cache_hit_rate": rate}


def speculative_decoding(log: StepLog) -> dict[str, Any]:
    """vLLM's speculative decoding metrics (its `SpecDecodingStats`), from the step log's count of
    verify steps by draft tokens accepted (none without speculation): drafts (verify steps, one per
    sequence), draft tokens (k each), accepted tokens (as drawn, before an output's end cuts a step
    short, as vLLM counts them), the draft acceptance rate (accepted / draft tokens), the mean
    acceptance length (1 + accepted / drafts: tokens per verify step) and the per-position
    acceptance rate (drafts whose position i was accepted / drafts, which is the product of the
    conditional probabilities `--spec-acceptance` takes up to i)."""
    counts = np.frombuffer(log.spec_accepted, dtype=np.int64) if len(log.spec_accepted) else np.zeros(0, np.int64)
    if not len(counts):
        return {}
    k = len(counts) - 1
    drafts = int(counts.sum())
    accepted = int(np.dot(np.arange(k + 1), counts))
    reached = np.cumsum(counts[::-1])[::-1][1:]  # drafts that accepted at least i tokens, i = 1..k
    return {"spec_num_drafts": drafts, "spec_num_draft_tokens": k * drafts, "spec_num_accepted_tokens": accepted,
            "spec_acceptance_rate": accepted / (k * drafts) if drafts else math.nan,
            "spec_mean_acceptance_length": 1 + accepted / drafts if drafts else math.nan,
            "spec_acceptance_per_position": (reached / drafts).tolist() if drafts else []}


def median(values: np.ndarray) -> float:
    """`np.median` of a sample without NaN, to the bit (the middle value, or the mean of the middle two),
    without the masked-array module `np.median` imports to check its input is not one."""
    middle = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, middle)[middle])
    low, high = np.partition(values, (middle - 1, middle))[middle - 1:middle + 1]
    return float((low + high) / 2)


def describe(values: np.ndarray, percentiles: tuple[float, ...]) -> dict[str, float | None]:
    """Mean, median, population std and linear percentiles; None for an empty sample."""
    if len(values) == 0:
        return dict.fromkeys(["mean", "median", "std", *(f"p{q:g}" for q in percentiles)])
    stats: dict[str, float | None] = {
        "mean": float(np.mean(values)), "median": median(values), "std": float(np.std(values))}
    for q, v in zip(percentiles, np.percentile(values, percentiles, method="linear"), strict=True):
        stats[f"p{q:g}"] = float(v)
    return stats


def inter_token_latencies(tokens: pl.DataFrame) -> np.ndarray:
    """Gaps between consecutive tokens of each request, from a tokens table sorted by request and
    index; tokens of one step (speculative decoding) are one chunk of the stream, with no gap between."""
    request_ids = tokens["request_id"].to_numpy()
    times = tokens["time"].to_numpy()
    same = (request_ids[1:] == request_ids[:-1]) & (times[1:] != times[:-1])
    return (times[1:] - times[:-1])[same]


def load_state(result: RunResult, steps: Columns) -> dict[str, Any]:
    """Did the server keep up with an open-loop arrival rate?

    Over the second half of the arrival window (past the warm-up, while arrivals still come) the
    number of requests in the system (waiting + running, every server's summed) is fitted against
    time. A short run of a stable server wanders (a burst fills the batch and drains slowly), so a
    slope alone is no evidence. The server is called overloaded only when both signs of a backlog
    growing without bound show: the count grows materially (more than 5% of the arrival rate) and
    beyond its own noise (three standard errors; the noise measured from the run: the spread about
    the line, correlated over the longer of the early requests' latency and the departures' own
    autocorrelation time), and the arrivals of both the third and the last quarter waited for a
    first token four times as long as nearly all of the first tenth (the 90th percentile: a backlog
    that lasted, not a passing burst or a few long prompts). It kept up when the count does not grow
    so and the last quarter's waits did not grow to three times the first tenth's. Otherwise, or
    when the half-window is shorter than twice the early requests' latency, the run cannot tell
    (`kept_up` None). The fitted growth is `queue_growth`, reported whenever the fit ran.
    Time-utilisation is reported too, but it is no test: a continuous batcher is busy whenever one
    request decodes.
    """
    requests = result.requests
    state: dict[str, Any] = {"load": "open loop", "kept_up": None, "utilisation": 0.0, "queue_growth": None,
                             "offered_rate": None}
    if not len(requests) or not steps.height:
        return state | {"load": "empty"}
    first = float(requests.arrival[0])
    finishes = requests.finish
    last = float(np.nanmax(finishes)) if not np.isnan(finishes).all() else result.end_time
    num_servers = len(result.fleet.roles) if result.fleet is not None else 1  # utilisation: the servers' mean
    state["utilisation"] = float(steps["duration"].sum()) / num_servers / (last - first) if last > first else 1.0
    if np.isnan(finishes).all():
        return state | {"load": "none finished"}  # cut off by --time-limit before any request finished
    if result.config.capped_open_loop:
        return state | {"load": "capped open loop", "offered_rate": result.config.rate}
    if result.config.concurrency is not None and result.config.trace is None:
        return state | {"load": "closed loop", "kept_up": True}
    last_arrival = float(requests.arrival[-1])
    if last_arrival == first:
        return state | {"load": "all at once"}
    state["offered_rate"] = (len(requests) - 1) / (last_arrival - first)
    half = (first + last_arrival) / 2
    # The settling time scale: latency of the earliest tenth of requests, before any queue built up.
    early = slice(0, max(1, len(requests) // 10))
    e2el = requests.finish[early] - requests.arrival[early]
    typical_latency = median(e2el[~np.isnan(e2el)]) if not np.isnan(e2el).all() else math.inf
    if last_arrival - half < 2 * typical_latency:
        return state
    growth, standard_error = in_system_growth(steps, half, last_arrival, typical_latency)
    state["queue_growth"] = growth
    growing = (growth > SATURATED_GROWTH_FRACTION * state["offered_rate"]
               and growth > GROWTH_STANDARD_ERRORS * standard_error)
    first_median, first_p90, third_quarter, last_quarter = first_token_waits(result)
    backlog = min(third_quarter, last_quarter) >= BACKLOG_WAIT_FACTOR * first_p90
    if growing and backlog:
        state["kept_up"] = False
    elif not growing and last_quarter < GROWN_WAIT_FACTOR * first_median:
        state["kept_up"] = True
    return state


def in_system_count(steps: Columns) -> tuple[np.ndarray, np.ndarray]:
    """The requests in the system (waiting + running) as a step function of time: from each instant
    of `times` until the next, `counts`; a fleet's servers (each step counts its own) summed."""
    counts = steps["num_waiting"] + steps["num_running"]
    starts = steps["start"]
    if "server" not in steps.names and np.all(starts[1:] >= starts[:-1]):
        # One server, its steps in time order: at each distinct start, its last step's count.
        last = np.append(starts[1:] != starts[:-1], True)
        return starts[last], counts[last].astype(np.float64)
    servers = steps["server"] if "server" in steps.names else np.zeros(len(starts), dtype=np.int64)
    times = np.unique(starts)
    total = np.zeros(len(times), dtype=np.float64)
    for server in np.unique(servers):
        mine = servers == server
        latest = np.searchsorted(starts[mine], times, side="right") - 1  # each server's last step by then
        total += np.where(latest >= 0, counts[mine][np.maximum(latest, 0)], 0)
    return times, total


def in_system_growth(steps: Columns, start: float, end: float, settle: float) -> tuple[float, float]:
    """The growth (requests/s) of the requests in the system over [start, end], the slope of its
    time-weighted least-squares line, and that slope's standard error: the spread about the line,
    correlated over the longer of `settle` (s) and the departures' integrated autocorrelation time."""
    times, counts = in_system_count(steps)
    inside = (times > start) & (times < end)
    edges = np.concatenate(([start], times[inside], [end]))
    values = counts[np.maximum(np.searchsorted(times, edges[:-1], side="right") - 1, 0)]
    values[edges[:-1] < times[0]] = 0.0  # before the first step nothing was in the system
    span, centre = end - start, (start + end) / 2
    a, b = edges[:-1] - centre, edges[1:] - centre
    slope = float(np.sum(values * (b**2 - a**2) / 2) / (span**3 / 12))
    level = float(np.sum(values * (b - a)) / span)
    instants = start + (np.arange(NOISE_POINTS) + 0.5) * span / NOISE_POINTS
    at = values[np.searchsorted(edges, instants, side="right") - 1]
    departures = at - (level + slope * (instants - centre))
    correlated = max(settle, autocorrelation_time(departures, span / NOISE_POINTS))
    return slope, float(np.std(departures)) * math.sqrt(12 * correlated / span**3)


def autocorrelation_time(series: np.ndarray, spacing: float) -> float:
    """Integrated autocorrelation time (s) of evenly spaced `series`: `spacing` x (1 + 2 x the sum of
    its autocorrelations up to the first that is not positive)."""
    centred = series - series.mean()
    variance = float(np.dot(centred, centred))
    if variance == 0:
        return spacing
    correlations = np.correlate(centred, centred, "full")[len(centred):] / variance
    stop = np.flatnonzero(correlations <= 0)
    return spacing * (1 + 2 * float(np.sum(correlations[:stop[0] if len(stop) else len(correlations)])))


def first_token_waits(result: RunResult) -> tuple[float, float, float, float]:
    """How long requests waited for a first token: the first tenth of the arrivals' median and 90th
    percentile, the third quarter's median and the last quarter's. A request without a first token
    waited at least until the run's end."""
    requests = result.requests
    first_token = np.where(np.isnan(requests.first_token), result.end_time, requests.first_token)
    wait = first_token - requests.arrival
    n = len(wait)
    first = wait[:max(1, n // 10)]
    third_quarter, last_quarter = wait[n // 2:max(3 * n // 4, n // 2 + 1)], wait[3 * n // 4:]
    return median(first), float(np.percentile(first, 90)), median(third_quarter), median(last_quarter)


def load_verdict(kept_up: object, load: object, offered_rate: str, queue_growth: str) -> tuple[str, str] | None:
    """(kind, sentence) for what `load_state` found, as the CLI and the report both say it: overloaded,
    too short to tell (the window too short, or the signs of a backlog mixed), a burst, or kept up;
    None when the state says none of these. The two rates come formatted, "-" for none (the report
    formats numbers read from a file it does not trust)."""
    if kept_up is False:
        return "bad", (f"OVERLOADED: the server did not keep up with {offered_rate} req/s (requests in the system "
                       f"grew by {queue_growth}/s in the second half of the arrivals). Queues grow without bound at "
                       "this rate, so TTFT and queue time measure the run's length, not the server.")
    if kept_up is None and load == "open loop" and queue_growth == "-":
        return "unsure", ("Too short to tell whether the server keeps up at this rate: the second half of the "
                          "arrivals lasted less than twice a typical request's latency. Send more requests.")
    if kept_up is None and load == "open loop":
        return "unsure", (f"Too short to tell whether the server keeps up at this rate: in the second half of the "
                          f"arrivals the requests in the system grew by {queue_growth}/s, and this run cannot tell "
                          "a backlog growing without bound (steady growth, late requests waiting ever longer for a "
                          "first token) from a passing one. Send more requests.")
    if load == "capped open loop":
        return "unsure", (f"An open loop of {offered_rate} req/s capped at --max-concurrency requests in flight: a "
                          "request due while the cap is reached waits in the client, and its latencies count from "
                          "its send, as vllm bench serve counts them. Whether the server keeps up with the rate "
                          "itself is not judged; the request throughput is the rate it served.")
    if load == "all at once":
        return "unsure", "All requests arrived at once (--rate inf): a burst, not a steady load."
    if kept_up is True:
        return "good", f"The server kept up ({load})."
    return None


def summarize(result: RunResult, tables: Tables) -> dict[str, Any]:
    config = result.config
    requests, steps = tables.columns("requests"), tables.columns("steps")
    finished = requests["finished"]
    num_done = int(finished.sum())
    summary: dict[str, Any] = {
        "num_requests": result.num_requests,
        "arrived": len(result.requests),
        "completed": num_done,
        "unfinished": len(result.requests) - num_done,
        "preemptions": int(requests["preemptions"].sum()),
        "num_steps": steps.height,
        "kv_blocks": result.kv_blocks,
        "kv_capacity_tokens": result.kv_blocks * config.block_size,
    }
    # The steps' prefix-cache columns summed, from the log's queries (no per-step column made).
    log = result.log
    queried = int(log.column("cache_queried").sum())
    summary["prefix_cache_queried_tokens"] = queried
    summary["prefix_cache_hit_tokens"] = int(log.column("cache_hit").sum())
    summary["prefix_cache_hit_rate"] = summary["prefix_cache_hit_tokens"] / queried if queried else math.nan
    host_hit = int(log.column("cache_host_hit").sum())
    summary["prefix_cache_host_hit_tokens"] = host_hit
    gpu_hit = summary["prefix_cache_hit_tokens"] - host_hit
    summary["prefix_cache_hit_rate_gpu"] = gpu_hit / queried if queried else math.nan
    summary["prefix_cache_hit_rate_host"] = host_hit / queried if queried else math.nan
    if result.host is not None:
        host = result.host
        summary["kv_offload_blocks"] = host.blocks
        summary["kv_offload_capacity_tokens"] = host.blocks * config.block_size
        loaded = host_hit // config.block_size
        summary["kv_offload_loaded_blocks"] = loaded
        summary["kv_offload_load_time"] = loaded * host.block_bytes / host.bandwidth
    done = {name: requests[name][finished]
            for name in ("finish", "prompt_tokens", "output_tokens", "ttft", "tpot", "e2el", "queue")}
    duration = 0.0
    if num_done:
        duration = float(done["finish"].max() - requests["arrival"].min())
    summary["duration"] = duration
    input_tokens = int(done["prompt_tokens"].sum())
    output_tokens = int(done["output_tokens"].sum())
    summary["total_input_tokens"] = input_tokens
    summary["total_output_tokens"] = output_tokens
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    summary["request_throughput"] = rate(num_done)
    summary["output_throughput"] = rate(output_tokens)
    summary["total_token_throughput"] = rate(input_tokens + output_tokens)

    samples = {"ttft": done["ttft"], "tpot": done["tpot"][~np.isnan(done["tpot"])], "e2el": done["e2el"],
               "queue": done["queue"]}
    keep = finished if summary["unfinished"] else None
    itl = describe_histogram(*itl_histogram(result.log, keep), config.percentiles)
    for name in LATENCIES:
        stats = itl if name == "itl" else describe(samples[name], config.percentiles)
        for stat, value in stats.items():
            summary[f"{stat}_{name}"] = value

    if config.goodput:
        good = np.ones(num_done, dtype=bool)
        for metric, limit in config.goodput:
            values = requests[metric][finished]
            good &= np.where(np.isnan(values), 0.0, values) <= limit
        summary["good_requests"] = int(good.sum())
        summary["request_goodput"] = rate(int(good.sum()))
    summary.update(load_state(result, steps))
    summary.update(speculative_decoding(result.log))
    summary["cost_extrapolations"] = sum(result.cost_extrapolated.values())
    summary["cost_extrapolated"] = ", ".join(f"{family}: {n}" for family, n in sorted(result.cost_extrapolated.items()))
    summary["cost_notes"] = "; ".join(result.cost_notes)
    if result.fleet is not None:
        summary["servers"] = server_summaries(result, tables, duration)
        summary |= fleet_totals(summary["servers"], tables.requests)
    return summary
