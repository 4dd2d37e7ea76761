"""The `simulate` command: outputs with stable schemas, determinism, and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from helpers import AZURE, needs_azure

from simulator.cli.main import run
from simulator.outputs.run_folder import read_metadata

REQUESTS_SCHEMA = {
    "request_id": pl.Int64, "arrival": pl.Float64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64,
    "emitted_tokens": pl.Int64, "scheduled": pl.Float64, "first_token": pl.Float64, "finish": pl.Float64,
    "ttft": pl.Float64, "tpot": pl.Float64, "e2el": pl.Float64, "queue": pl.Float64, "preemptions": pl.Int64,
    "priority": pl.Int64, "cached_tokens": pl.Int64, "cached_tokens_gpu": pl.Int64, "cached_tokens_host": pl.Int64,
    "finished": pl.Boolean,
}
TOKENS_SCHEMA = {"request_id": pl.Int64, "index": pl.Int64, "time": pl.Float64}
STEPS_SCHEMA = {
    "step": pl.Int64, "start": pl.Float64, "duration": pl.Float64, "num_seqs": pl.Int64,
    "prefill_tokens": pl.Int64, "decode_tokens": pl.Int64, "padded_tokens": pl.Int64,
    "kv_blocks_used": pl.Int64, "num_waiting": pl.Int64, "num_running": pl.Int64, "num_preempted": pl.Int64,
    "prefix_cache_queried_tokens": pl.Int64, "prefix_cache_hit_tokens": pl.Int64,
    "prefix_cache_host_hit_tokens": pl.Int64, "prefix_cache_hit_rate": pl.Float64,
}


def simulate_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    codes: list[int] = []
    run(args, exit=codes.append)
    out, err = capsys.readouterr()
    return codes[0], out, err


def test_run_writes_four_files_with_stable_schemas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, stdout, _ = simulate_cli(["--policy", "chunked", "--rate", "8", "--num-requests", "40",
                                    "--input-len-dist", "uniform:0.5", "--out", str(out)], capsys)
    assert code == 0
    assert "TTFT" in stdout and "ITL" in stdout
    requests = pl.read_parquet(out / "requests.parquet")
    tokens = pl.read_parquet(out / "tokens.parquet")
    steps = pl.read_parquet(out / "steps.parquet")
    assert dict(requests.schema) == REQUESTS_SCHEMA
    assert dict(tokens.schema) == TOKENS_SCHEMA
    assert dict(steps.schema) == STEPS_SCHEMA
    assert requests.height == 40
    assert tokens.height == requests["output_tokens"].sum()
    assert read_metadata(out / "steps.parquet")["settings"]["policy"] == "chunked"
    saved = json.loads((out / "summary.json").read_text())
    assert saved["settings"]["rate"] == 8 and saved["settings"]["input_len_dist"] == "uniform:0.5"
    assert saved["summary"]["completed"] == 40
    assert saved["summary"]["mean_ttft"] == pytest.approx(requests["ttft"].mean())


def test_goodput_takes_slos_as_vllm_bench_writes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "good"
    code, stdout, _ = simulate_cli(["--rate", "4", "--num-requests", "30", "--goodput", "ttft:45", "tpot:10.5",
                                    "--seed", "1", "--out", str(out)], capsys)
    assert code == 0 and "goodput" in stdout
    saved = json.loads((out / "summary.json").read_text())
    requests = pl.read_parquet(out / "requests.parquet")
    good = requests.filter((pl.col("ttft") <= 0.045) & (pl.col("tpot").fill_null(0) <= 0.0105)).height
    assert 0 < good < requests.height  # the SLOs split the requests
    assert saved["settings"]["goodput"] == "ttft:45 tpot:10.5"
    assert saved["summary"]["good_requests"] == good
    assert saved["summary"]["request_goodput"] == pytest.approx(good / saved["summary"]["duration"])


def test_same_seed_same_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--policy", "continuous", "--rate", "10", "--num-requests", "30", "--output-len-dist", "exponential"]
    for name in ("a", "b", "c"):
        seed = ["--seed", "7"] if name != "c" else ["--seed", "8"]
        assert simulate_cli([*args, *seed, "--out", str(tmp_path / name)], capsys)[0] == 0
    for table in ("requests", "tokens", "steps"):
        a, b, c = (pl.read_parquet(tmp_path / name / f"{table}.parquet") for name in "abc")
        assert a.equals(b)
        assert not a.equals(c)


@needs_azure
def test_trace_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace"
    code, _, _ = simulate_cli(["--trace", str(AZURE), "--num-requests", "50",
                               "--policy", "chunked", "--out", str(out)], capsys)
    assert code == 0
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests["prompt_tokens"].head(2).to_list() == [374, 396]  # the trace's first rows
    assert requests["arrival"][1] == pytest.approx(50.9951690 - 46.6805900)


def test_batch_table_prints_and_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "table.parquet"
    code, stdout, _ = simulate_cli(["batch-table", "--context", "2300", "--batch", "1,8,64,128",
                                    "--out", str(out)], capsys)
    assert code == 0
    assert "knee" in stdout and "ceiling" in stdout
    table = pl.read_parquet(out)
    assert table["batch"].to_list() == [1, 8, 64, 128]
    assert read_metadata(out)["context"] == 2300


def test_batch_table_without_the_custom_all_reduce(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vllm serve's flag: every all-reduce NCCL's, the slower one at TP 8 and decode sizes.
    times = []
    for flags in ([], ["--disable-custom-all-reduce"]):
        out = tmp_path / f"table{len(flags)}.parquet"
        code, _, err = simulate_cli(["batch-table", "--cost", "measured", "--tensor-parallel-size", "8",
                                     "--batch", "1,64", "--out", str(out), *flags], capsys)
        assert code == 0, err
        times.append(pl.read_parquet(out)["all_reduce_time"].to_numpy())
    assert (times[1] > times[0]).all() and times[1][0] > 2 * times[0][0]  # most at one sequence


@pytest.mark.parametrize(("args", "named"), [
    (["--policy", "fifo"], "'fifo'"),
    (["--rate", "0"], "0"),
    (["--rate", "-3"], "-3"),
    (["--concurrency", "0"], "0"),
    (["--input-len", "500000"], "500000"),
    (["--input-len-dist", "zipf"], "zipf"),
    (["--trace", "no/such/trace.csv"], "no/such/trace.csv"),
    (["--goodput", "ttft=500"], "ttft=500"),
    (["--gpu", "b300"], "b300"),
    (["--rate", "abc"], "abc"),
    (["batch-table", "--batch", "1,x"], "1,x"),
])
def test_bad_input_is_one_line_naming_the_value(args: list[str], named: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    code, _, err = simulate_cli([*args, "--out", str(out)], capsys)
    assert code != 0
    assert len(err.strip().splitlines()) == 1, err
    assert named in err
    assert "Traceback" not in err
    assert not out.exists()


def test_trace_with_missing_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    code, _, err = simulate_cli(["--trace", str(trace), "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "bad.csv" in err and not (tmp_path / "x").exists()


def test_existing_output_folder_is_not_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    code, _, err = simulate_cli(["--num-requests", "5", "--out", str(tmp_path)], capsys)
    assert code == 2 and "already exists" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_console_script_exits_nonzero_without_traceback(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "from simulator.cli.main import run; run()", "--rate", "-1"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: --rate must be a number in [1e-06, 1e+09] requests/s, or inf (all at once), "
                                   "got -1.0")


def test_a_run_folder_holds_the_oracles_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What `simulate run` writes (the tokens table streamed in chunks) is what the straightforward
    engine of the tests computes for the same settings."""
    from oracle import run_oracle

    from simulator.config import RunConfig
    from simulator.metrics.summary import build_tables
    from simulator.run.simulate import simulate

    code, _, _ = simulate_cli(["--policy", "chunked", "--rate", "14", "--num-requests", "300",
                               "--out", str(tmp_path / "run")], capsys)
    assert code == 0
    expected = build_tables(simulate(RunConfig(policy="chunked", rate=14.0, num_requests=300), engine=run_oracle))
    for name in ("requests", "tokens", "steps"):
        assert pl.read_parquet(tmp_path / "run" / f"{name}.parquet").equals(getattr(expected, name)), name
    assert read_metadata(tmp_path / "run" / "tokens.parquet")["settings"]["policy"] == "chunked"


