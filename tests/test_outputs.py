"""Where results go: folders readable by others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_cli import simulate_cli

SMALL = ["--num-requests", "20", "--input-len", "200", "--output-len", "10"]


def test_result_folders_are_made_as_mkdir_makes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    previous = os.umask(0o022)
    try:
        code, _, err = simulate_cli(["run", *SMALL, "--out", str(tmp_path / "run")], capsys)
    finally:
        os.umask(previous)
    assert code == 0, err
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755
    assert {(p.stat().st_mode & 0o777) for p in (tmp_path / "run").iterdir()} == {0o644}
