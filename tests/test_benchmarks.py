"""The engine benchmark's workloads are the ones it names, and one small case runs end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from helpers import needs_azure

from benchmarks.engine_speed import AZURE, run_one, tiled_trace
from benchmarks.fleet_speed import one as fleet_run
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


def test_fleet_benchmark_runs_its_fleet() -> None:
    """The fleet case at 400 requests: four replicas at 32 req/s serve them all, in more steps than
    one server's share would take."""
    fleet = fleet_run("chunked", 32.0, 400, 4, 0, "round-robin")
    single = fleet_run("chunked", 8.0, 100, 1, 0, "round-robin")
    assert fleet["completed"] == 400 and single["completed"] == 100
    assert fleet["steps"] > 3 * single["steps"]
