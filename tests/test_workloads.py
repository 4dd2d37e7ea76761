"""Tests for workloads/: length distributions, arrival processes, synthetic workloads, traces.

Statistical checks use fixed seeds and compare against independent references (scipy's
distributions, closed-form moments, the trace files parsed with the standard library).
"""

from __future__ import annotations

import csv
import json
import math
import re
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from helpers import AZURE, MOONCAKE, needs_azure, needs_mooncake
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from simulator.errors import InputError
from workloads import (
    LengthDist,
    Workload,
    arrivals_until,
    parse_length_dist,
    poisson_arrivals,
    read_trace,
    synthetic_workload,
)


def raises(*fragments: str) -> AbstractContextManager[pytest.ExceptionInfo[InputError]]:
    """Expect an InputError whose one-line message contains every fragment."""
    return pytest.raises(
        InputError, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    )


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def arrivals(workload: Workload) -> np.ndarray:
    """The arrival column of an open-loop workload."""
    assert workload.arrival is not None
    return workload.arrival


# ---------------------------------------------------------------- length distributions


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("fixed", LengthDist("fixed", None)),
        ("uniform", LengthDist("uniform", 0.5)),
        ("uniform:0.25", LengthDist("uniform", 0.25)),
        ("uniform:0", LengthDist("uniform", 0.0)),
        ("lognormal", LengthDist("lognormal", 1.0)),
        ("lognormal:0.3", LengthDist("lognormal", 0.3)),
        ("exponential", LengthDist("exponential", None)),
        (" Uniform:0.1 ", LengthDist("uniform", 0.1)),
    ],
)
def test_parse_length_dist(spec: str, expected: LengthDist) -> None:
    assert parse_length_dist(spec) == expected


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("zipf", "zipf"),
        ("", "''"),
        ("uniform:abc", "abc"),
        ("uniform:1", "1.0"),
        ("uniform:1.5", "1.5"),
        ("uniform:-0.1", "-0.1"),
        ("uniform:nan", "nan"),
        ("lognormal:0", "0.0"),
        ("lognormal:-2", "-2.0"),
        ("lognormal:inf", "inf"),
        ("lognormal:", "''"),
        ("fixed:3", "fixed:3"),
        ("exponential:2", "exponential:2"),
    ],
)
def test_parse_length_dist_rejects(spec: str, fragment: str) -> None:
    with raises(fragment):
        parse_length_dist(spec)


@pytest.mark.parametrize("spec", ["z" * 10**5, "uniform:" + "z" * 10**5, "fixed:" + "z" * 10**5,
                                  "z" * 10**5 + ":1"])
def test_a_huge_length_dist_is_named_cut(spec: str) -> None:
    # The message names the bad value, cut to a few dozen characters: an error stays one short line.
    with pytest.raises(InputError) as caught:
        parse_length_dist(spec)
    assert "zzz..." in str(caught.value) and len(str(caught.value)) < 300


def test_length_dist_rejects_bad_construction() -> None:
    with raises("gauss"):
        LengthDist("gauss", None)
    with raises("uniform", "None"):
        LengthDist("uniform", None)


@pytest.mark.parametrize("spec", ["fixed", "uniform", "lognormal", "exponential"])
@pytest.mark.parametrize("mean", [0, -5, 2.5, True])
def test_sample_rejects_bad_mean(spec: str, mean: int) -> None:
    with raises(repr(mean)):
        parse_length_dist(spec).sample(mean, 10, rng())


def test_sample_rejects_negative_count() -> None:
    with raises("-1"):
        parse_length_dist("fixed").sample(10, -1, rng())


def test_sample_zero_count_is_empty_int64() -> None:
    values = parse_length_dist("lognormal").sample(10, 0, rng())
    assert values.dtype == np.int64
    assert values.shape == (0,)


def test_fixed_is_the_mean() -> None:
    values = parse_length_dist("fixed").sample(2000, 50, rng())
    assert values.dtype == np.int64
    assert np.array_equal(values, np.full(50, 2000))


