"""`simulate sweep`: the cartesian product, rows equal to single runs, crash safety, executors."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from test_cli import simulate_cli

from simulator.outputs.run_folder import json_safe

SMALL = ["--num-requests", "60", "--input-len", "500", "--output-len", "40"]


def test_rows_are_the_product_and_equal_single_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    code, stdout, _ = simulate_cli(["sweep", "--policy", "static,chunked", "--rate", "4,16", "--seed", "0,1",
                                    *SMALL, "--jobs", "2", "--out", str(out)], capsys)
    assert code == 0, stdout
    rows = pl.read_parquet(out)
    assert rows["config_id"].n_unique() == rows.height == 8
    expected = list(itertools.product(["static", "chunked"], [4.0, 16.0], [0, 1]))
    assert list(rows.select("policy", "rate", "seed").iter_rows()) == expected
    assert rows["error"].null_count() == 8
    assert (rows["setting_num_requests"] == 60).all() and (rows["input_len"] == 500).all()
    # Each row's metrics are those `simulate run` writes for the same settings.
    for policy, rate, seed in (("static", 16.0, 1), ("chunked", 4.0, 0)):
        run_dir = tmp_path / f"{policy}-{rate}-{seed}"
        assert simulate_cli(["--policy", policy, "--rate", str(rate), "--seed", str(seed), *SMALL,
                             "--out", str(run_dir)], capsys)[0] == 0
        summary = json.loads((run_dir / "summary.json").read_text())["summary"]
        row = rows.filter((pl.col("policy") == policy) & (pl.col("rate") == rate) & (pl.col("seed") == seed))
        assert json_safe({key: row[key][0] for key in summary}) == summary


def test_yaml_toml_and_flags_give_the_same_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text("axes:\n  policy: [continuous, chunked]\n  rate: [3, .inf]\n"
                                     "fixed:\n  num-requests: 30\n  input_len: 300\n  output_len: 20\n"
                                     "  percentiles: [50, 95]\n")
    (tmp_path / "s.toml").write_text('[axes]\npolicy = ["continuous", "chunked"]\nrate = [3.0, inf]\n'
                                     '[fixed]\nnum_requests = 30\ninput_len = 300\noutput_len = 20\n'
                                     'percentiles = "50,95"\n')
    frames = []
    for name, args in (("yaml", ["--file", str(tmp_path / "s.yaml")]), ("toml", ["--file", str(tmp_path / "s.toml")]),
                       ("flags", ["--policy", "continuous,chunked", "--rate", "3,inf", "--num-requests", "30",
                                  "--input-len", "300", "--output-len", "20", "--percentiles", "50,95"])):
        out = tmp_path / f"{name}.parquet"
        assert simulate_cli(["sweep", *args, "--jobs", "1", "--out", str(out)], capsys)[0] == 0
        frames.append(pl.read_parquet(out))
    assert frames[0].height == 4 and math.isinf(frames[0]["rate"][1])
    assert "p95_ttft" in frames[0].columns and "p99_ttft" not in frames[0].columns
    assert frames[0].equals(frames[1]) and frames[0].equals(frames[2])


def test_a_failing_configuration_records_its_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    args = ["sweep", "--policy", "continuous", "--max-num-batched-tokens", "256,4096", "--max-num-seqs", "64",
            "--input-len", "1000", *SMALL[:2], "--output-len", "10", "--rate", "8", "--out", str(out)]
    code, stdout, _ = simulate_cli([*args, "--jobs", "1"], capsys)
    assert code == 0 and "1 failed" in stdout
    rows = pl.read_parquet(out)
    bad, good = rows.row(0, named=True), rows.row(1, named=True)
    # Without chunking a 1000-token prompt never fits a 256-token step.
    assert "1000-token prompt" in bad["error"] and "256" in bad["error"] and bad["completed"] is None
    assert good["error"] is None and good["completed"] == 60
    code, stdout, _ = simulate_cli([*args, "--jobs", "1"], capsys)
    assert "0 run now, 2 already done" in stdout
    code, stdout, _ = simulate_cli([*args, "--jobs", "1", "--retry-failed"], capsys)
    assert "1 run now, 1 already done, 1 failed" in stdout
    assert pl.read_parquet(out).equals(rows)


def test_hive_tables_hold_each_configurations_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, tables = tmp_path / "sweep.parquet", tmp_path / "tables"
    assert simulate_cli(["sweep", "--policy", "static,chunked", "--rate", "6", *SMALL, "--jobs", "2",
                         "--tables", str(tables), "--out", str(out)], capsys)[0] == 0
    rows = pl.read_parquet(out)
    requests = pl.scan_parquet(tables / "requests", hive_partitioning=True)
    per_config = requests.group_by("config_id").agg(pl.len(), pl.col("ttft").mean()).collect()
    joined = rows.join(per_config, on="config_id")
    assert joined.height == 2
    assert (joined["len"] == joined["completed"]).all()
    assert joined["ttft"].to_list() == pytest.approx(joined["mean_ttft"].to_list())
    tokens = pl.scan_parquet(tables / "tokens", hive_partitioning=True).select(pl.len()).collect().item()
    assert tokens == rows["total_output_tokens"].sum()


@pytest.mark.parametrize(("args", "named"), [
    (["--rate", "2,x"], "'x'"),
    (["--rate", "2,2"], "2.0"),
    (["--seed", "1.5"], "'1.5'"),
    (["--jobs", "0"], "0"),
    (["--percentiles", "50,abc"], "50,abc"),
    (["--address", "10.0.0.1:6379"], "10.0.0.1:6379"),
    (["--file", "no/such.yaml"], "no/such.yaml"),
])
def test_bad_input_is_one_line_and_writes_nothing(args: list[str], named: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never.parquet"
    code, _, err = simulate_cli(["sweep", "--policy", "chunked", *args, "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err, err
    assert list(tmp_path.iterdir()) == []


def test_bad_sweep_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for text, named in (("axes:\n  rat: [1, 2]\n", "'rat'"), ("axes:\n  rate: 4\n", "rate"),
                        ("fixed:\n  seed: [1, 2]\n", "seed"), ("sweep:\n  rate: [1]\n", "'axes'"),
                        ("axes: 5\n", "'axes'"), ("fixed: [rate]\n", "'fixed'"), ("", "sets nothing"),
                        ("axes:\nfixed:\n", "sets nothing")):
        spec = tmp_path / "s.yaml"
        spec.write_text(text)
        code, _, err = simulate_cli(["sweep", "--file", str(spec), "--out", str(tmp_path / "x.parquet")], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and named in err, err
        assert not (tmp_path / "x.parquet").exists()
    (tmp_path / "empty.toml").write_text("")
    code, _, err = simulate_cli(["sweep", "--file", str(tmp_path / "empty.toml"), "--out", str(tmp_path / "x.parquet")],
                                capsys)
    assert code == 2 and "sets nothing" in err and not (tmp_path / "x.parquet").exists()


def test_an_existing_file_that_is_no_sweep_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(out)
    code, _, err = simulate_cli(["sweep", "--rate", "4", *SMALL, "--out", str(out)], capsys)
    assert code == 2 and "not a sweep" in err
    assert pl.read_parquet(out).equals(pl.DataFrame({"a": [1]}))


@pytest.mark.parametrize(("rows", "named"), [
    ({"config_id": [1, 2], "error": [None, None]}, "its config_id column is not one distinct text per row"),
    ({"config_id": ["a", "a"], "error": [None, None]}, "its config_id column is not one distinct text per row"),
    ({"config_id": ["a"], "error": [None], "rate": ["fast"]}, "column rate holds String, not Float64"),
    ({"config_id": ["a"], "error": [None], "request_throughput": ["lots"]}, "column request_throughput holds String"),
])
def test_an_existing_out_of_rows_no_sweep_writes_is_refused_and_kept(
        rows: dict[str, list[object]], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A resumed sweep merges its rows with --out's: rows it could not merge are refused before any
    configuration runs (a string rate was a polars traceback after the sweep had run)."""
    out = tmp_path / "mine.parquet"
    pl.DataFrame(rows).write_parquet(out)
    code, _, err = simulate_cli(["sweep", "--rate", "4", *SMALL, "--out", str(out)], capsys)
    assert code == 2 and "exists and is not a sweep file" in err and named in err, err
    assert pl.read_parquet(out).equals(pl.DataFrame(rows))


