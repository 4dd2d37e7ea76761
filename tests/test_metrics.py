"""Metrics as `vllm bench serve` defines them, on a hand-computed run, and the overload flag."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from helpers import run
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import SETTINGS, cases

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, describe, in_system_count, median, summarize
from simulator.metrics.tables import Columns
from simulator.metrics.tokens import itl_histogram, tokens_table
from simulator.run.simulate import simulate
from workloads import Workload


def test_metrics_of_the_continuous_scenario() -> None:
    # From test_policies: A (arrives 0) gets tokens at 1, 2, 4; B (arrives 1.5) at 3, 4.
    result, _ = run("continuous", [0.0, 1.5], [4, 6], [3, 2],
                    goodput=(("ttft", 1.6), ("tpot", 1.2)))
    summary = summarize(result, build_tables(result))
    assert summary["mean_ttft"] == pytest.approx((1.0 + 1.5) / 2)
    assert summary["median_ttft"] == pytest.approx(1.25)
    assert summary["std_ttft"] == pytest.approx(0.25)  # population std
    # TPOT: A (4 - 1) / 2 = 1.5, B (2.5 - 1.5) / 1 = 1.0
    assert summary["mean_tpot"] == pytest.approx(1.25)
    # ITL pooled: A's gaps 1, 2 and B's gap 1.
    assert summary["mean_itl"] == pytest.approx(4 / 3)
    assert summary["p50_itl"] == pytest.approx(1.0)
    assert summary["p90_itl"] == pytest.approx(np.percentile([1, 1, 2], 90))
    assert summary["mean_e2el"] == pytest.approx((4.0 + 2.5) / 2)
    assert summary["mean_queue"] == pytest.approx((0.0 + 0.5) / 2)
    # Duration runs from the first arrival (0) to the last finish (4).
    assert summary["duration"] == 4.0
    assert summary["request_throughput"] == pytest.approx(2 / 4)
    assert summary["output_throughput"] == pytest.approx(5 / 4)
    assert summary["total_token_throughput"] == pytest.approx(15 / 4)
    # Goodput: A misses the TPOT SLO (1.5 > 1.2); B meets both (TTFT 1.5 <= 1.6, TPOT 1.0).
    assert summary["good_requests"] == 1
    assert summary["request_goodput"] == pytest.approx(1 / 4)


def test_describe_uses_linear_percentiles_and_population_std() -> None:
    values = np.array([1.0, 2.0, 3.0, 10.0])
    stats = describe(values, (25.0, 99.9))
    assert stats["std"] == pytest.approx(np.sqrt(np.mean((values - 4.0) ** 2)))
    assert stats["p25"] == pytest.approx(1.75)
    assert stats["p99.9"] == pytest.approx(3 + 7 * 0.997)
    assert describe(np.array([]), (50.0,))["p50"] is None
    assert describe(values, (50.0,))["median"] == 2.5  # the mean of the middle two


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e300, 1e300), min_size=1, max_size=40))
def test_median_is_numpys_to_the_bit(values: list[float]) -> None:
    """The summary's median (which spares a run numpy's masked-array module) is np.median's."""
    sample = np.array(values)
    assert median(sample) == float(np.median(sample))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=40))
def test_one_servers_count_in_the_system_is_the_fleets_with_one_server(rows: list[tuple[int, int, int]]) -> None:
    """A lone server's requests in the system, read off its steps in time order, are what the
    fleet's way (each server's last step by each instant, summed) gives with one server."""
    starts = np.sort(np.array([r[0] for r in rows], dtype=np.float64)) / 4
    waiting, running = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    alone = Columns({"start": starts, "num_waiting": waiting, "num_running": running})
    fleet = Columns({"start": starts, "num_waiting": waiting, "num_running": running,
                     "server": np.zeros(len(rows), dtype=np.int64)})
    (times, counts), (fleet_times, fleet_counts) = in_system_count(alone), in_system_count(fleet)
    assert np.array_equal(times, fleet_times) and np.array_equal(counts, fleet_counts)
    assert counts.dtype == fleet_counts.dtype == np.float64


def overload_state(rate: float) -> object:
    result = simulate(RunConfig(policy="chunked", rate=rate, num_requests=2000, seed=1))
    return summarize(result, build_tables(result))["kept_up"]


