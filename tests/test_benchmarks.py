"""The engine benchmark's workloads are the ones it names, and one small case runs end to end."""

from __future__ import annotations

import numpy as np
from helpers import needs_azure

from benchmarks.engine_speed import AZURE, run_one, tiled_trace
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


def test_one_case_reports_consistent_figures() -> None:
    fast, reference = run_one("a-chunked-c64", 200, "fast"), run_one("a-chunked-c64", 200, "reference")
    for row in (fast, reference):
        assert row["requests"] == 200 and row["steps"] > 0
        assert row["real_time_ratio"] == row["simulated_s"] / row["wall_s"]  # type: ignore[operator]
    # Same simulation, whichever engine ran it.
    assert (fast["steps"], fast["simulated_s"]) == (reference["steps"], reference["simulated_s"])