def test_a_damaged_committed_row_is_run_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """OUT.parts holds one committed row per configuration; a part that is no row of that
    configuration (garbage, no rows, another id) is not taken, and the configuration runs again."""
    out = tmp_path / "sweep.parquet"
    args = ["sweep", "--rate", "4,8,12", *SMALL, "--out", str(out)]
    assert simulate_cli(args, capsys)[0] == 0
    whole = pl.read_parquet(out)
    ids = whole["config_id"].to_list()
    out.unlink()
    parts = tmp_path / "sweep.parquet.parts"
    parts.mkdir()
    (parts / f"{ids[0]}.parquet").write_bytes(b"garbage")
    whole.head(0).write_parquet(parts / f"{ids[1]}.parquet")
    whole.slice(2, 1).with_columns(config_id=pl.lit(ids[1])).write_parquet(parts / f"{ids[2]}.parquet")
    code, stdout, err = simulate_cli(args, capsys)
    assert code == 0, err
    assert "3 configurations, 3 run now, 0 already done" in stdout
    rows = pl.read_parquet(out)
    assert rows.equals(whole)
    assert not parts.exists()


def test_ray_rows_equal_local_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sweep", "--policy", "static,continuous,chunked", "--rate", "5,20", *SMALL, "--jobs", "2"]
    local, on_ray = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    assert simulate_cli([*args, "--out", str(local)], capsys)[0] == 0
    code, stdout, err = simulate_cli([*args, "--executor", "ray", "--out", str(on_ray)], capsys)
    assert code == 0, err
    assert "6 run now" in stdout
    assert pl.read_parquet(on_ray).equals(pl.read_parquet(local))