def test_uniform_bounds_and_moments() -> None:
    values = parse_length_dist("uniform:0.5").sample(1000, 50_000, rng())
    assert values.min() == 500
    assert values.max() == 1500
    # A discrete uniform on [a, b] has mean (a+b)/2 and variance ((b-a+1)**2 - 1)/12.
    assert values.mean() == pytest.approx(1000, rel=0.01)
    assert values.var() == pytest.approx((1001**2 - 1) / 12, rel=0.03)
    counts = np.bincount(values - 500, minlength=1001)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_uniform_range_is_rounded_and_zero_ratio_is_fixed() -> None:
    # round(3 * 0.5) = 2 and round(3 * 1.5) = 4.
    assert set(parse_length_dist("uniform:0.5").sample(3, 2000, rng()).tolist()) == {2, 3, 4}
    assert set(parse_length_dist("uniform:0").sample(77, 100, rng()).tolist()) == {77}
    # round(1 * 0.5) = 0, which a token count cannot be: those draws are 1.
    assert set(parse_length_dist("uniform:0.9").sample(1, 1000, rng()).tolist()) == {1, 2}


def test_lognormal_mean_and_shape() -> None:
    sigma = 1.0
    values = parse_length_dist(f"lognormal:{sigma}").sample(1000, 200_000, rng())
    assert values.dtype == np.int64
    assert values.mean() == pytest.approx(1000, rel=0.015)
    # Median of a lognormal is exp(mu) = mean * exp(-sigma**2 / 2).
    assert np.median(values) == pytest.approx(1000 * math.exp(-(sigma**2) / 2), rel=0.02)
    assert np.log(values).std() == pytest.approx(sigma, rel=0.02)


def test_lognormal_small_sigma_mean() -> None:
    values = parse_length_dist("lognormal:0.2").sample(300, 100_000, rng(1))
    assert values.mean() == pytest.approx(300, rel=0.005)


def test_exponential_moments() -> None:
    values = parse_length_dist("exponential").sample(500, 200_000, rng())
    assert values.mean() == pytest.approx(500, rel=0.01)
    assert values.std() == pytest.approx(500, rel=0.02)
    assert values.min() >= 1


def test_small_means_never_give_zero_tokens() -> None:
    for spec in ("lognormal:2", "exponential", "uniform:0.99"):
        assert parse_length_dist(spec).sample(1, 10_000, rng()).min() == 1


length_specs = st.one_of(
    st.just("fixed"),
    st.just("exponential"),
    st.just("uniform"),
    st.just("lognormal"),
    st.floats(0, 0.999).map(lambda r: f"uniform:{r}"),
    st.floats(0.01, 3).map(lambda s: f"lognormal:{s}"),
)


@settings(max_examples=150, deadline=None)
@given(
    spec=length_specs,
    mean=st.integers(1, 10**6),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**32),
)
def test_any_valid_spec_gives_int64_counts_of_at_least_one(
    spec: str, mean: int, n: int, seed: int
) -> None:
    values = parse_length_dist(spec).sample(mean, n, rng(seed))
    assert values.dtype == np.int64
    assert values.shape == (n,)
    assert (values >= 1).all()


# ---------------------------------------------------------------- arrivals


def gaps_of(arrival: np.ndarray) -> np.ndarray:
    return np.diff(arrival, prepend=0.0)


def test_poisson_gaps_are_exponential() -> None:
    rate = 5.0
    arrival = poisson_arrivals(rate, 20_000, 1.0, rng())
    gaps = gaps_of(arrival)
    assert arrival.dtype == np.float64
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert stats.kstest(gaps, stats.expon(scale=1 / rate).cdf).pvalue > 1e-3
    # ... and something else is rejected, so the test can fail.
    assert stats.kstest(gaps, stats.expon(scale=1.2 / rate).cdf).pvalue < 1e-6


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 8.0])
def test_gamma_gaps_mean_and_cv(burstiness: float) -> None:
    rate = 12.0
    gaps = gaps_of(poisson_arrivals(rate, 40_000, burstiness, rng(3)))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.04)
    reference = stats.gamma(a=burstiness, scale=1 / (rate * burstiness))
    assert stats.kstest(gaps, reference.cdf).pvalue > 1e-3


def test_first_request_arrives_after_the_first_gap() -> None:
    arrival = poisson_arrivals(2.0, 1000, 1.0, rng())
    assert arrival[0] > 0
    assert (np.diff(arrival) >= 0).all()
    # The first arrival is a gap like the others: over many seeds its mean is 1/rate.
    firsts = [poisson_arrivals(2.0, 1, 1.0, rng(seed))[0] for seed in range(2000)]
    assert np.mean(firsts) == pytest.approx(0.5, rel=0.08)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert np.array_equal(poisson_arrivals(math.inf, 7, 1.0, rng()), np.zeros(7))


def test_infinite_burstiness_is_evenly_spaced() -> None:
    arrival = poisson_arrivals(4.0, 8, math.inf, rng())
    assert np.allclose(arrival, np.arange(1, 9) / 4.0)


