"""Traces read as untrusted input, their records named as a person finds them in an editor: the
1-based line of a CSV (the header is line 1) or JSONL file, where a JSON array's record begins, the
1-based row of a Parquet file; one line naming the file, the record and at most ~80 characters of
the value; and each request of the workload names its place (`Workload.describe`)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_readers import refused

from simulator.errors import InputError
from workloads import read_trace

TRACE = {"arrival": [3.0, 1.0, 2.0, 0.5], "prompt_tokens": [10, 20, 30, 40], "output_tokens": [1, 2, 3, 4]}


def jsonl(path: Path, records: list[dict[str, object]], between: str = "") -> Path:
    path.write_text("".join(json.dumps(record) + "\n" + between for record in records))
    return path


def records(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def test_a_broken_jsonl_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(r) for r in records(TRACE)]
    lines[2] = lines[2][:-1]  # the closing brace lost
    path.write_text("\n".join(lines) + "\n")
    with refused("t.jsonl line 3: not JSON"):
        read_trace(path)


def test_blank_lines_count_as_lines(tmp_path: Path) -> None:
    """polars skips blank JSONL lines and reads a blank CSV line as a record of nulls; both are
    named by the line an editor shows."""
    bad = records(TRACE)
    bad[2]["prompt_tokens"] = 0
    with refused("t.jsonl", "token count 0 in line 5"):
        read_trace(jsonl(tmp_path / "t.jsonl", bad, between="\n"))
    path = tmp_path / "t.csv"
    path.write_text("arrival,prompt_tokens,output_tokens\n0,1,1\n\n1,1,1\n")
    with refused("t.csv", "arrival has no value in line 3"):
        read_trace(path)


def test_a_quoted_line_break_moves_the_lines_after_it(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text('arrival,note,prompt_tokens,output_tokens\n0,"two\nlines",5,5\n1,x,-3,5\n')
    with refused("t.csv", "token count -3 in line 4"):
        read_trace(path)


def test_mooncake_hash_ids_of_the_wrong_type_name_the_line(tmp_path: Path) -> None:
    """A hash_ids of 5 among lists was polars' "failed to determine supertype of struct[4] and struct[4]"."""
    rows = [{"timestamp": t, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]} for t in range(4)]
    rows[2]["hash_ids"] = 5
    with refused("m.jsonl line 3: hash_ids is 5 (a number); expected a list of numbers or an empty list"):
        read_trace(jsonl(tmp_path / "m.jsonl", rows))


@pytest.mark.parametrize(("value", "named"), [
    ("abc", 'line 3: prompt_tokens is "abc" (a string); expected a number'),
    (True, "line 3: prompt_tokens is true (true or false); expected a number"),
    ({"n": 1}, 'line 3: prompt_tokens is {"n": 1} (an object); expected a number'),
    ([5], "line 3: prompt_tokens is [5] (a list of numbers); expected a number"),
    ("x" * 5000, 'line 3: prompt_tokens is "xxxx'),
])
def test_a_jsonl_value_of_the_wrong_type_names_its_line(value: object, named: str, tmp_path: Path) -> None:
    rows = records(TRACE)
    rows[2]["prompt_tokens"] = value
    with pytest.raises(InputError) as error:
        read_trace(jsonl(tmp_path / "t.jsonl", rows))
    assert named in str(error.value) and len(str(error.value)) < len(str(tmp_path)) + 200


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "1e400"])
def test_json_numbers_past_a_float_name_their_line(constant: str, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_tokens": 1, "output_tokens": 1}\n'
                    f'{{"arrival": {constant}, "prompt_tokens": 1, "output_tokens": 1}}\n')
    with refused("t.jsonl line 2: not JSON"):
        read_trace(path)


def test_a_json_array_names_the_line_its_record_begins_on(tmp_path: Path) -> None:
    rows = records(TRACE)
    rows[3]["output_tokens"] = 2.5
    path = tmp_path / "t.json"
    path.write_text(json.dumps(rows, indent=2))  # five lines a record, after the "[" line
    with refused("t.json", "non-integer token count 2.5 in line 17"):
        read_trace(path)


def test_a_line_that_is_not_a_record(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_tokens": 1, "output_tokens": 1}\n[1, 2]\n')
    with refused("t.jsonl line 2: [1, 2] is not a JSON object"):
        read_trace(path)


def test_text_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"arrival,prompt_tokens,output_tokens\n0,1,1\n1,\xff\xfe,1\n")
    with refused("t.csv line 3: not UTF-8 text"):
        read_trace(path)


def test_a_bad_cell_in_a_column_of_seconds_is_the_one_blamed(tmp_path: Path) -> None:
    """A column of numbers with one word in it is seconds with a bad cell, not datetimes that all fail."""
    path = tmp_path / "t.csv"
    path.write_text("arrival,prompt_tokens,output_tokens\n0,1,1\n1,1,1\n2,1,1\nsoon,1,1\n")
    with refused("t.csv", "'soon' in line 5; expected seconds"):
        read_trace(path)


