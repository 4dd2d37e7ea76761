"""Read recorded request traces (CSV, JSONL/JSON, Parquet) into a `Workload`, as recorded.

Recognised columns (names matched case-insensitively, the first candidate present wins):
- arrival time: `arrival` (seconds) or `timestamp` (datetimes, datetime strings, or numbers in
  seconds). Mooncake traces, recognised by their `hash_ids` column, give `timestamp` in
  milliseconds.
- prompt length: `prompt_tokens`, `input_length`, `input_tokens` or `ContextTokens`.
- output length: `output_tokens`, `output_length` or `GeneratedTokens`.
- prefix identity (for the prefix cache, `workloads.prefixes`): Mooncake's `hash_ids`, one id per
  512-token prompt block (equal ids = equal prefix; the last block holds the rest of the prompt, so
  a row has exactly ceil(prompt / 512) ids, each an integer in [0, 2**40)); or else a session column,
  `session_id`, `session` or `conversation_id`: each turn's prompt starts with as much of its
  session's previous turn (prompt, then answer) as it is long.
Other columns are ignored. This covers the Azure LLM inference trace 2023 (TIMESTAMP,
ContextTokens, GeneratedTokens) and Mooncake's JSONL traces as published.

Requests are sorted by arrival (stably, so ties keep file order), shifted so the first arrives at
0 and divided by `speed`. Row numbers in error messages count records from 1 in file order (a
CSV header is not a record).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from simulator.errors import InputError
from workloads.prefixes import TRACE_BLOCK_TOKENS, Content, session_content, trace_block_content
from workloads.workload import Workload

ARRIVAL_COLUMNS = ("arrival", "timestamp")
PROMPT_COLUMNS = ("prompt_tokens", "input_length", "input_tokens", "ContextTokens")
OUTPUT_COLUMNS = ("output_tokens", "output_length", "GeneratedTokens")
MOONCAKE_MARKER = "hash_ids"
SESSION_COLUMNS = ("session_id", "session", "conversation_id")
MAX_HASH_ID = 1 << 40


def read_trace(path: str | Path, speed: float = 1.0, limit: int | None = None) -> Workload:
    """Read a trace; `speed` 2 replays it twice as fast, `limit` keeps the first N requests."""
    path = Path(path)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0 < speed < math.inf:
        raise InputError(f"trace speed must be a finite number > 0, got {speed!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"trace limit must be an integer >= 1, got {limit!r}")
    frame = _read_frame(path)
    if frame.height == 0:
        raise InputError(f"{path}: trace has no requests")

    arrival_column = _find_column(frame, ARRIVAL_COLUMNS, "arrival time", path)
    in_milliseconds = arrival_column.lower() == "timestamp" and MOONCAKE_MARKER in frame.columns
    arrival = _seconds_since_first(frame[arrival_column], in_milliseconds, path)
    prompt = _token_counts(frame[_find_column(frame, PROMPT_COLUMNS, "prompt length", path)], path)
    output = _token_counts(frame[_find_column(frame, OUTPUT_COLUMNS, "output length", path)], path)

    order = np.argsort(arrival, kind="stable")[:limit]
    content = None
    if MOONCAKE_MARKER in frame.columns:
        content = _hash_id_content(frame[MOONCAKE_MARKER], prompt, order, path)
    elif any(name.lower() in SESSION_COLUMNS for name in frame.columns):
        sessions = frame[_find_column(frame, SESSION_COLUMNS, "session", path)]
        _check_no_nulls(sessions, path)
        content = session_content(sessions.gather(order).to_list(), prompt[order].tolist(), output[order].tolist())
    return Workload(
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        arrival=arrival[order] / speed,
        concurrency=None,
        content=content,
    )


def _hash_id_content(column: pl.Series, prompt: npt.NDArray[np.int64], order: npt.NDArray[np.intp],
                     path: Path) -> tuple[Content, ...]:
    """Mooncake's hash ids, checked: a list of integers in [0, 2**40) per row, one per 512 prompt tokens."""
    _check_no_nulls(column, path)
    if not isinstance(column.dtype, pl.List) or not column.dtype.inner.is_integer():
        raise InputError(f"{path}: column {column.name} has type {column.dtype}; expected lists of integer block ids")
    counts = column.list.len().to_numpy()
    expected = -(-prompt // TRACE_BLOCK_TOKENS)
    row = _first(counts != expected)
    if row is not None:
        raise InputError(f"{path}: column {column.name} has {counts[row]} ids in row {row + 1}, where "
                         f"{prompt[row]} prompt tokens make {expected[row]} blocks of {TRACE_BLOCK_TOKENS}")
    flat = column.explode().cast(pl.Float64).to_numpy()  # a null id becomes NaN
    bad = _first(~np.isfinite(flat) | (flat < 0) | (flat >= MAX_HASH_ID))
    if bad is not None:
        row = int(np.searchsorted(np.cumsum(counts), bad, side="right"))
        raise InputError(f"{path}: column {column.name} has id {flat[bad]} in row {row + 1}; "
                         f"ids must be integers in [0, 2**40)")
    ids = column.gather(order).to_list()
    return tuple(trace_block_content(row_ids, p) for row_ids, p in zip(ids, prompt[order].tolist(), strict=True))


def _read_json(path: Path) -> pl.DataFrame:
    # A .json file may hold one array of records or one record per line.
    with path.open("rb") as file:
        head = file.read(4096).lstrip()
    if head.startswith(b"["):
        return pl.read_json(path, infer_schema_length=None)
    return pl.read_ndjson(path, infer_schema_length=None)


READERS: dict[str, Callable[[Path], pl.DataFrame]] = {
    ".csv": lambda path: pl.read_csv(path, infer_schema_length=None),
    ".jsonl": lambda path: pl.read_ndjson(path, infer_schema_length=None),
    ".json": _read_json,
    ".parquet": pl.read_parquet,
}


def _read_frame(path: Path) -> pl.DataFrame:
    if not path.exists():
        raise InputError(f"trace file not found: {path}")
    if not path.is_file():
        raise InputError(f"trace path is not a file: {path}")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise InputError(
            f"{path}: unknown trace format {path.suffix!r}; expected one of {', '.join(READERS)}"
        )
    if path.stat().st_size == 0:
        raise InputError(f"{path}: file is empty")
    try:
        return reader(path)
    except (pl.exceptions.PolarsError, OSError, ValueError) as error:
        raise InputError(f"{path}: cannot read as {path.suffix}: {_first_line(error)}") from None


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _find_column(frame: pl.DataFrame, candidates: tuple[str, ...], what: str, path: Path) -> str:
    by_lower = {name.lower(): name for name in reversed(frame.columns)}
    for candidate in candidates:
        if candidate in frame.columns:
            return candidate
        if candidate.lower() in by_lower:
            return by_lower[candidate.lower()]
    raise InputError(
        f"{path}: no {what} column; looked for {', '.join(candidates)}, "
        f"found {', '.join(frame.columns)}"
    )


def _first(mask: npt.NDArray[np.bool_]) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _check_no_nulls(column: pl.Series, path: Path) -> None:
    row = _first(column.is_null().to_numpy())
    if row is not None:
        raise InputError(f"{path}: column {column.name} has no value in row {row + 1}")


def _seconds_since_first(
    column: pl.Series, in_milliseconds: bool, path: Path
) -> npt.NDArray[np.float64]:
    _check_no_nulls(column, path)
    dtype = column.dtype
    if dtype.is_numeric():
        values = np.asarray(column.cast(pl.Float64).to_numpy(), dtype=np.float64)
        row = _first(~np.isfinite(values))
        if row is not None:
            raise InputError(f"{path}: column {column.name} has {values[row]} in row {row + 1}")
        if in_milliseconds:
            values = values / 1000.0
        return values - float(values.min())
    if dtype == pl.String:
        column = _parse_datetimes(column, path)
    elif dtype == pl.Date:
        column = column.cast(pl.Datetime("ns"))
    elif not isinstance(dtype, pl.Datetime):
        raise InputError(
            f"{path}: column {column.name} has type {dtype}; expected seconds or datetimes"
        )
    nanoseconds = np.asarray(column.dt.epoch("ns").to_numpy(), dtype=np.int64)
    return (nanoseconds - int(nanoseconds.min())).astype(np.float64) / 1e9


def _parse_datetimes(column: pl.Series, path: Path) -> pl.Series:
    try:
        parsed = column.str.to_datetime(time_unit="ns", strict=False)
    except pl.exceptions.PolarsError:
        # Polars infers the format from the first values; this fails when they are not datetimes.
        parsed = pl.Series(column.name, [None] * len(column), dtype=pl.Datetime("ns"))
    row = _first(parsed.is_null().to_numpy())
    if row is not None:
        raise InputError(
            f"{path}: cannot parse timestamp {column[row]!r} in column {column.name}, row {row + 1}"
        )
    return parsed


def _token_counts(column: pl.Series, path: Path) -> npt.NDArray[np.int64]:
    _check_no_nulls(column, path)
    if column.dtype == pl.String:
        row = _first(column.cast(pl.Float64, strict=False).is_null().to_numpy())
        shown = f"{column[row]!r} in row {row + 1}" if row is not None else "numbers as text"
        raise InputError(f"{path}: column {column.name} has {shown}; expected integer token counts")
    if not column.dtype.is_numeric():
        raise InputError(
            f"{path}: column {column.name} has type {column.dtype}; expected integer token counts"
        )
    values = column.to_numpy()
    if not column.dtype.is_integer():
        values = column.cast(pl.Float64).to_numpy()
        row = _first(
            ~np.isfinite(values) | (values != np.round(values)) | (np.abs(values) >= 2.0**62)
        )
        if row is not None:
            raise InputError(
                f"{path}: column {column.name} has non-integer token count {values[row]} "
                f"in row {row + 1}"
            )
    row = _first(values < 1)
    if row is not None:
        raise InputError(
            f"{path}: column {column.name} has token count {values[row]} in row {row + 1}; "
            f"must be >= 1"
        )
    return values.astype(np.int64)