def test_killed_sweep_leaves_a_valid_file_and_resumes(tmp_path: Path) -> None:
    """The issue's sweep (3 policies x 8 rates x 2 seeds, 2,000 requests each), SIGKILLed half-way."""
    out, tables = tmp_path / "sweep.parquet", tmp_path / "tables"
    parts = tmp_path / "sweep.parquet.parts"
    command = [sys.executable, "-c", "from simulator.cli.main import run; run()", "sweep",
               "--policy", "static,continuous,chunked", "--rate", "2,4,6,8,10,12,14,16", "--seed", "0,1",
               "--num-requests", "2000", "--jobs", "2", "--tables", str(tables), "--out", str(out)]
    sweep = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out.exists() and parts.is_dir() and len(list(parts.glob("*.parquet"))) >= 20):
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(sweep.pid, signal.SIGKILL)  # the sweep and its workers, mid-write or not
    sweep.wait()
    survived = pl.read_parquet(out)  # readable, whatever moment the kill hit
    committed = {p.stem for p in parts.glob("*.parquet")}
    assert 0 < survived.height <= len(committed) < 48
    assert set(survived["config_id"]) <= committed
    # A committed configuration's tables, to see below that resuming does not run it again.
    stamps = {cid: (tables / "requests" / f"config_id={cid}" / "part-0.parquet").stat() for cid in committed}

    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"48 configurations, {48 - len(committed)} run now, {len(committed)} already done, 0 failed" in done.stdout
    rows = pl.read_parquet(out)
    assert rows.height == rows["config_id"].n_unique() == 48
    expected = list(itertools.product(["static", "continuous", "chunked"], [2.0 * i for i in range(1, 9)], [0, 1]))
    assert list(rows.select("policy", "rate", "seed").iter_rows()) == expected
    assert rows["error"].null_count() == 48 and (rows["completed"] == 2000).all()
    for cid, before in stamps.items():
        after = (tables / "requests" / f"config_id={cid}" / "part-0.parquet").stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not parts.exists()
    # The chapter's point, visible in the rows: at 16 req/s every policy is past saturation.
    assert rows.filter(pl.col("rate") == 16)["kept_up"].to_list() == [False] * 6


def test_deployment_settings_are_sweep_axes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    code, stdout, _ = simulate_cli(["sweep", "--tensor-parallel-size", "1,2", "--quantization", "none,fp8",
                                    "--kv-cache-dtype", "auto,fp8", "--rate", "8", *SMALL, "--jobs", "1",
                                    "--out", str(out)], capsys)
    assert code == 0, stdout
    rows = pl.read_parquet(out)
    assert rows.height == 8 and rows["error"].null_count() == 8
    assert set(rows["quantization"].to_list()) == {None, "fp8"}
    # Each setting changes the server: TP2 and fp8 weights shorten decode, so TPOT differs in every row.
    assert rows["mean_tpot"].n_unique() == 8
    tpot = {(r["tensor_parallel_size"], r["quantization"], r["kv_cache_dtype"]): r["mean_tpot"]
            for r in rows.iter_rows(named=True)}
    assert tpot[(2, None, "auto")] < tpot[(1, None, "auto")]
    assert tpot[(1, "fp8", "auto")] < tpot[(1, None, "auto")]