@pytest.mark.parametrize("header", ["arrival,arrival,prompt_tokens,output_tokens",
                                    "arrival,prompt_tokens,Prompt_Tokens,output_tokens"])
def test_a_column_given_twice_is_refused(header: str, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\n0,1,1,1\n")
    with refused("t.csv", "is given twice"):
        read_trace(path)


@pytest.mark.parametrize(("cell", "named"), [
    (str(2**40), "token count 1099511627776 in line 3; must be at most 2**31"),
    (str(2**64), "token count 18446744073709551616 in line 3; must be at most 2**31"),
    ("\u00e9" * 10_000, "'\u00e9\u00e9\u00e9"),
])
def test_huge_and_unicode_token_cells(cell: str, named: str, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"arrival,prompt_tokens,output_tokens\n0,1,1\n1,{cell},1\n", encoding="utf-8")
    with pytest.raises(InputError) as error:
        read_trace(path)
    assert named in str(error.value) and len(str(error.value)) < len(str(path)) + 200


def test_nanoseconds_read_as_seconds_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival,prompt_tokens,output_tokens\n1700000000000000000,1,1\n1700000001000000000,1,1\n")
    with refused("t.csv", "the request in line 3 arrives 1e+09 s after the first", "past ten years"):
        read_trace(path)


def test_session_ids_of_an_unhashable_type_are_refused(tmp_path: Path) -> None:
    rows = [{"arrival": i, "prompt_tokens": 5, "output_tokens": 1, "session_id": [i]} for i in range(3)]
    with refused("t.jsonl", "session_id has type List(Int64); expected session ids"):
        read_trace(jsonl(tmp_path / "t.jsonl", rows))


def test_each_request_names_its_line(tmp_path: Path) -> None:
    """Sorted by arrival, request 0 is the last record (line 5 of the CSV): messages about a request
    (an over-long one, say) can name where it is."""
    path = tmp_path / "t.csv"
    path.write_text("arrival,prompt_tokens,output_tokens\n" + "".join(
        f"{a},{p},{o}\n" for a, p, o in zip(*TRACE.values(), strict=True)))
    trace = read_trace(path)
    assert trace.prompt_tokens.tolist() == [40, 20, 30, 10]
    assert trace.describe(0) == f"request 0 ({path} line 5)"
    assert trace.describe(3) == f"request 3 ({path} line 2)"
    parquet = tmp_path / "t.parquet"
    pl.DataFrame(TRACE).write_parquet(parquet)
    assert read_trace(parquet).describe(1) == f"request 1 ({parquet} row 2)"
    assert read_trace(jsonl(tmp_path / "t.jsonl", records(TRACE), between="\n")).describe(0).endswith("line 7)")


BAD_CELLS: dict[str, list[object]] = {
    # What one cell of each column is changed to, and is then blamed for.
    "arrival": ["", "soon", math.nan, math.inf, "2024-13-45", "\u00e9" * 300],
    "prompt_tokens": ["", 0, -1, 2.5, "abc", 2**40, math.nan, "1e400", "\U0001f600", "x" * 5000],
    "output_tokens": ["", 0, -7, 0.5, "many", 2**35],
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 12), data=st.data(), suffix=st.sampled_from([".csv", ".jsonl", ".parquet"]))
def test_the_changed_record_is_the_one_blamed(rows: int, data: st.DataObject, suffix: str, tmp_path: Path) -> None:
    """A valid trace with one cell changed to a bad value is refused in one line naming the file and
    the changed record's line (row, for Parquet)."""
    column = data.draw(st.sampled_from(sorted(BAD_CELLS)))
    value = data.draw(st.sampled_from(BAD_CELLS[column]))
    changed = data.draw(st.integers(0, rows - 1))
    table: dict[str, list[object]] = {"arrival": [float(i) for i in range(rows)], "prompt_tokens": [5] * rows,
                                      "output_tokens": [3] * rows}
    if suffix == ".parquet":
        value = None if value == "" else value
        if isinstance(value, str) or (isinstance(value, int) and value > 2**62):
            return  # a Parquet column has one type: a word among numbers cannot be written
    table[column][changed] = value
    path = tmp_path / f"t{rows}{column}{changed}{suffix}"
    if suffix == ".csv":
        path.write_text("arrival,prompt_tokens,output_tokens\n" + "".join(
            ",".join(str(table[c][i]) for c in table) + "\n" for i in range(rows)))
        where = f"line {changed + 2}"
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps({c: (None if table[c][i] == "" else table[c][i]) for c in table}) + "\n"
                                for i in range(rows)))
        where = f"line {changed + 1}"
    else:
        pl.DataFrame(table, strict=False).write_parquet(path)
        where = f"row {changed + 1}"
    with pytest.raises(InputError) as error:
        read_trace(path)
    message = str(error.value)
    assert str(path) in message and "\n" not in message and len(message) < len(str(path)) + 220
    assert re.search(rf"\b{where}\b", message), (table, message)
