"""Read recorded request traces (CSV, JSONL/JSON, Parquet) into a `Workload`, as recorded.

Recognised columns (names matched case-insensitively, the first candidate present wins; one name
given twice is refused):
- arrival time: `arrival` (seconds) or `timestamp` (datetimes, datetime strings, or numbers in
  seconds). Mooncake traces, recognised by their `hash_ids` column, give `timestamp` in
  milliseconds.
- prompt length: `prompt_tokens`, `input_length`, `input_tokens` or `ContextTokens`.
- output length: `output_tokens`, `output_length` or `GeneratedTokens`.
- prefix identity (for the prefix cache, `workloads.prefixes`): Mooncake's `hash_ids`, one id per
  512-token prompt block (equal ids = equal prefix; the last block holds the rest of the prompt, so
  a row has exactly ceil(prompt / 512) ids, each an integer in [0, 2**40)); or else a session column,
  `session_id`, `session` or `conversation_id` (text or integers): each turn's prompt starts with as
  much of its session's previous turn (prompt, then answer) as it is long.
Other columns are ignored. This covers the Azure LLM inference trace 2023 (TIMESTAMP,
ContextTokens, GeneratedTokens) and Mooncake's JSONL traces as published.

Every value read is checked: token counts are integers in [1, 2**31] (no model's context is
longer), arrivals finite and within ten years of each other. Requests are sorted by arrival
(stably, so ties keep file order), shifted so the first arrives at 0 and divided by `speed`.
Messages name the file and the bad record's 1-based line (a CSV's header is line 1) or Parquet row
(`workloads.trace_files`), and so does the workload (`Workload.describe`) for each request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from simulator.errors import InputError, clip
from workloads.prefixes import TRACE_BLOCK_TOKENS, Content, session_content, trace_block_content
from workloads.trace_files import ROLES, TraceFile, find_column, first, read_frame
from workloads.workload import Workload

MAX_HASH_ID = 1 << 40
MAX_TOKENS = 1 << 31
"""The longest prompt or output a trace may hold: past every model's context."""
MAX_SPAN = 10 * 365.25 * 86400
"""The longest a trace may last, in seconds (ten years): longer is a unit mistaken (nanoseconds read
as seconds) or a corrupted time."""


@dataclass(frozen=True, eq=False)
class TraceRows:
    """Where each request of a workload read from a trace is in its file."""

    trace: TraceFile
    records: npt.NDArray[np.intp]
    """Per request, its record's index in file order."""

    def where(self, request: int) -> str:
        return f"{self.trace.path} {self.trace.where(int(self.records[request]))}"


