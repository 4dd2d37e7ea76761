"""The token trace, derived from the step log without one object (or one float) per token.

A `StepLog` holds tokens as singles (request, step) and as runs (request, first decode step, count)
over `decode_step`, the step index of each step the decoders ran in. The tokens table expands them when asked for;
the inter-token latencies are summarised from a histogram built in O(steps + runs + singles):
within a run, the gap between decode steps g and g+1 occurs once per run covering both, so each
step-to-step gap is one value with a weight; the gaps where one run or single meets the request's
next one are counted one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.engine.steplog import StepLog
from simulator.metrics.tables import Columns

if TYPE_CHECKING:
    import polars as pl


ROWS_PER_CHUNK = 1 << 21
"""Rows of the tokens table built at a time: bounded memory whatever the run's size."""


def empty_tokens() -> Columns:
    """A tokens table with no rows (request_id and index int64, time float64)."""
    return Columns({"request_id": np.zeros(0, np.int64), "index": np.zeros(0, np.int64), "time": np.zeros(0)})


def token_chunks(log: StepLog, rows_per_chunk: int = ROWS_PER_CHUNK) -> Iterator[Columns]:
    """The tokens table, one row per output token (request_id, index 0-based per request, time = when
    its step's tokens reached the client, `StepLog.token_times`), sorted by request and index, in
    chunks of whole requests of about `rows_per_chunk` rows: singles and runs are sorted by request
    once, and each chunk expands only its own runs."""
    end, decode_step = log.token_times(), log.column("decode_step")
    single_request, single_step = log.column("token_request"), log.column("token_step")
    run_request, run_first, run_count = log.column("run_request"), log.column("run_first"), log.column("run_count")
    by_request = np.argsort(single_request, kind="stable")  # singles are logged in step order
    single_request, single_step = single_request[by_request], single_step[by_request]
    by_request = np.argsort(run_request, kind="stable")  # and a request's runs in time order
    run_request, run_first, run_count = run_request[by_request], run_first[by_request], run_count[by_request]
    num_requests = int(max(single_request.max(initial=-1), run_request.max(initial=-1))) + 1
    per_request = (np.bincount(single_request, minlength=num_requests)
                   + np.bincount(run_request, weights=run_count, minlength=num_requests).astype(np.int64))
    cumulative = np.cumsum(per_request)
    lo = 0
    while lo < num_requests:
        base = int(cumulative[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(cumulative, base + rows_per_chunk, side="right")))
        hi = min(hi, num_requests)
        s0, s1 = np.searchsorted(single_request, [lo, hi])
        r0, r1 = np.searchsorted(run_request, [lo, hi])
        counts = run_count[r0:r1]
        offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        steps = np.concatenate([single_step[s0:s1], decode_step[np.repeat(run_first[r0:r1], counts) + offsets]])
        requests = np.concatenate([single_request[s0:s1], np.repeat(run_request[r0:r1], counts)])
        order = np.lexsort((steps, requests))
        requests, steps = requests[order], steps[order]
        first_of_request = np.r_[True, requests[1:] != requests[:-1]] if len(requests) else np.zeros(0, bool)
        group_start = np.maximum.accumulate(np.where(first_of_request, np.arange(len(requests)), 0))
        yield Columns({"request_id": requests.astype(np.int64),
                       "index": (np.arange(len(requests)) - group_start).astype(np.int64),
                       "time": end[steps]})
        lo = hi


def tokens_table(log: StepLog) -> pl.DataFrame:
    """The whole tokens table in memory (see `token_chunks`; `TokensTable` streams it to a file)."""
    import polars as pl

    chunks = list(token_chunks(log))
    return pl.concat([chunk.frame() for chunk in chunks]) if chunks else empty_tokens().frame()