def test_no_tokens_skips_the_token_table_but_not_its_metrics(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--policy", "chunked", "--rate", "8", "--num-requests", "60"]
    code, _, _ = simulate_cli([*args, "--out", str(tmp_path / "with")], capsys)
    assert code == 0
    code, stdout, _ = simulate_cli([*args, "--no-tokens", "--out", str(tmp_path / "without")], capsys)
    assert code == 0 and stdout.splitlines()[-1].endswith("/ (requests, steps .parquet; summary.json)")
    assert not (tmp_path / "without" / "tokens.parquet").exists()
    with_tokens, without = (json.loads((tmp_path / d / "summary.json").read_text())["summary"]
                            for d in ("with", "without"))
    assert without == with_tokens  # ITL comes from the step log either way
    code, _, _ = simulate_cli(["report", str(tmp_path / "without")], capsys)
    assert code == 0 and (tmp_path / "without" / "report.html").is_file()


@pytest.mark.parametrize("load", [["--num-requests", "10"], ["--concurrency", "5", "--num-requests", "10"],
                                  ["--rate", "400", "--num-requests", "10"]])
def test_a_run_cut_off_before_any_request_finished_claims_no_verdict(
        load: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2,000-token prompts take ~40 ms to prefill and 300 outputs many steps more: at 0.05 s none has finished.
    out = tmp_path / "cut"
    code, stdout, _ = simulate_cli([*load, "--time-limit", "0.05", "--out", str(out)], capsys)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["completed"] == 0 and summary["unfinished"] == summary["arrived"] > 0
    assert summary["kept_up"] is None
    assert "kept up" not in stdout and "nan" not in stdout
    assert "No request finished" in stdout and "--time-limit 0.05" in stdout


@pytest.mark.parametrize(("args", "named"), [
    (["--rate", "8"], "--rate 8"),
    (["--concurrency", "4"], "--concurrency 4"),
    (["--input-len", "500"], "--input-len 500"),
    (["--duration", "10"], "--duration 10"),
    (["--output-len-dist", "exponential"], "--output-len-dist exponential"),
])
def test_synthetic_workload_flags_beside_a_trace_are_refused(args: list[str], named: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n")
    out = tmp_path / "run"
    code, _, err = simulate_cli(["--trace", str(trace), *args, "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert named in err and "--trace" in err
    assert not out.exists()


@pytest.mark.parametrize(("args", "named"), [
    (["--trace-speed", "2"], "--trace-speed 2"),
    (["--policy", "static", "--max-num-batched-tokens", "4096"], "--max-num-batched-tokens"),
    (["--policy", "static", "--long-prefill-token-threshold", "512"], "--long-prefill-token-threshold"),
    (["--policy", "continuous", "--max-batch-size", "8"], "--max-batch-size"),
    (["--policy", "chunked", "--max-queue-delay", "0.5"], "--max-queue-delay"),
    (["--policy", "continuous", "--long-prefill-token-threshold", "512"], "--long-prefill-token-threshold"),
])
def test_flags_that_would_not_apply_are_refused(args: list[str], named: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, _, err = simulate_cli([*args, "--num-requests", "5", "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err, err
    assert not out.exists()


def test_flags_a_policy_reads_still_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, _, _ = simulate_cli(["--policy", "static", "--max-batch-size", "8", "--max-queue-delay", "0.5",
                               "--rate", "20", "--num-requests", "20", "--out", str(out)], capsys)
    assert code == 0
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["max_batch_size"] == 8 and settings["max_queue_delay"] == 0.5


@pytest.mark.parametrize(("args", "named"), [
    (["--goodput", "ttft:500 ttft:100"], "ttft twice"),
    (["--goodput", "ttft:500", "tpot:50", "ttft:100"], "ttft twice"),
    (["--percentiles", "50,50"], "50 twice"),
    (["--percentiles", "50,90,50.0"], "50 twice"),
    (["--rate", "4", "--duration", "10", "--num-requests", "20"], "not both"),
])
def test_settings_that_contradict_themselves_are_refused(args: list[str], named: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, _, err = simulate_cli([*args, "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err, err
    assert not out.exists()


@pytest.mark.parametrize(("args", "flag"), [
    (["--trace", "t.csv", "--trace-speed", "0"], "--trace-speed"),
    (["--trace", "t.csv", "--trace-speed", "inf"], "--trace-speed"),
    (["--rate", "4", "--duration", "-1"], "--duration"),
    (["--concurrency", "4", "--duration", "10"], "--duration"),
    (["--duration", "5"], "--duration"),
    (["--seed", "-1"], "--seed"),
    (["--rate", "3", "--burstiness", "0"], "--burstiness"),
    (["--concurrency", "3", "--burstiness", "2"], "--burstiness"),
    (["--input-len-dist", "uniform:2"], "--input-len-dist"),
    (["--output-len-dist", "zipf"], "--output-len-dist"),
    (["--input-len-dist", "fixed:3"], "--input-len-dist"),
    (["--percentiles", "150"], "--percentiles"),
    (["--goodput", "queue:5"], "--goodput"),
    (["--rate", "0.0001", "--duration", "1"], "--duration"),
])
def test_errors_name_the_flag_not_the_python_setting(args: list[str], flag: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0.0,100,10\n")
    args = [str(tmp_path / a) if a == "t.csv" else a for a in args]
    code, _, err = simulate_cli([*args, "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert flag in err, err
    for python_name in ("trace speed", "num_requests", "input_len", "(rate)", "(concurrency)", "percentile ",
                        "goodput metric", "duration "):
        assert python_name not in err.replace(flag, ""), err


def test_batch_table_warns_past_the_context_and_the_kv_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate_cli(["batch-table", "--context", "200000", "--batch", "1"], capsys)
    assert code == 0 and "--context 200000" in err and "131072" in err  # Llama-3.1-8B's context length
    # The chapter: about 200 sequences of 2,300 tokens fill an H100's KV cache.
    code, stdout, err = simulate_cli(["batch-table", "--context", "2300", "--batch", "8,1000"], capsys)
    assert code == 0 and "--batch 1000 " in err and "ceiling" in err
    rows = {line.split()[0]: line for line in stdout.splitlines()[2:4]}
    assert set(rows) == {"8", "1000*"}


def test_batch_table_columns_stay_apart_for_wide_values(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = simulate_cli(["batch-table", "--context", "2300", "--batch", "1,10000000"], capsys)
    assert code == 0
    header, *rows = stdout.splitlines()[1:4]
    for row in rows:
        cells = row.split()
        assert len(cells) == 7, row
        assert float(cells[0].rstrip("*")) in (1, 10_000_000)
        # Each cell ends where its column's header ends (right-aligned).
        ends = [m.end() for m in re.finditer(r"\S+", row)]
        header_ends = [m.end() for m in re.finditer(r"\S+(?: \S+)?", header)]
        assert ends == header_ends, (header, row)
