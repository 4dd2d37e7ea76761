"""A trace file read into a polars frame, and where each of its records sits in the file.

Records are numbered as a person finds them in an editor: the 1-based line of a CSV (the header is
line 1) or JSONL file, and of where each element of a JSON array begins; the 1-based row of a
Parquet file. A file polars cannot read, or whose columns come out of a type no value of the role
has (JSON numbers in one line and text in the next), is read once more record by record to name the
first bad one. The lines are found only then, or when a message names a record: reading a valid
trace costs nothing more than polars' read.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from simulator.errors import InputError, clip

ARRIVAL_COLUMNS = ("arrival", "timestamp")
PROMPT_COLUMNS = ("prompt_tokens", "input_length", "input_tokens", "ContextTokens")
OUTPUT_COLUMNS = ("output_tokens", "output_length", "GeneratedTokens")
MOONCAKE_MARKER = "hash_ids"
SESSION_COLUMNS = ("session_id", "session", "conversation_id")
NUMBER, TEXT, NUMBERS, EMPTY = "a number", "a string", "a list of numbers", "an empty list"
ROLES: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "arrival time": (ARRIVAL_COLUMNS, frozenset({NUMBER, TEXT})),
    "prompt length": (PROMPT_COLUMNS, frozenset({NUMBER})),
    "output length": (OUTPUT_COLUMNS, frozenset({NUMBER})),
    "prefix block ids": ((MOONCAKE_MARKER,), frozenset({NUMBERS, EMPTY})),
    "session": (SESSION_COLUMNS, frozenset({NUMBER, TEXT})),
}
"""What servesim reads, each role's column names (the first present wins) and the JSON values it takes."""
FORMATS = (".csv", ".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class TraceFile:
    """A trace file: its path and format, and how records are named in it."""

    path: Path
    suffix: str

    def where(self, record: int) -> str:
        """Record `record` (0-based, in file order) as "line N" or "row N"."""
        if self.suffix == ".parquet":
            return f"row {record + 1}"
        if self.suffix == ".csv":
            return f"line {_csv_line(self.path, record)}"
        for index, (line, _) in enumerate(self.records()):
            if index == record:
                return f"line {line}"
        raise AssertionError(f"{self.path} has no record {record}")

    def records(self) -> Iterator[tuple[int, str]]:
        """A JSON file's records as (the line each begins on, its text): JSONL's non-blank lines
        (polars skips blank ones) or a JSON array's elements."""
        text = _text(self.path)
        if self.suffix == ".json" and text.lstrip().startswith("["):
            yield from _array_elements(text)
            return
        for number, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                yield number, line


def _text(path: Path) -> str:
    """The file as text, refused naming the line of its first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path} line {line}: not UTF-8 text ({clip(repr(data[exc.start:exc.end + 8]))})") from None


def _csv_line(path: Path, record: int) -> int:
    """The line CSV record `record` (0-based, the header not counted) begins on: a quoted cell may
    hold line breaks, and a blank line is a record of nulls to polars as to the csv module."""
    with path.open(newline="", encoding="utf-8", errors="replace") as file:
        reader = csv.reader(file)
        begun = 1
        for index, _ in enumerate(reader, start=-1):
            if index == record:
                return begun
            begun = reader.line_num + 1
    raise AssertionError(f"{path} has no record {record}")


SEPARATORS = re.compile(r"[ \t\r\n,]*")


def _array_elements(text: str) -> Iterator[tuple[int, str]]:
    """A JSON array's elements as (the line each begins on, its text); the rest of the file from
    the first element that does not parse."""
    decoder = json.JSONDecoder()
    at = line_at = text.index("[") + 1
    line = text.count("\n", 0, at) + 1
    while True:
        skipped = SEPARATORS.match(text, at)
        assert skipped is not None  # it matches the empty string
        at = skipped.end()
        if at >= len(text) or text[at] == "]":
            return
        line += text.count("\n", line_at, at)
        line_at = at
        try:
            _, end = decoder.raw_decode(text, at)
        except (json.JSONDecodeError, RecursionError):
            yield line, text[at:]
            return
        yield line, text[at:end]
        at = end


def read_frame(path: Path) -> tuple[pl.DataFrame, TraceFile]:
    """The file's records as polars reads them, its columns' types checked against their roles."""
    if not path.exists():
        raise InputError(f"trace file not found: {path}")
    if not path.is_file():
        raise InputError(f"trace path is not a file: {path}")
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"{path}: unknown trace format {clip(repr(path.suffix))}; "
                         f"expected one of {', '.join(FORMATS)}")
    try:
        with path.open("rb") as file:
            head = file.read(4096)
    except OSError as exc:
        raise InputError(f"cannot read trace {path}: {exc.strerror}") from None
    if not head:
        raise InputError(f"{path}: file is empty")
    trace = TraceFile(path, suffix)
    try:
        if suffix == ".csv":
            frame = pl.read_csv(path, infer_schema_length=None)
        elif suffix == ".parquet":
            frame = pl.read_parquet(path)
        elif suffix == ".json" and head.lstrip().startswith(b"["):
            frame = pl.read_json(path, infer_schema_length=None)
        else:
            frame = pl.read_ndjson(path, infer_schema_length=None)
    except (pl.exceptions.PolarsError, OSError, ValueError) as error:
        _diagnose(trace)
        raise InputError(f"{path}: cannot read as {suffix}: {clip(_first_line(error))}") from None
    if suffix in (".json", ".jsonl") and not _types_as_expected(frame, path):
        _diagnose(trace)
    return frame, trace


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def find_column(columns: list[str], role: str, path: Path) -> str | None:
    """The column of `role`: the first of its names present, matched case-insensitively; a name
    given twice (in two cases, or twice alike, which polars reads as NAME_duplicated_0) is refused,
    as no one could say which was meant."""
    for candidate in ROLES[role][0]:
        matches = [name for name in columns if re.fullmatch(rf"{re.escape(candidate)}(_duplicated_\d+)?", name,
                                                               flags=re.IGNORECASE)]
        if len(matches) > 1:
            named = ", ".join(clip(repr(re.sub(r"_duplicated_\d+$", "", m))) for m in matches)
            raise InputError(f"{path}: the {role} is given twice (columns {named})")
        if matches:
            return matches[0]
    return None


def _types_as_expected(frame: pl.DataFrame, path: Path) -> bool:
    """Whether the token columns came out of types their values can have (polars reads a JSON
    column of numbers and one string as strings)."""
    for role in ("prompt length", "output length", "prefix block ids"):
        name = find_column(frame.columns, role, path)
        if name is None:
            continue
        dtype = frame[name].dtype
        if role == "prefix block ids":
            if not isinstance(dtype, pl.List):
                return dtype == pl.Null
            if not (dtype.inner.is_numeric() or dtype.inner == pl.Null):
                return False
        elif not (dtype.is_numeric() or dtype == pl.Null):
            return False
    return True


def _diagnose(trace: TraceFile) -> None:
    """Read the file record by record and refuse the first that is broken, or whose value of a
    column has a type the column cannot take; return if none is."""
    if trace.suffix == ".csv":
        _diagnose_csv(trace.path)
    elif trace.suffix in (".json", ".jsonl"):
        _diagnose_json(trace)


def _diagnose_csv(path: Path) -> None:
    _text(path)
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.reader(file)
        header = next(reader, [])
        begun = reader.line_num + 1
        for row in reader:
            if row and len(row) != len(header):
                raise InputError(f"{path} line {begun}: {len(row)} fields where the header has {len(header)}")
            begun = reader.line_num + 1


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{clip(text)} is past the largest JSON number a float holds")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def kind(value: Any) -> str | None:
    """A JSON value's type in words (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return NUMBER
    if isinstance(value, str):
        return TEXT
    if isinstance(value, list):
        inner = {kind(item) for item in value}
        return EMPTY if not value else NUMBERS if inner == {NUMBER} else "a list of other than numbers"
    return "an object"


def _diagnose_json(trace: TraceFile) -> None:
    records: list[tuple[int, dict[str, Any]]] = []
    for line, text in trace.records():
        try:
            record = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{trace.path} line {line}: not JSON ({clip(str(exc))})") from None
        if not isinstance(record, dict):
            raise InputError(f"{trace.path} line {line}: {clip(json.dumps(record))} is not a JSON object")
        records.append((line, record))
    columns = list(dict.fromkeys(key for _, record in records for key in record))
    expected = {name: kinds for role, (_, kinds) in ROLES.items()
                if (name := find_column(columns, role, trace.path)) is not None}
    for name in columns:
        if name not in expected:  # a column servesim ignores, but polars reads: its most common type
            counts = Counter(kind(record.get(name)) for _, record in records)
            counts.pop(None, None)
            expected[name] = frozenset(str(found) for found, _ in counts.most_common(1))
    for line, record in records:
        for name, value in record.items():
            found = kind(value)
            if found is not None and expected[name] and found not in expected[name]:
                raise InputError(f"{trace.path} line {line}: {clip(name)} is {clip(json.dumps(value))} ({found}); "
                                 f"expected {' or '.join(sorted(expected[name]))}")


def first(mask: npt.NDArray[np.bool_]) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None