@dataclass
class TokensTable:
    """The tokens table of a run, streamed to Parquet one row group per chunk (`token_chunks`), so
    memory stays bounded however many rows it has."""

    log: StepLog

    @property
    def height(self) -> int:
        return self.log.num_tokens_alone + int(self.log.column("run_count").sum())

    def write(self, path: Path, metadata: dict[bytes, bytes], progress: Callable[[int], None] | None = None) -> None:
        import pyarrow as pa  # here: a run that writes no tokens table need not load them
        import pyarrow.parquet as pq

        schema = empty_tokens().to_arrow().schema.with_metadata(metadata)
        written = 0
        # Plain encoding and zstd: faster to write and to read than the default (dictionary
        # encoding, snappy), and smaller (docs/performance.md, "Output").
        # A local file, never a URI (`simulator.outputs.run_folder.write_parquet`).
        with (pa.OSFile(str(path), "wb") as sink,
              pq.ParquetWriter(sink, schema, use_dictionary=False, compression="zstd") as writer):
            for chunk in token_chunks(self.log):
                writer.write_table(chunk.to_arrow().replace_schema_metadata(metadata))
                written += chunk.height
                if progress is not None:
                    progress(written)


def itl_histogram(log: StepLog, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every inter-token gap pooled over requests (over those with `keep[request]` when given), as
    sorted distinct values (seconds) and how many times each occurs; tokens of one step are one
    chunk of the stream, and the gaps are between chunks. Its arrays are the log's int32 indices and
    freed as soon as used: a 1M-request run has millions of steps, and each fresh array costs its
    pages (docs/performance.md, "After the third round")."""
    end = log.token_times()
    decode_step = log.int32_column("decode_step")
    single_request, single_step = log.int32_column("token_request"), log.int32_column("token_step")
    run_request, run_first = log.int32_column("run_request"), log.int32_column("run_first")
    run_count = log.int32_column("run_count")
    if keep is not None:
        kept = keep[single_request]
        single_request, single_step = single_request[kept], single_step[kept]
        kept = keep[run_request]
        run_request, run_first, run_count = run_request[kept], run_first[kept], run_count[kept]
    # Each single or run as a piece (request, first step, last step); junctions between a request's
    # consecutive pieces are gaps of their own.
    piece_request = np.concatenate([single_request, run_request])
    piece_first = np.concatenate([single_step, decode_step[run_first]])
    piece_last = np.concatenate([single_step, decode_step[run_first + run_count - 1]])
    order = np.lexsort((piece_first, piece_request))
    piece_request, piece_first, piece_last = piece_request[order], piece_first[order], piece_last[order]
    # Tokens of one step (speculative decoding emits several) stream as one chunk: vllm bench
    # serve times a gap per chunk, so they make no gap of their own.
    same = (piece_request[1:] == piece_request[:-1]) & (piece_first[1:] != piece_last[:-1])
    junctions = end[piece_first[1:][same]] - end[piece_last[:-1][same]]
    del order, piece_request, piece_first, piece_last, same
    # Gaps inside runs: decode step g to g + 1, once per run that covers both.
    decode_end = end[decode_step]
    del end
    steps_gaps = np.diff(decode_end)
    del decode_end
    covering = np.zeros(len(decode_step) + 1, dtype=np.int64)
    long_runs = run_count > 1
    np.add.at(covering, run_first[long_runs], 1)
    np.add.at(covering, run_first[long_runs] + run_count[long_runs] - 1, -1)
    weights = np.cumsum(covering, out=covering)[: max(len(decode_step) - 1, 0)]
    inside = weights > 0
    values = np.concatenate([junctions, steps_gaps[inside]])
    del steps_gaps
    counts = np.concatenate([np.ones(len(junctions), dtype=np.int64), weights[inside]])
    del junctions, weights, covering, inside
    # Equal gaps pooled: sorted once, each run of equal values summed (the arrays above freed first,
    # so a 1M-request run's peak memory is not their sum).
    order = np.argsort(values, kind="stable")
    values = values[order]
    counts = counts[order]
    del order
    if not len(values):
        return values, counts
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts], np.add.reduceat(counts, starts)


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