def read_trace(path: str | Path, speed: float = 1.0, limit: int | None = None) -> Workload:
    """Read a trace; `speed` 2 replays it twice as fast, `limit` keeps the first N requests."""
    path = Path(path)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0 < speed < math.inf:
        raise InputError(f"trace speed must be a finite number > 0, got {speed!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"trace limit must be an integer >= 1, got {limit!r}")
    frame, trace = read_frame(path)
    if frame.height == 0:
        raise InputError(f"{path}: trace has no requests")

    arrival_column = _column(frame, "arrival time", path)
    mooncake = find_column(frame.columns, "prefix block ids", path)
    in_milliseconds = arrival_column.lower() == "timestamp" and mooncake is not None
    arrival = _seconds_since_first(frame[arrival_column], in_milliseconds, trace)
    if not arrival.max() / speed <= MAX_SPAN:
        last = int(np.argmax(arrival))
        raise InputError(f"{path}: the request in {trace.where(last)} arrives {arrival[last] / speed:.3g} s after "
                         f"the first (at --trace-speed {speed:g}), past ten years: is {arrival_column} in seconds?")
    prompt = _token_counts(frame[_column(frame, "prompt length", path)], trace)
    output = _token_counts(frame[_column(frame, "output length", path)], trace)

    order = np.argsort(arrival, kind="stable")[:limit]
    content = None
    if mooncake is not None:
        content = _hash_id_content(frame[mooncake], prompt, order, trace)
    elif (session := find_column(frame.columns, "session", path)) is not None:
        sessions = _session_ids(frame[session], trace)
        content = session_content(sessions.gather(order).to_list(), prompt[order].tolist(), output[order].tolist())
    return Workload(
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        arrival=arrival[order] / speed,
        concurrency=None,
        content=content,
        origin=TraceRows(trace, order.copy()),  # not a view holding the whole sort when limited
    )


def _column(frame: pl.DataFrame, role: str, path: Path) -> str:
    name = find_column(frame.columns, role, path)
    if name is None:
        raise InputError(f"{path}: no {role} column; looked for {', '.join(ROLES[role][0])}, "
                         f"found {clip(', '.join(frame.columns))}")
    return name


def _hash_id_content(column: pl.Series, prompt: npt.NDArray[np.int64], order: npt.NDArray[np.intp],
                     trace: TraceFile) -> tuple[Content, ...]:
    """Mooncake's hash ids, checked: a list of integers in [0, 2**40) per row, one per 512 prompt tokens."""
    _check_no_nulls(column, trace)
    if not isinstance(column.dtype, pl.List) or not column.dtype.inner.is_integer():
        raise InputError(f"{trace.path}: column {column.name} has type {column.dtype}; "
                         "expected lists of integer block ids")
    counts = column.list.len().to_numpy()
    expected = -(-prompt // TRACE_BLOCK_TOKENS)
    row = first(counts != expected)
    if row is not None:
        raise InputError(f"{trace.path}: column {column.name} has {counts[row]} ids in {trace.where(row)}, where "
                         f"{prompt[row]} prompt tokens make {expected[row]} blocks of {TRACE_BLOCK_TOKENS}")
    flat = column.explode().cast(pl.Float64).to_numpy()  # a null id becomes NaN
    bad = first(~np.isfinite(flat) | (flat < 0) | (flat >= MAX_HASH_ID))
    if bad is not None:
        row = int(np.searchsorted(np.cumsum(counts), bad, side="right"))
        raise InputError(f"{trace.path}: column {column.name} has id {flat[bad]} in {trace.where(row)}; "
                         f"ids must be integers in [0, 2**40)")
    ids = column.gather(order).to_list()
    return tuple(trace_block_content(row_ids, p) for row_ids, p in zip(ids, prompt[order].tolist(), strict=True))


def _session_ids(column: pl.Series, trace: TraceFile) -> pl.Series:
    _check_no_nulls(column, trace)
    if isinstance(column.dtype, (pl.Categorical, pl.Enum)):
        return column.cast(pl.String)
    if column.dtype != pl.String and not column.dtype.is_integer():
        raise InputError(f"{trace.path}: column {column.name} has type {column.dtype}; expected session ids "
                         "(text or integers)")
    return column


def _check_no_nulls(column: pl.Series, trace: TraceFile) -> None:
    row = first(column.is_null().to_numpy())
    if row is not None:
        raise InputError(f"{trace.path}: column {column.name} has no value in {trace.where(row)}")


def _seconds_since_first(column: pl.Series, in_milliseconds: bool, trace: TraceFile) -> npt.NDArray[np.float64]:
    _check_no_nulls(column, trace)
    dtype = column.dtype
    if dtype.is_numeric():
        values = np.asarray(column.cast(pl.Float64).to_numpy(), dtype=np.float64)
        row = first(~np.isfinite(values))
        if row is not None:
            raise InputError(f"{trace.path}: column {column.name} has {values[row]} in {trace.where(row)}")
        if in_milliseconds:
            values = values / 1000.0
        return values - float(values.min())
    if dtype == pl.String:
        column = _parse_datetimes(column, trace)
    elif dtype == pl.Date:
        column = column.cast(pl.Datetime("ns"))
    elif not isinstance(dtype, pl.Datetime):
        raise InputError(f"{trace.path}: column {column.name} has type {dtype}; expected seconds or datetimes")
    nanoseconds = np.asarray(column.dt.epoch("ns").to_numpy(), dtype=np.int64)
    return (nanoseconds - int(nanoseconds.min())).astype(np.float64) / 1e9


def _parse_datetimes(column: pl.Series, trace: TraceFile) -> pl.Series:
    """Datetime strings; the first that is not one is refused, unless most of the column are
    numbers (a column of seconds with a bad cell), when the first that is not a number is."""
    try:
        parsed = column.str.to_datetime(time_unit="ns", strict=False)
    except pl.exceptions.PolarsError:
        # Polars infers the format from the first values; this fails when they are not datetimes.
        parsed = pl.Series(column.name, [None] * len(column), dtype=pl.Datetime("ns"))
    unparsed = parsed.is_null().to_numpy()
    if not unparsed.any():
        return parsed
    seconds = np.isfinite(column.cast(pl.Float64, strict=False).to_numpy())
    if seconds.sum() > (~unparsed).sum():
        row = first(~seconds)
        if row is None:
            raise InputError(f"{trace.path}: column {column.name} holds numbers as text; expected numbers of "
                             "seconds or datetimes")
        raise InputError(f"{trace.path}: column {column.name} has {clip(repr(column[row]))} in {trace.where(row)}; "
                         "expected seconds")
    row = first(unparsed)
    assert row is not None
    raise InputError(f"{trace.path}: cannot parse timestamp {clip(repr(column[row]))} in column {column.name}, "
                     f"{trace.where(row)}")


def _token_counts(column: pl.Series, trace: TraceFile) -> npt.NDArray[np.int64]:
    """Integers in [1, MAX_TOKENS] (floats with integer values too, as pandas writes a column with gaps)."""
    _check_no_nulls(column, trace)
    where = f"{trace.path}: column {column.name} has"
    if column.dtype == pl.String:
        row = first(~np.isfinite(column.cast(pl.Float64, strict=False).to_numpy()))
        shown = f"{clip(repr(column[row]))} in {trace.where(row)}" if row is not None else "numbers as text"
        raise InputError(f"{where} {shown}; expected integer token counts")
    if not column.dtype.is_numeric():
        raise InputError(f"{where} type {column.dtype}; expected integer token counts")
    values = column.cast(pl.Float64).to_numpy()
    if not column.dtype.is_integer():
        row = first(~np.isfinite(values) | (values != np.round(values)))
        if row is not None:
            raise InputError(f"{where} non-integer token count {values[row]} in {trace.where(row)}")
    row = first(values < 1)
    if row is not None:
        raise InputError(f"{where} token count {column[row]} in {trace.where(row)}; must be >= 1")
    row = first(values > MAX_TOKENS)
    if row is not None:
        raise InputError(f"{where} token count {column[row]} in {trace.where(row)}; must be at most 2**31, "
                         "past any model's context")
    return values.astype(np.int64)