def test_overload_is_flagged_and_a_light_load_is_not() -> None:
    assert overload_state(4.0) is True
    assert overload_state(20.0) is False  # about twice what one H100 serves at 2,000/300 tokens


def test_a_short_run_says_it_cannot_tell() -> None:
    result = simulate(RunConfig(policy="chunked", rate=12, num_requests=100, seed=1))
    assert summarize(result, build_tables(result))["kept_up"] is None


def test_time_limit_reports_unfinished_requests() -> None:
    result = simulate(RunConfig(policy="chunked", rate=12, num_requests=200, seed=1, time_limit=5.0))
    tables = build_tables(result)
    summary = summarize(result, tables)
    assert summary["unfinished"] > 0
    assert summary["arrived"] == summary["completed"] + summary["unfinished"]
    unfinished = tables.requests.filter(~tables.requests["finished"])
    assert unfinished["finish"].null_count() == unfinished.height
    assert (unfinished["emitted_tokens"] < unfinished["output_tokens"]).all()


def test_the_run_records_where_the_measured_cost_extrapolated() -> None:
    # A 20,000-token prompt in one step: beyond the H100 tables' largest GEMM (8,192 tokens) and
    # prefill attention (16,384-token prompts), so those families extrapolate in exactly that step.
    workload = Workload(prompt_tokens=np.array([20000], dtype=np.int64), output_tokens=np.array([3], dtype=np.int64),
                        arrival=np.zeros(1), concurrency=None)
    settings = dict(policy="chunked", max_num_batched_tokens=32768)
    measured = simulate(RunConfig(cost="measured", **settings), workload)  # type: ignore[arg-type]
    summary = summarize(measured, build_tables(measured))
    assert measured.cost_extrapolated["gemm qkv above measured 8192"] == 1
    assert any(key.startswith("prefill attention") for key in measured.cost_extrapolated)
    assert summary["cost_extrapolations"] == sum(measured.cost_extrapolated.values())
    assert "lm_head" in summary["cost_notes"]  # the LM head's n=128256 is beyond the measured n
    roofline = simulate(RunConfig(cost="roofline", **settings), workload)  # type: ignore[arg-type]
    assert summarize(roofline, build_tables(roofline))["cost_extrapolations"] == 0


@pytest.mark.parametrize("policy", ["static", "chunked", "priority"])
@settings(SETTINGS, max_examples=60)
@given(data=st.data(), time_limit=st.none() | st.floats(0.01, 2.0))
def test_itl_histogram_is_the_tokens_tables_gaps(policy: str, data: st.DataObject, time_limit: float | None) -> None:
    """The pooled inter-token gaps, computed from the step log's singles and runs, are exactly the
    gaps between consecutive rows of each finished request in the tokens table (one row per token)."""
    case = data.draw(cases(policy))
    try:
        result = simulate(replace(case.config, time_limit=time_limit), case.workload)
    except InputError:
        return
    finished = result.requests.emitted == result.requests.output_tokens
    values, counts = itl_histogram(result.log, finished if not finished.all() else None)
    tokens = tokens_table(result.log).filter(pl.col("request_id").is_in(np.flatnonzero(finished).tolist()))
    gaps = tokens.select(pl.col("time").diff().over("request_id").alias("gap"))["gap"].drop_nulls().to_numpy()
    assert np.array_equal(np.repeat(values, counts), np.sort(gaps))
    assert (np.diff(values) > 0).all()


def test_a_run_that_queried_no_prefix_cache_has_zero_cache_columns() -> None:
    # Without prefix identity no admission queries the cache: every step's queried and hit tokens
    # are 0 and the hit rate so far is undefined (null), in the table's usual types.
    result = simulate(RunConfig(num_requests=60, rate=12.0, policy="chunked"))
    steps = build_tables(result, tokens=False).steps
    assert steps.height == len(result.log) > 0
    for name in ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "prefix_cache_host_hit_tokens"):
        assert steps[name].dtype == pl.Int64 and steps[name].to_list() == [0] * steps.height
    assert steps["prefix_cache_hit_rate"].dtype == pl.Float64
    assert steps["prefix_cache_hit_rate"].null_count() == steps.height