def test_poisson_arrivals_deterministic_per_seed() -> None:
    a = poisson_arrivals(3.0, 100, 0.7, rng(42))
    b = poisson_arrivals(3.0, 100, 0.7, rng(42))
    c = poisson_arrivals(3.0, 100, 0.7, rng(43))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("rate", "n", "burstiness", "fragment"),
    [
        (0.0, 10, 1.0, "0.0"),
        (-2.0, 10, 1.0, "-2.0"),
        (math.nan, 10, 1.0, "nan"),
        (1.0, 10, 0.0, "burstiness must be > 0, got 0.0"),
        (1.0, 10, -1.0, "-1.0"),
        (1.0, 10, math.nan, "burstiness must be > 0, got nan"),
        (1.0, 0, 1.0, "got 0"),
        (1.0, -3, 1.0, "-3"),
    ],
)
def test_poisson_arrivals_rejects(rate: float, n: int, burstiness: float, fragment: str) -> None:
    with raises(fragment):
        poisson_arrivals(rate, n, burstiness, rng())


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(1e-3, 1e4),
    n=st.integers(1, 500),
    burstiness=st.one_of(st.floats(0.05, 50), st.just(math.inf)),
    seed=st.integers(0, 2**32),
)
def test_poisson_arrivals_property(rate: float, n: int, burstiness: float, seed: int) -> None:
    arrival = poisson_arrivals(rate, n, burstiness, rng(seed))
    assert arrival.dtype == np.float64
    assert arrival.shape == (n,)
    assert np.isfinite(arrival).all()
    assert (arrival >= 0).all()
    assert (np.diff(arrival) >= 0).all()


def test_arrivals_until_window_and_count() -> None:
    rate, duration = 50.0, 200.0
    arrival = arrivals_until(rate, duration, 1.0, rng())
    assert arrival.dtype == np.float64
    assert arrival[0] > 0
    assert arrival[-1] < duration
    assert (np.diff(arrival) >= 0).all()
    # Poisson count: mean rate*duration = 10,000, standard deviation 100.
    assert abs(arrival.size - rate * duration) < 400


@pytest.mark.parametrize("burstiness", [1.0, 0.3, 0.02, 5.0])
def test_arrivals_until_is_the_same_stream_cut_at_duration(burstiness: float) -> None:
    for seed in range(20):
        until = arrivals_until(10.0, 10.0, burstiness, rng(seed))
        stream = poisson_arrivals(10.0, 20_000, burstiness, rng(seed))
        expected = stream[stream < 10.0]
        assert until.size == expected.size
        assert np.allclose(until, expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    ("rate", "duration", "burstiness", "fragment"),
    [
        (1.0, 0.0, 1.0, "0.0"),
        (1.0, -5.0, 1.0, "-5.0"),
        (1.0, math.nan, 1.0, "nan"),
        (1.0, math.inf, 1.0, "inf"),
        (math.inf, 10.0, 1.0, "infinite arrival rate"),
        (-1.0, 10.0, 1.0, "-1.0"),
        (1.0, 10.0, 0.0, "burstiness must be > 0, got 0.0"),
    ],
)
def test_arrivals_until_rejects(
    rate: float, duration: float, burstiness: float, fragment: str
) -> None:
    with raises(fragment):
        arrivals_until(rate, duration, burstiness, rng())


# ---------------------------------------------------------------- Workload


def open_workload(**changes: Any) -> Workload:
    columns: dict[str, Any] = {
        "prompt_tokens": np.array([5, 6, 7], dtype=np.int64),
        "output_tokens": np.array([1, 2, 3], dtype=np.int64),
        "arrival": np.array([0.5, 0.5, 2.0]),
        "concurrency": None,
    }
    columns.update(changes)
    return Workload(**columns)


def test_workload_valid_open_and_closed() -> None:
    assert open_workload().num_requests == 3
    closed = open_workload(arrival=None, concurrency=2)
    assert closed.num_requests == 3
    assert closed.arrival is None


