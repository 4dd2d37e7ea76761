"""The plan's capacities against exact references: a server that runs one request at a time on fixed
lengths is an M/D/1 queue (its TTFT is an M/D/1 wait plus the prefill), so its capacity under a
p90-TTFT SLO is the arrival rate at which M/D/1's waiting-time distribution (Erlang's formula)
meets the limit; and k replicas behind the random router each see a Poisson stream of R/k."""

from __future__ import annotations

import math

import numpy as np

from simulator.config import DEFAULTS, RunConfig
from simulator.plan.capacity import find_capacity, probe
from simulator.plan.slo import build_slos
from simulator.run.simulate import simulate

SERVER = {k: v for k, v in DEFAULTS.items() if k not in ("rate", "num_requests", "percentiles", "goodput")} | {
    "policy": "chunked", "max_num_seqs": 1, "max_num_batched_tokens": 512, "input_len": 200, "output_len": 2}


def md1_wait_cdf(t: float, rate: float, service: float) -> float:
    """P(W <= t) for M/D/1 FCFS (Erlang 1909, Crommelin 1932):
    (1 - rho) * sum_{k=0}^{floor(t/D)} (lambda (k D - t))^k / k! * exp(-lambda (k D - t))."""
    rho = rate * service
    total = 0.0
    for k in range(math.floor(t / service) + 1):
        x = rate * (k * service - t)
        total += x**k / math.factorial(k) * math.exp(-x)
    return (1 - rho) * total


def md1_capacity(limit: float, quantile: float, service: float) -> float:
    """The arrival rate at which the `quantile` of M/D/1's wait equals `limit` (bisection on the rate)."""
    low, high = 1e-9, (1 - 1e-9) / service
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if md1_wait_cdf(limit, middle, service) >= quantile else (low, middle)
    return low


def test_md1_formula_matches_its_known_mean() -> None:
    # The mean wait from the CDF (integral of the tail) is Pollaczek-Khinchine's rho D / (2 (1 - rho)).
    rate, service = 0.7, 1.0
    grid = np.linspace(0, 20, 8001)  # past 20 D the tail is below 1e-5 (and the sum loses digits)
    tail = np.array([1 - md1_wait_cdf(t, rate, service) for t in grid])
    mean = float(np.sum((tail[1:] + tail[:-1]) / 2 * np.diff(grid)))
    assert math.isclose(mean, rate * service / (2 * (1 - rate)), rel_tol=2e-3)


def test_one_request_at_a_time_has_the_md1_capacity_for_a_p90_ttft_slo() -> None:
    alone = simulate(RunConfig(**SERVER, rate=1.0, num_requests=1)).requests
    prefill = float(alone.first_token[0] - alone.arrival[0])
    service = float(alone.finish[0] - alone.arrival[0])
    limit = prefill + 3 * service  # TTFT = wait + prefill
    slos = build_slos((f"p90_ttft_ms<={limit * 1e3}",), None, (), None)
    expected = md1_capacity(limit - prefill, 0.9, service)
    capacity = find_capacity(lambda rate: probe(SERVER, slos, rate, 20_000), expected / 2, precision=0.02)
    assert capacity.failed_rate is not None
    # The bracket (2% wide) holds the theory's rate, allowing the p90 of 20,000 correlated waits its noise.
    assert capacity.max_rate <= expected * 1.04 and capacity.failed_rate >= expected * 0.96, (
        capacity.max_rate, capacity.failed_rate, expected)


def test_replicas_behind_the_random_router_see_one_replicas_stream_thinned() -> None:
    # Four replicas at 4R: each sees Poisson R, so the latency distribution is one replica's at R.
    server = SERVER | {"max_num_seqs": 64, "output_len": 20, "seed": 3}
    one = simulate(RunConfig(**server, rate=40.0, num_requests=8000)).requests
    random = server | {"num_replicas": 4, "router": "random"}
    four = simulate(RunConfig(**random, rate=160.0, num_requests=32000)).requests
    for quantile in (50, 90, 99):
        single = np.percentile(one.finish - one.arrival, quantile)
        fleet = np.percentile(four.finish - four.arrival, quantile)
        assert math.isclose(single, fleet, rel_tol=0.05), (quantile, single, fleet)
    # Round robin is no such thinning: its replicas see smoother streams and shorter tails.
    robin = simulate(RunConfig(**server | {"num_replicas": 4}, rate=160.0, num_requests=32000)).requests
    assert np.percentile(robin.finish - robin.arrival, 99) < np.percentile(four.finish - four.arrival, 99)
