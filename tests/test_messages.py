"""Error lines that point the way: each names the value at fault and what would work instead."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import AZURE, MOONCAKE, needs_azure, needs_mooncake

from simulator.cli.main import run

SHIPPED = Path(__file__).resolve().parents[1] / "calibration" / "profiles" / "h100_sxm"


def error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    codes: list[int] = []
    run(args, exit=codes.append)
    _, err = capsys.readouterr()
    assert codes == [2] and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_a_gpu_folder_without_a_profile_is_not_called_missing(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    err = error_line(["--gpu", str(tmp_path), "--out", str(tmp_path / "run")], capsys)
    assert "no roofline.json" in err and "no such" not in err


def test_validate_on_a_roofline_only_profile_does_not_suggest_a_flag_it_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(SHIPPED / "roofline.json", tmp_path / "roofline.json")
    err = error_line(["validate", "--gpu", str(tmp_path)], capsys)
    assert "profile.json" in err and "--cost" not in err


def test_a_block_larger_than_the_free_memory_names_the_block_size(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    err = error_line(["--block-size", "10000000", "--out", str(tmp_path / "run")], capsys)
    # One block of 10M tokens of Llama-3.1-8B KV (128 KiB a token) is 1,310.7 GB; the H100 has ~60 GB left.
    assert "--block-size 10000000" in err and "1310.7 GB" in err


def test_a_prompt_over_the_token_budget_suggests_chunked_prefill(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = error_line(["--input-len", "9000", "--out", str(tmp_path / "run")], capsys)
    assert "9000-token prompt" in err and "--policy chunked" in err


@needs_azure
@needs_mooncake
@pytest.mark.parametrize("trace", [AZURE, MOONCAKE])
def test_the_shipped_traces_on_the_default_policy_suggest_chunked_prefill(
        trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = error_line(["--trace", str(trace), "--out", str(tmp_path / "run")], capsys)
    assert "--policy chunked" in err
    assert not (tmp_path / "run").exists()


def test_calibrate_refuses_a_folder_that_holds_something(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    err = error_line(["calibrate", "--model", "tiny", "--device", "cpu", "--out", str(tmp_path)], capsys)
    assert "already exists" in err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