def test_workload_equality_compares_columns() -> None:
    assert open_workload() == open_workload()
    assert open_workload() != open_workload(arrival=np.array([0.5, 0.6, 2.0]))
    assert open_workload() != open_workload(arrival=None, concurrency=2)
    assert open_workload(arrival=None, concurrency=2) != open_workload(arrival=None, concurrency=3)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"prompt_tokens": np.array([5, 6, 7], dtype=np.int32)}, "int32"),
        ({"prompt_tokens": [5, 6, 7]}, "list"),
        ({"output_tokens": np.ones((3, 1), dtype=np.int64)}, "(3, 1)"),
        ({"arrival": np.array([0, 1, 2])}, "arrival"),
        ({"output_tokens": np.array([1, 2], dtype=np.int64)}, "2 output lengths"),
        ({"arrival": np.array([0.0, 1.0])}, "2 arrival times"),
        ({"prompt_tokens": np.array([5, 0, 7], dtype=np.int64)}, "got 0 for request 1"),
        ({"output_tokens": np.array([1, 2, -3], dtype=np.int64)}, "got -3 for request 2"),
        ({"arrival": np.array([0.0, 2.0, 1.0])}, "request 2 arrives at 1.0"),
        ({"arrival": np.array([-1.0, 2.0, 3.0])}, "-1.0"),
        ({"arrival": np.array([0.0, math.nan, 3.0])}, "nan"),
        ({"arrival": None}, "needs arrival times"),
        ({"concurrency": 0}, "got 0"),
        ({"arrival": None, "concurrency": 0}, "got 0"),
        ({"arrival": None, "concurrency": True}, "True"),
        (
            {
                "prompt_tokens": np.array([], dtype=np.int64),
                "output_tokens": np.array([], dtype=np.int64),
                "arrival": np.array([]),
            },
            "no requests",
        ),
    ],
)
def test_workload_rejects(changes: dict[str, Any], fragment: str) -> None:
    with raises(fragment):
        open_workload(**changes)


# ---------------------------------------------------------------- synthetic workloads


def test_synthetic_open_loop_defaults() -> None:
    w = synthetic_workload(input_len=2000, output_len=300, rate=12.0, num_requests=50)
    assert w.num_requests == 50
    assert w.concurrency is None
    assert arrivals(w).dtype == np.float64
    assert w.prompt_tokens.dtype == np.int64
    assert w.output_tokens.dtype == np.int64
    assert set(w.prompt_tokens.tolist()) == {2000}
    assert set(w.output_tokens.tolist()) == {300}


def test_synthetic_closed_loop() -> None:
    w = synthetic_workload(
        input_len=100, output_len=10, input_dist="uniform", concurrency=8, num_requests=40
    )
    assert w.arrival is None
    assert w.concurrency == 8
    assert w.num_requests == 40
    assert w.prompt_tokens.min() >= 50
    assert w.prompt_tokens.max() <= 150


def test_synthetic_rate_matches_poisson() -> None:
    w = synthetic_workload(input_len=10, output_len=10, rate=4.0, num_requests=20_000, seed=9)
    gaps = gaps_of(arrivals(w))
    assert stats.kstest(gaps, stats.expon(scale=0.25).cdf).pvalue > 1e-3


def test_synthetic_infinite_rate() -> None:
    w = synthetic_workload(input_len=10, output_len=10, rate=math.inf, num_requests=5)
    assert np.array_equal(arrivals(w), np.zeros(5))


def drawn(**arrival_settings: Any) -> Workload:
    """A workload with drawn (not fixed) prompt and output lengths."""
    return synthetic_workload(
        input_len=1000,
        output_len=200,
        input_dist="lognormal",
        output_dist="uniform",
        **arrival_settings,
    )


def test_synthetic_same_seed_same_workload() -> None:
    a = drawn(rate=3.0, burstiness=0.5, num_requests=200, seed=7)
    b = drawn(rate=3.0, burstiness=0.5, num_requests=200, seed=7)
    c = drawn(rate=3.0, burstiness=0.5, num_requests=200, seed=8)
    assert a == b
    assert not np.array_equal(arrivals(a), arrivals(c))
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert not np.array_equal(a.output_tokens, c.output_tokens)


def test_synthetic_lengths_do_not_depend_on_the_arrival_process() -> None:
    base = drawn(rate=1.0, num_requests=300, seed=5)
    others = [
        drawn(rate=50.0, num_requests=300, seed=5),
        drawn(rate=1.0, burstiness=0.2, num_requests=300, seed=5),
        drawn(rate=math.inf, num_requests=300, seed=5),
        drawn(concurrency=4, num_requests=300, seed=5),
    ]
    for other in others:
        assert np.array_equal(other.prompt_tokens, base.prompt_tokens)
        assert np.array_equal(other.output_tokens, base.output_tokens)
    assert not np.array_equal(arrivals(base), arrivals(others[0]))


