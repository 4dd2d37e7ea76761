"""The engine benchmark's workloads are the ones it names, and one small case runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
from helpers import needs_azure

from benchmarks.engine_speed import AZURE, run_one, tiled_trace
from benchmarks.fleet_speed import one as fleet_run
from benchmarks.stack_fidelity import gaps, stalls
from workloads import read_trace


@needs_azure
def test_tiled_trace_repeats_the_azure_trace_in_order() -> None:
    trace = read_trace(AZURE)
    n = trace.num_requests + 10
    tiled = tiled_trace(n)
    assert tiled.num_requests == n
    assert np.array_equal(tiled.prompt_tokens[trace.num_requests:], trace.prompt_tokens[:10])
    assert tiled.arrival is not None and trace.arrival is not None
    assert np.all(np.diff(tiled.arrival) >= 0)
    assert tiled.arrival[trace.num_requests] > trace.arrival[-1]


def test_one_case_runs_the_workload_it_names(tmp_path: Path) -> None:
    """Case (a) at 200 requests: 64 clients of 2,000/300-token requests. Every output token is in
    the tokens file it writes, and no request can finish in fewer steps than its 300 tokens."""
    row = run_one("a-chunked-c64", 200, str(tmp_path))
    tokens = pl.read_parquet(tmp_path / "tokens.parquet")
    assert tokens.height == 200 * 300
    assert tokens["request_id"].n_unique() == 200
    assert int(row["steps"]) >= 300 * 200 // 64
    assert float(row["simulated_s"]) > 0 and float(row["engine_s"]) > 0


def test_the_vidur_case_is_the_speed_issues_command(tmp_path: Path) -> None:
    """`--vidur` times the command line the Vidur figures were measured against: chunked prefill,
    Poisson 12 req/s, exactly 2,000/300 tokens; the run it makes has those requests."""
    from benchmarks.engine_speed import VIDUR_CASE, cli_run

    run = cli_run(50, tokens=False)
    assert run["wall_s"] > 0 and run["cpu_s"] > 0 and run["peak_mb"] > 0
    from click.testing import CliRunner

    from simulator.cli.main import main

    out = tmp_path / "run"
    result = CliRunner().invoke(main, [*VIDUR_CASE, "--num-prompts", "50", "--no-tokens", "--out", str(out)])
    assert result.exit_code == 0, result.output
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests.height == 50
    assert set(requests["prompt_tokens"]) == {2000} and set(requests["output_tokens"]) == {300}
    arrivals = requests["arrival"].to_numpy()
    assert 50 / 12 / 3 < arrivals[-1] < 50 / 12 * 3  # about 50 arrivals at 12/s
    assert not (out / "tokens.parquet").exists()
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert (settings["policy"], settings["rate"], settings["max_num_batched_tokens"]) == ("chunked", 12.0, 8192)


def test_prefix_cache_benchmark_runs_the_workload_it_names() -> None:
    """Its shared-prefix case: 2,000-token prompts, 1,000 of them one of 8 shared prefixes, which
    later requests find cached; its plain case (a) has nothing to find."""
    from benchmarks.prefix_cache import CASE_A, SHARED
    from simulator.config import RunConfig
    from simulator.metrics.summary import build_tables, summarize
    from simulator.run.simulate import simulate

    shared = simulate(RunConfig(num_requests=200, **CASE_A | SHARED))  # type: ignore[arg-type]
    assert (shared.requests.prompt_tokens == 2000).all()
    assert summarize(shared, build_tables(shared, tokens=False))["prefix_cache_hit_rate"] > 0.4
    plain = simulate(RunConfig(num_requests=200, **CASE_A))  # type: ignore[arg-type]
    assert summarize(plain, build_tables(plain, tokens=False))["prefix_cache_queried_tokens"] == 0

def test_fleet_benchmark_runs_its_fleet() -> None:
    """The fleet case at 400 requests: four replicas at 32 req/s serve them all, in more steps than
    one server's share would take."""
    fleet = fleet_run("chunked", 32.0, 400, 4, 0, "round-robin")
    single = fleet_run("chunked", 8.0, 100, 1, 0, "round-robin")
    assert fleet["completed"] == 400 and single["completed"] == 100
    assert fleet["steps"] > 3 * single["steps"]


def test_the_parquet_benchmark_marks_the_way_a_run_folder_is_written(tmp_path: Path) -> None:
    # benchmarks/parquet_formats.py marks one way per table as `simulate run`'s: the files a run
    # writes must be written that way (read from each file's own column-chunk metadata).
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from benchmarks.parquet_formats import OURS, WAYS
    from simulator.cli.main import main

    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["--num-prompts", "20", "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name, way in OURS.items():
        options = WAYS[way]
        meta = pq.ParquetFile(out / f"{name}.parquet").metadata
        for i in range(meta.num_columns):
            chunk = meta.row_group(0).column(i)
            assert chunk.compression == str(options.get("compression", "snappy")).upper(), (name, i)
            dictionary = any("DICTIONARY" in encoding for encoding in chunk.encodings)
            assert dictionary == options.get("use_dictionary", True), (name, chunk.encodings)


def test_the_fidelity_benchmark_derives_the_prefill_stall_and_the_ttft_gap_by_hand() -> None:
    def row(point: str, isl: int, osl: int, statistic: str, measured: float, simulated: float) -> dict[str, object]:
        return {"variant": "v", "backend": "vllm", "model": "m", "gpu": "g", "concurrency": 4, "point": point,
                "input_len": isl, "output_len": osl, "statistic": statistic, "measured": measured,
                "simulated": simulated}

    rows = pl.DataFrame([row("a", 8192, 1024, "tpot_mean", 0.012, 0.011),
                         row("a", 8192, 1024, "ttft_mean", 0.50, 0.40),
                         row("b", 1024, 8192, "tpot_mean", 0.010, 0.0095),
                         row("b", 1024, 8192, "ttft_mean", 0.15, 0.12)])
    stall = stalls(rows).row(0, named=True)
    assert np.isclose(stall["measured"], 0.002) and np.isclose(stall["simulated"], 0.0015)
    gap = {r["input_len"]: r for r in gaps(rows).iter_rows(named=True)}
    assert np.isclose(gap[8192]["gap"], 0.10) and np.isclose(gap[8192]["steps"], 0.10 / 0.011)
    assert np.isclose(gap[1024]["gap"], 0.03) and np.isclose(gap[1024]["steps"], 0.03 / 0.0095)
