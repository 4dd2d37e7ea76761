"""Faults of the file system, each one line on stderr and a non-zero exit, never a traceback: outputs
checked before the run (a folder where a file goes, a result file outside its folder, a folder that
takes no files), written whole or not at all (a disk full mid-write leaves nothing), with the mode of
every output, and stdout that cannot be written (a full device; a closed pipe ends quietly)."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from simulator.cli.main import run

SMALL_RUN = ["--rate", "20", "--num-requests", "10", "--input-len", "64", "--output-len", "4", "--no-tokens",
             "--quiet"]


def simulate(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    codes: list[int] = []
    run(args, exit=codes.append)
    out, err = capsys.readouterr()
    return codes[0], out, err


def one_line(err: str) -> bool:
    return err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def full_disk(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_compare_out_naming_a_folder_is_refused_before_the_reruns(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from test_compare import ROW, write_csv

    points = write_csv(tmp_path / "points.csv", ROW)
    code, out, err = simulate(["compare", str(points), "--out", str(tmp_path)], capsys)
    assert code == 2 and one_line(err) and "is a folder" in err and out == ""


def test_batch_table_out_and_plot_naming_a_folder_are_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--out", "--plot"):
        code, out, err = simulate(["batch-table", "--batch", "1", flag, str(tmp_path)], capsys)
        assert code == 2 and one_line(err) and f"{flag} {str(tmp_path)!r} is a folder" in err and out == ""


def test_a_full_disk_leaves_no_half_written_table(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    out = tmp_path / "table.parquet"
    code, _, err = simulate(["batch-table", "--batch", "1", "--out", str(out)], capsys)
    assert code == 1 and one_line(err) and "No space left on device" in err and "table.parquet" in err
    assert list(tmp_path.iterdir()) == []


TINY = ["--num-requests", "4", "--input-len", "32", "--output-len", "3", "--quiet"]


@pytest.mark.parametrize(("args", "written"), [
    (["run", *TINY, "--rate", "20", "--out", "run:1/x"], {"run:1/x/*.parquet": 3}),
    (["batch-table", "--batch", "1,2", "--out", "bt:1/t.parquet"], {"bt:1/t.parquet": 1}),
    (["sweep", *TINY, "--rate", "10,20", "--jobs", "1", "--out", "sw:1/s.parquet", "--tables", "tb:1/t"],
     {"sw:1/s.parquet": 1, "tb:1/t/*/config_id=*/part-0.parquet": 6}),
    (["plan", "--model", "tiny", "--input-len", "40", "--output-len", "4", "--max-gpus", "1", "--jobs", "1",
      "--slo", "p99_ttft_ms<=50", "--out", "plan:1"], {"plan:1/plan.parquet": 1}),
])
def test_an_output_path_that_reads_as_a_uri_is_a_local_file(args: list[str], written: dict[str, int], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow takes a relative path whose first part holds a colon for a URI ('run:1' has the scheme
    'run') and refused it with a traceback; such a folder is an ordinary local name."""
    monkeypatch.chdir(tmp_path)
    code, _, err = simulate(args, capsys)
    assert code == 0, err
    found = {pattern: sorted(tmp_path.glob(pattern)) for pattern in written}
    assert {pattern: len(files) for pattern, files in found.items()} == written
    assert all(pq.read_metadata(file).num_rows > 0 for files in found.values() for file in files)
    assert len(list(tmp_path.rglob("*.parquet"))) == sum(written.values())


def test_save_result_is_0644_whole_and_inside_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         umask_022: None) -> None:
    code, _, err = simulate([*SMALL_RUN, "--out", str(tmp_path / "run"), "--save-result", "--result-dir",
                             str(tmp_path / "results"), "--result-filename", "r.json"], capsys)
    assert code == 0, err
    saved = tmp_path / "results" / "r.json"
    assert json.loads(saved.read_text())["completed"] == 10
    assert stat.S_IMODE(saved.stat().st_mode) == 0o644  # was 0600, tempfile's
    assert [p.name for p in saved.parent.iterdir()] == ["r.json"]