def test_synthetic_input_and_output_streams_are_independent() -> None:
    w = synthetic_workload(
        input_len=500,
        output_len=500,
        input_dist="lognormal",
        output_dist="lognormal",
        rate=1.0,
        num_requests=2000,
    )
    assert not np.array_equal(w.prompt_tokens, w.output_tokens)
    assert abs(np.corrcoef(np.log(w.prompt_tokens), np.log(w.output_tokens))[0, 1]) < 0.1


def test_synthetic_duration() -> None:
    w = drawn(rate=20.0, duration=100.0, seed=2)
    assert arrivals(w)[-1] < 100.0
    assert abs(w.num_requests - 2000) < 200
    longer = drawn(rate=20.0, duration=200.0, seed=2)
    n = w.num_requests
    assert np.allclose(arrivals(longer)[:n], arrivals(w))
    assert np.array_equal(longer.prompt_tokens[:n], w.prompt_tokens)
    assert np.array_equal(longer.output_tokens[:n], w.output_tokens)


def test_synthetic_num_requests_caps_duration() -> None:
    full = drawn(rate=20.0, duration=100.0, seed=2)
    capped = drawn(rate=20.0, duration=100.0, num_requests=50, seed=2)
    assert capped.num_requests == 50
    assert np.array_equal(arrivals(capped), arrivals(full)[:50])
    assert np.array_equal(capped.prompt_tokens, full.prompt_tokens[:50])
    assert np.array_equal(capped.output_tokens, full.output_tokens[:50])
    roomy = drawn(rate=20.0, duration=1.0, num_requests=10_000, seed=2)
    assert roomy.num_requests < 100


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_requests": 10}, "give a rate"),
        ({"rate": 1.0}, "num_requests or duration"),
        ({"concurrency": 2}, "needs num_requests"),
        ({"concurrency": 2, "num_requests": 10, "duration": 5.0}, "duration 5.0"),
        ({"concurrency": 2, "num_requests": 10, "burstiness": 0.5}, "burstiness 0.5"),
        ({"concurrency": 0, "num_requests": 10}, "concurrency must be >= 1, got 0"),
        ({"rate": -1.0, "num_requests": 10}, "-1.0"),
        ({"rate": 0.0, "num_requests": 10}, "got 0.0"),
        ({"rate": 1.0, "num_requests": 0}, "got 0"),
        ({"rate": 1.0, "num_requests": 10, "burstiness": -2.0}, "-2.0"),
        ({"rate": 1.0, "duration": -3.0}, "-3.0"),
        ({"rate": math.inf, "duration": 3.0}, "infinite arrival rate"),
        ({"rate": 1e-6, "duration": 1.0}, "duration 1.0"),
        ({"rate": 1.0, "num_requests": 10, "input_dist": "zipf"}, "zipf"),
        ({"rate": 1.0, "num_requests": 10, "output_dist": "uniform:2"}, "2.0"),
        ({"rate": 1.0, "num_requests": 10, "input_len": 0}, "input_len"),
        ({"rate": 1.0, "num_requests": 10, "output_len": -4}, "-4"),
        ({"rate": 1.0, "num_requests": 10, "seed": -1}, "seed"),
    ],
)
def test_synthetic_rejects(kwargs: dict[str, Any], fragment: str) -> None:
    arguments: dict[str, Any] = {"input_len": 100, "output_len": 10, **kwargs}
    with raises(fragment):
        synthetic_workload(**arguments)


# ---------------------------------------------------------------- real traces


@pytest.fixture(scope="module")
def azure() -> Workload:
    return read_trace(AZURE)


@needs_azure
def test_azure_trace_matches_its_readme(azure: Workload) -> None:
    assert azure.num_requests == 19_366
    assert azure.prompt_tokens.mean() == pytest.approx(1155, abs=1)
    assert azure.output_tokens.mean() == pytest.approx(211, abs=1)
    arrival = arrivals(azure)
    assert arrival[0] == 0.0
    assert (np.diff(arrival) >= 0).all()
    assert arrival[-1] / 60 == pytest.approx(58, abs=1)
    assert azure.num_requests / arrival[-1] == pytest.approx(5.5, abs=0.1)


