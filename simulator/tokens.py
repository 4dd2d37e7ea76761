"""The token trace, derived from the step log without one object (or one float) per token.

A `StepLog` holds tokens as singles (request, step) and as runs (request, first lazy step, count)
over `lazy_step`, the step index of each lazy step. The tokens table expands them when asked for;
the inter-token latencies are summarised from a histogram built in O(steps + runs + singles):
within a run, the gap between lazy steps g and g+1 occurs once per run covering both, so each
step-to-step gap is one value with a weight; the gaps where one run or single meets the request's
next one are counted one by one.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from simulator.engine import StepLog


def step_ends(log: StepLog) -> np.ndarray:
    return log.column("start") + log.column("duration")


def tokens_table(log: StepLog) -> pl.DataFrame:
    """One row per output token: request_id, index (0-based, per request), time (end of its step)."""
    lazy_step = log.column("lazy_step")
    run_request, run_first, run_count = log.column("run_request"), log.column("run_first"), log.column("run_count")
    total = int(run_count.sum())
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(run_count) - run_count, run_count)
    steps = np.concatenate([log.column("token_step"), lazy_step[np.repeat(run_first, run_count) + offsets]])
    requests = np.concatenate([log.column("token_request"), np.repeat(run_request, run_count)])
    order = np.lexsort((steps, requests))
    requests, steps = requests[order], steps[order]
    first_of_request = np.r_[True, requests[1:] != requests[:-1]] if len(requests) else np.zeros(0, bool)
    group_start = np.maximum.accumulate(np.where(first_of_request, np.arange(len(requests)), 0))
    return pl.DataFrame({
        "request_id": requests,
        "index": (np.arange(len(requests)) - group_start).astype(np.int64),
        "time": step_ends(log)[steps],
    })


def itl_histogram(log: StepLog, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every inter-token gap pooled over requests (over those with `keep[request]` when given), as
    sorted distinct values (seconds) and how many times each occurs."""
    end = step_ends(log)
    lazy_step = log.column("lazy_step")
    single_request, single_step = log.column("token_request"), log.column("token_step")
    run_request, run_first, run_count = log.column("run_request"), log.column("run_first"), log.column("run_count")
    if keep is not None:
        kept = keep[single_request]
        single_request, single_step = single_request[kept], single_step[kept]
        kept = keep[run_request]
        run_request, run_first, run_count = run_request[kept], run_first[kept], run_count[kept]
    # Each single or run as a piece (request, first step, last step); junctions between a request's
    # consecutive pieces are gaps of their own.
    piece_request = np.concatenate([single_request, run_request])
    piece_first = np.concatenate([single_step, lazy_step[run_first]])
    piece_last = np.concatenate([single_step, lazy_step[run_first + run_count - 1]])
    order = np.lexsort((piece_first, piece_request))
    piece_request, piece_first, piece_last = piece_request[order], piece_first[order], piece_last[order]
    same = piece_request[1:] == piece_request[:-1]
    junctions = end[piece_first[1:][same]] - end[piece_last[:-1][same]]
    # Gaps inside runs: lazy step g to g + 1, once per run that covers both.
    lazy_end = end[lazy_step]
    covering = np.zeros(len(lazy_step) + 1, dtype=np.int64)
    long_runs = run_count > 1
    np.add.at(covering, run_first[long_runs], 1)
    np.add.at(covering, run_first[long_runs] + run_count[long_runs] - 1, -1)
    weights = np.cumsum(covering)[: max(len(lazy_step) - 1, 0)]
    inside = weights > 0
    values = np.concatenate([junctions, (lazy_end[1:] - lazy_end[:-1])[inside]])
    counts = np.concatenate([np.ones(len(junctions), dtype=np.int64), weights[inside]])
    distinct, where = np.unique(values, return_inverse=True)
    return distinct, np.bincount(where.ravel(), weights=counts, minlength=len(distinct)).astype(np.int64)


def describe_histogram(values: np.ndarray, counts: np.ndarray, percentiles: tuple[float, ...]
                       ) -> dict[str, float | None]:
    """`metrics.describe` of the sample holding each value `count` times, without expanding it:
    mean, median, population std and numpy's linear percentiles."""
    total = int(counts.sum())
    names = ["mean", "median", "std", *(f"p{q:g}" for q in percentiles)]
    if total == 0:
        return dict.fromkeys(names)
    mean = float(np.dot(values, counts) / total)
    std = float(np.sqrt(np.dot(counts, (values - mean) ** 2) / total))
    cumulative = np.cumsum(counts)

    def order_statistic(k: int) -> float:
        return float(values[np.searchsorted(cumulative, k, side="right")])

    def percentile(q: float) -> float:
        # numpy's "linear" method: virtual index (n - 1) q, and its lerp (exact at both ends).
        h = (total - 1) * (q / 100)
        lo = int(np.floor(h))
        t = h - lo
        a, b = order_statistic(lo), order_statistic(min(lo + 1, total - 1))
        return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t

    stats: dict[str, float | None] = {"mean": mean, "median": percentile(50.0), "std": std}
    for q in percentiles:
        stats[f"p{q:g}"] = percentile(q)
    return stats
