"""Where results go: unwritable places refused up front in one line, folders readable by others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_cli import simulate_cli

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