@needs_azure
def test_azure_trace_matches_an_independent_parse(azure: Workload) -> None:
    with AZURE.open(newline="") as file:
        rows = list(csv.DictReader(file))
    stamps = np.array([row["TIMESTAMP"] for row in rows], dtype="datetime64[ns]")
    order = np.argsort(stamps, kind="stable")
    seconds = (stamps - stamps.min()).astype(np.int64)[order] / 1e9
    prompt = np.array([int(row["ContextTokens"]) for row in rows])[order]
    output = np.array([int(row["GeneratedTokens"]) for row in rows])[order]
    assert np.allclose(arrivals(azure), seconds, rtol=0, atol=1e-9)
    assert np.array_equal(azure.prompt_tokens, prompt)
    assert np.array_equal(azure.output_tokens, output)
    # 18:15:50.9951690 - 18:15:46.6805900, all seven fractional digits kept.
    assert arrivals(azure)[1] == pytest.approx(4.314579, abs=1e-9)


@needs_azure
def test_trace_speed_and_limit(azure: Workload) -> None:
    fast = read_trace(AZURE, speed=2.0)
    slow = read_trace(str(AZURE), speed=0.5)
    assert np.allclose(arrivals(fast), arrivals(azure) / 2, rtol=1e-12, atol=0)
    assert np.allclose(arrivals(slow), arrivals(azure) * 2, rtol=1e-12, atol=0)
    assert np.array_equal(fast.prompt_tokens, azure.prompt_tokens)
    first = read_trace(AZURE, limit=100)
    assert first.num_requests == 100
    assert np.array_equal(arrivals(first), arrivals(azure)[:100])
    assert np.array_equal(first.output_tokens, azure.output_tokens[:100])
    assert read_trace(AZURE, limit=10**9) == azure


@needs_mooncake
def test_mooncake_trace_in_seconds() -> None:
    trace = read_trace(MOONCAKE)
    records = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    milliseconds = np.array([r["timestamp"] for r in records], dtype=np.float64)
    order = np.argsort(milliseconds, kind="stable")
    assert trace.num_requests == 12_031
    arrival = arrivals(trace)
    assert arrival[0] == 0.0
    assert (np.diff(arrival) >= 0).all()
    assert np.allclose(arrival, (milliseconds[order] - milliseconds.min()) / 1000)
    assert arrival[-1] / 60 == pytest.approx(59, abs=1)
    assert np.array_equal(trace.prompt_tokens, [records[i]["input_length"] for i in order])
    assert np.array_equal(trace.output_tokens, [records[i]["output_length"] for i in order])
    assert trace.prompt_tokens.mean() == pytest.approx(12_000, rel=0.05)


# ---------------------------------------------------------------- generic traces

# Out of order, with a tie at 3.0 (rows 2 and 4) whose file order must survive the sort.
GENERIC: dict[str, list[Any]] = {
    "arrival": [13.0, 3.0, 11.5, 3.0],
    "prompt_tokens": [10, 20, 30, 40],
    "output_tokens": [1, 2, 3, 4],
}
GENERIC_EXPECTED = Workload(
    prompt_tokens=np.array([20, 40, 30, 10], dtype=np.int64),
    output_tokens=np.array([2, 4, 3, 1], dtype=np.int64),
    arrival=np.array([0.0, 0.0, 8.5, 10.0]),
    concurrency=None,
)


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def records_of(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def test_generic_csv_sorts_stably_and_shifts(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    pl.DataFrame(GENERIC).write_csv(path)
    assert read_trace(path) == GENERIC_EXPECTED


def test_many_ties_keep_file_order(tmp_path: Path) -> None:
    times = rng(4).integers(0, 5, size=500).astype(np.float64)
    path = tmp_path / "ties.parquet"
    pl.DataFrame(
        {"arrival": times, "prompt_tokens": np.arange(1, 501), "output_tokens": np.ones(500, int)}
    ).write_parquet(path)
    trace = read_trace(path)
    expected = sorted(range(500), key=lambda row: times[row])  # sorted() is stable
    assert np.array_equal(trace.prompt_tokens, np.array(expected) + 1)
    assert np.array_equal(arrivals(trace), times[expected] - times.min())


@pytest.mark.parametrize(
    "names",
    [
        ("arrival", "prompt_tokens", "output_tokens"),
        ("timestamp", "input_tokens", "output_length"),
        ("timestamp", "input_length", "output_length"),
        ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
        ("Arrival", "Prompt_Tokens", "OUTPUT_TOKENS"),
    ],
)
@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".json", ".parquet"])
def test_generic_formats_and_column_names(
    tmp_path: Path, names: tuple[str, str, str], suffix: str
) -> None:
    frame = pl.DataFrame(
        {
            names[0]: GENERIC["arrival"],
            names[1]: GENERIC["prompt_tokens"],
            names[2]: GENERIC["output_tokens"],
            "ignored": ["a", "b", "c", "d"],
        }
    )
    path = tmp_path / f"trace{suffix}"
    if suffix == ".csv":
        frame.write_csv(path)
    elif suffix == ".jsonl":
        frame.write_ndjson(path)
    elif suffix == ".json":
        frame.write_json(path)
    else:
        frame.write_parquet(path)
    assert read_trace(path) == GENERIC_EXPECTED