@pytest.mark.parametrize(("flags", "named"), [
    (["--result-filename", "../../x.json"], "'../../x.json' leads outside --result-dir"),
    (["--result-filename", "/tmp/x.json"], "'/tmp/x.json' leads outside --result-dir"),
    (["--result-dir", "FILE"], "is not a folder"),
    (["--result-dir", "FILE/inside"], "is not a folder"),
    (["--result-filename", "taken"], "is a folder"),
])
def test_a_bad_result_path_is_refused_before_the_run(flags: list[str], named: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "FILE").write_text("")
    (tmp_path / "taken").mkdir()
    flags = [str(tmp_path / f) if f.startswith("FILE") else f for f in flags]
    monkeypatch.chdir(tmp_path)  # --result-dir's default
    code, out, err = simulate([*SMALL_RUN, "--out", str(tmp_path / "run"), "--save-result", *flags], capsys)
    assert code == 2 and one_line(err) and named in err, err
    assert not (tmp_path / "run").exists() and out == ""


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="needs Linux's /sys, a folder no process may write")
def test_a_result_folder_that_takes_no_files_is_refused_before_the_run(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate([*SMALL_RUN, "--out", str(tmp_path / "run"), "--save-result", "--result-dir", "/sys"],
                            capsys)
    assert code == 2 and one_line(err) and "takes no new files" in err
    assert not (tmp_path / "run").exists()


def test_a_full_disk_during_save_result_leaves_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("simulator.outputs.vllm_result.json.dump", full_disk)
    code, _, err = simulate([*SMALL_RUN, "--out", str(tmp_path / "run"), "--save-result", "--result-dir",
                             str(tmp_path / "results"), "--result-filename", "r.json"], capsys)
    assert code == 1 and one_line(err) and "No space left on device" in err and "r.json" in err
    assert list((tmp_path / "results").iterdir()) == []


def test_a_fault_on_a_deep_path_names_the_file_at_its_end(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """However deep the folder, the line keeps the path's end (the file's own name), cut at its start."""
    deep = tmp_path.joinpath(*["folder-with-a-long-name"] * 8)
    deep.mkdir(parents=True)
    monkeypatch.setattr("simulator.outputs.vllm_result.json.dump", full_disk)
    code, _, err = simulate([*SMALL_RUN, "--out", str(tmp_path / "run"), "--save-result", "--result-dir",
                             str(deep), "--result-filename", "the-result.json"], capsys)
    assert code == 1 and one_line(err) and len(err) < 160
    assert err.rstrip().endswith("folder-with-a-long-name/the-result.json'") and "'..." in err


def test_a_name_too_long_for_a_path_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate(["batch-table", "--model", "x" * 5000], capsys)
    assert code == 1 and one_line(err) and "File name too long" in err and len(err) < 200


def console(command: str) -> subprocess.CompletedProcess[str]:
    script = "import sys; from simulator.cli.main import run; sys.argv[0] = 'simulate'; run()"
    return subprocess.run(["bash", "-c", f"{sys.executable} -c {script!r} {command}"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])


def test_stdout_on_a_full_device_is_one_line() -> None:
    done = console("batch-table > /dev/full; echo status $? >&2")
    lines = done.stderr.splitlines()
    assert lines == ["error: No space left on device", "status 1"], done.stderr


def test_stdout_closed_early_ends_quietly() -> None:
    """`simulate ... | true`: the reader has gone before the first line is written. As `| head` is
    meant, the run ends with status 1 and nothing on stderr (click's rule, and the shell's habit)."""
    done = console("batch-table | true; echo status ${PIPESTATUS[0]} >&2")
    assert done.stderr.splitlines() == ["status 1"], done.stderr


def test_a_fitted_profile_folder_has_the_mode_of_every_output(tmp_path: Path, umask_022: None) -> None:
    from calibration.fit_host import write_profile
    from simulator.deploy.hardware import load_gpu, profile_dir

    values = {"step_overhead": 1e-3, "per_sequence_overhead": 0.0, "per_token_overhead": 0.0, "client_time": 0.0}
    write_profile(profile_dir("h100_sxm"), tmp_path / "fitted", values, None)
    assert stat.S_IMODE((tmp_path / "fitted").stat().st_mode) == 0o755  # was 0700, mkdtemp's
    assert load_gpu(str(tmp_path / "fitted")).step_overhead == 1e-3
    assert [p.name for p in tmp_path.iterdir()] == ["fitted"]
