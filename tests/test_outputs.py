"""Where results go: unwritable places refused up front in one line, folders readable by others."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import simulate_cli

from simulator.metrics.tables import Columns
from simulator.outputs.run_folder import write_parquet

SMALL = ["--num-requests", "20", "--input-len", "200", "--output-len", "10"]


@pytest.mark.parametrize(("args", "named"), [
    (["run", *SMALL, "--out", "/proc/x"], "--out '/proc/x'"),
    (["run", *SMALL, "--out", "/proc/x/y"], "--out '/proc/x/y'"),
    (["sweep", "--rate", "4", *SMALL, "--out", "/proc/x.parquet"], "--out '/proc/x.parquet'"),
    (["sweep", "--rate", "4", *SMALL, "--tables", "/proc/t", "--out", "{tmp}/s.parquet"], "--tables '/proc/t'"),
    (["batch-table", "--out", "/proc/x.parquet"], "--out '/proc/x.parquet'"),
    (["batch-table", "--plot", "/proc/x.html"], "--plot '/proc/x.html'"),
    (["run", *SMALL, "--out", "{tmp}/file/run"], "'{tmp}/file' is not a folder"),
])
def test_an_unwritable_out_is_one_line_and_exit_2(args: list[str], named: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("a file, not a folder")
    code, stdout, err = simulate_cli([a.format(tmp=tmp_path) for a in args], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named.format(tmp=tmp_path) in err, err
    assert err.startswith("error: cannot write") and stdout == ""  # refused before any work was printed
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_result_folders_are_made_as_mkdir_makes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    previous = os.umask(0o022)
    try:
        code, _, err = simulate_cli(["run", *SMALL, "--out", str(tmp_path / "run")], capsys)
    finally:
        os.umask(previous)
    assert code == 0, err
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755
    assert {(p.stat().st_mode & 0o777) for p in (tmp_path / "run").iterdir()} == {0o644}


def test_batch_table_writes_into_a_folder_yet_to_be_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, page = tmp_path / "new" / "table.parquet", tmp_path / "other" / "table.html"
    code, _, err = simulate_cli(["batch-table", "--batch", "1,8", "--out", str(out), "--plot", str(page)], capsys)
    assert code == 0, err
    assert out.is_file() and page.is_file()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.floats(allow_infinity=False) | st.just(math.nan), st.booleans()),
                max_size=30))
def test_numpy_columns_write_the_file_polars_writes(rows: list[tuple[int, float, bool]]) -> None:
    """A run's tables stay numpy columns (NaN for null in a nullable column) and are written without
    polars: the frame they stand for, and the Parquet bytes, equal those of polars' own frame."""
    ints = np.array([r[0] for r in rows], dtype=np.int64)
    floats = np.array([r[1] for r in rows], dtype=np.float64)
    flags = np.array([r[2] for r in rows], dtype=bool)
    columns = Columns({"n": ints, "x": floats, "y": floats.copy(), "ok": flags}, nullable=frozenset({"x"}))
    polars_frame = pl.DataFrame({"n": ints, "x": floats, "y": floats, "ok": flags}).with_columns(
        pl.col("x").fill_nan(None))
    assert columns.frame().equals(polars_frame, null_equal=True)
    assert columns.frame()["x"].null_count() == int(np.isnan(floats).sum())
    back = Columns.of_frame(polars_frame)
    assert np.array_equal(back["x"], floats, equal_nan=True) and back.nullable == ({"x"} if np.isnan(floats).any()
                                                                                     else set())
    with tempfile.TemporaryDirectory() as folder:
        write_parquet(columns, Path(folder) / "a.parquet", {"run": 1})
        write_parquet(polars_frame, Path(folder) / "b.parquet", {"run": 1})
        assert (Path(folder) / "a.parquet").read_bytes() == (Path(folder) / "b.parquet").read_bytes()