def test_json_file_with_one_record_per_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "trace.json", records_of(GENERIC))
    assert read_trace(path) == GENERIC_EXPECTED


def test_datetime_columns(tmp_path: Path) -> None:
    stamps = [
        "2024-01-01 00:00:13",
        "2024-01-01 00:00:03",
        "2024-01-01T00:00:11.5",
        "2024-01-01 00:00:03",
    ]
    strings = {**GENERIC, "timestamp": stamps}
    del strings["arrival"]
    csv_path = tmp_path / "strings.csv"
    pl.DataFrame(strings).write_csv(csv_path)
    jsonl_path = write_jsonl(tmp_path / "strings.jsonl", records_of(strings))
    parquet_path = tmp_path / "datetimes.parquet"
    pl.DataFrame(strings).with_columns(
        pl.col("timestamp").str.to_datetime(time_unit="us", time_zone="UTC")
    ).write_parquet(parquet_path)
    for path in (csv_path, jsonl_path, parquet_path):
        assert read_trace(path) == GENERIC_EXPECTED, path


def test_integer_valued_float_tokens_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "floats.parquet"
    pl.DataFrame(GENERIC).with_columns(pl.col("prompt_tokens").cast(pl.Float64)).write_parquet(path)
    assert read_trace(path) == GENERIC_EXPECTED


def test_hash_ids_mark_mooncake_milliseconds(tmp_path: Path) -> None:
    records = [
        {"timestamp": 3000, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 1000, "input_length": 20, "output_length": 2, "hash_ids": [0]},
    ]
    trace = read_trace(write_jsonl(tmp_path / "mooncake.jsonl", records))
    assert np.array_equal(arrivals(trace), [0.0, 2.0])
    for record in records:
        del record["hash_ids"]
    plain = read_trace(write_jsonl(tmp_path / "seconds.jsonl", records))
    assert np.array_equal(arrivals(plain), [0.0, 2000.0])


def test_arrival_column_wins_over_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "both.csv"
    pl.DataFrame({**GENERIC, "timestamp": [0, 0, 0, 0]}).write_csv(path)
    assert read_trace(path) == GENERIC_EXPECTED


# ---------------------------------------------------------------- trace errors


def test_missing_file(tmp_path: Path) -> None:
    with raises("not found", "nope.csv"):
        read_trace(tmp_path / "nope.csv")


def test_directory_is_not_a_trace(tmp_path: Path) -> None:
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    with raises("not a file", "folder.csv"):
        read_trace(folder)


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("arrival,prompt_tokens,output_tokens\n0,1,1\n")
    with raises("'.txt'", "trace.txt"):
        read_trace(path)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_empty_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"empty{suffix}"
    path.touch()
    with raises("empty", str(path)):
        read_trace(path)


def test_header_only_csv(tmp_path: Path) -> None:
    path = tmp_path / "header.csv"
    path.write_text("arrival,prompt_tokens,output_tokens\n")
    with raises("no requests", "header.csv"):
        read_trace(path)


@pytest.mark.parametrize(
    ("name", "content", "named"),
    [
        ("broken.jsonl", '{"arrival": 0, "prompt_tokens": 3\n', "broken.jsonl line 1: not JSON"),
        ("broken.json", '[{"arrival": 0, "prompt_tokens": 3}', "cannot read"),
        ("broken.parquet", "this is not parquet", "cannot read"),
        ("ragged.csv", "a,b\n1,2,3,4\n", "ragged.csv line 2: 4 fields where the header has 2"),
        ("quote.csv", 'arrival,prompt_tokens,output_tokens\n0,10,5\n1,"abc\n',
         "quote.csv line 3: 2 fields where the header has 3"),
    ],
)
def test_malformed_content(tmp_path: Path, name: str, content: str, named: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with raises(named, name):
        read_trace(path)


@pytest.mark.parametrize(
    ("drop", "looked_for"),
    [
        ("arrival", ["arrival", "timestamp"]),
        ("prompt_tokens", ["prompt_tokens", "input_length", "input_tokens", "ContextTokens"]),
        ("output_tokens", ["output_tokens", "output_length", "GeneratedTokens"]),
    ],
)
def test_missing_columns(tmp_path: Path, drop: str, looked_for: list[str]) -> None:
    path = tmp_path / "partial.csv"
    pl.DataFrame(GENERIC).drop(drop).write_csv(path)
    with raises("partial.csv", *looked_for):
        read_trace(path)


@pytest.mark.parametrize(
    ("column", "values", "fragments"),
    [
        # Lines as an editor shows them: the header is line 1, the first record line 2.
        ("prompt_tokens", [10, 20, 0, 40], ["prompt_tokens", "token count 0", "line 4"]),
        ("output_tokens", [1, -2, 3, 4], ["output_tokens", "-2", "line 3"]),
        ("prompt_tokens", [10, 2.5, 30, 40], ["prompt_tokens", "2.5", "line 3"]),
        ("output_tokens", [1, 2, 3, 0.5], ["output_tokens", "0.5", "line 5"]),
        ("prompt_tokens", ["10", "abc", "30", "40"], ["prompt_tokens", "'abc'", "line 3"]),
    ],
)
def test_bad_token_counts_csv(
    tmp_path: Path, column: str, values: list[object], fragments: list[str]
) -> None:
    path = tmp_path / "bad.csv"
    lines = ["arrival,prompt_tokens,output_tokens"]
    for i, value in enumerate(values):
        row = {"arrival": i, "prompt_tokens": 5, "output_tokens": 5, column: value}
        lines.append(f"{row['arrival']},{row['prompt_tokens']},{row['output_tokens']}")
    path.write_text("\n".join(lines) + "\n")
    with raises("bad.csv", *fragments):
        read_trace(path)


def test_missing_token_count_jsonl(tmp_path: Path) -> None:
    records = records_of(GENERIC)
    records[2]["output_tokens"] = None
    with raises("gaps.jsonl", "output_tokens", "no value", "line 3"):
        read_trace(write_jsonl(tmp_path / "gaps.jsonl", records))


def test_non_numeric_token_type(tmp_path: Path) -> None:
    records = records_of(GENERIC)
    for record in records:
        record["prompt_tokens"] = [1, 2]
    with raises("lists.jsonl line 1", "prompt_tokens is [1, 2] (a list of numbers); expected a number"):
        read_trace(write_jsonl(tmp_path / "lists.jsonl", records))


def test_unparseable_timestamps(tmp_path: Path) -> None:
    later = tmp_path / "later.csv"
    later.write_text(
        "timestamp,prompt_tokens,output_tokens\n"
        "2023-11-16 18:15:46.6805900,1,1\n2023-11-16 18:15:47.0000000,1,1\nyesterday,1,1\n"
    )
    with raises("later.csv", "'yesterday'", "line 4"):
        read_trace(later)
    first = tmp_path / "first.csv"
    first.write_text("timestamp,prompt_tokens,output_tokens\nnope,1,1\n2023-11-16 18:15:47,1,1\n")
    with raises("first.csv", "'nope'", "line 2"):
        read_trace(first)


def test_missing_and_non_finite_arrivals(tmp_path: Path) -> None:
    records = records_of(GENERIC)
    records[1]["arrival"] = None
    with raises("null.jsonl", "arrival", "no value", "line 2"):
        read_trace(write_jsonl(tmp_path / "null.jsonl", records))
    path = tmp_path / "nan.parquet"
    pl.DataFrame({**GENERIC, "arrival": [0.0, 1.0, math.nan, 2.0]}).write_parquet(path)
    with raises("nan.parquet", "nan", "row 3"):  # a Parquet file has rows, counted from 1
        read_trace(path)


def test_arrival_of_the_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "bools.parquet"
    pl.DataFrame({**GENERIC, "arrival": [True, False, True, False]}).write_parquet(path)
    with raises("bools.parquet", "Boolean"):
        read_trace(path)


@pytest.mark.parametrize("speed", [0.0, -1.0, math.nan, math.inf])
def test_bad_speed(tmp_path: Path, speed: float) -> None:
    path = tmp_path / "trace.csv"
    pl.DataFrame(GENERIC).write_csv(path)
    with raises(f"got {speed}"):
        read_trace(path, speed=speed)


@pytest.mark.parametrize("limit", [0, -5])
def test_bad_limit(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "trace.csv"
    pl.DataFrame(GENERIC).write_csv(path)
    with raises(f"got {limit}"):
        read_trace(path, limit=limit)
