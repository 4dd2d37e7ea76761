"""`--request-rate R --max-concurrency N`: vLLM's open loop capped at N requests in flight, where a
request due while N are in flight waits in the client and is sent, in turn, at the next finish."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from simulator.config import RunConfig
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate
from tests.helpers import UnitCost
from workloads import Workload


def capped(arrivals: list[float], prompts: list[int], outputs: list[int], cap: int) -> pl.DataFrame:
    workload = Workload(prompt_tokens=np.array(prompts, dtype=np.int64),
                        output_tokens=np.array(outputs, dtype=np.int64),
                        arrival=np.array(arrivals, dtype=np.float64), concurrency=cap)
    config = RunConfig(policy="chunked", rate=1.0, concurrency=cap)
    return build_tables(simulate(config, workload, UnitCost())).requests  # type: ignore[arg-type]


def test_a_cap_of_one_sends_each_request_at_the_last_ones_finish() -> None:
    """By hand, 1 s per step, 10-token prompts and 2-token answers: each request takes two steps
    (prefill with its first token, one decode). Request 0 runs 0-2; request 1, due at 0.1, is sent at
    2 and runs 2-4; 2 runs 4-6; 3 runs 6-8; request 4, due at 5 while 2 ran, waits behind 3 and runs 8-10."""
    requests = capped([0.0, 0.1, 0.2, 0.3, 5.0], [10] * 5, [2] * 5, cap=1)
    assert requests["arrival"].to_list() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert requests["ttft"].to_list() == [1.0] * 5  # counted from the send, as vllm bench serve counts it
    assert requests["e2el"].to_list() == [2.0] * 5


def test_a_cap_of_two_holds_the_third_request_until_a_slot_frees() -> None:
    """Three due at once with room for two: the two run together (prefill 0-1, decode 1-2, a 3-token
    answer's last decode 2-3 for request 1), and the third is sent at the first finish, t = 2."""
    requests = capped([0.0, 0.0, 0.0], [10, 10, 10], [2, 3, 2], cap=2)
    assert requests["arrival"].to_list() == [0.0, 0.0, 2.0]
    assert requests["finish"].to_list()[:2] == [2.0, 3.0]


def test_a_cap_that_never_binds_is_the_open_loop() -> None:
    open_loop = simulate(RunConfig(rate=12.0, num_requests=200, input_len=500, output_len=50))
    capped_loop = simulate(RunConfig(rate=12.0, concurrency=200, num_requests=200, input_len=500, output_len=50))
    assert build_tables(capped_loop).requests.equals(build_tables(open_loop).requests)


@pytest.mark.parametrize("cap", [1, 4, 16])
def test_no_more_than_the_cap_are_ever_in_flight(cap: int) -> None:
    result = simulate(RunConfig(rate=20.0, concurrency=cap, num_requests=150, input_len=400, output_len=40, seed=2))
    requests = build_tables(result).requests
    starts, ends = requests["arrival"].to_numpy(), requests["finish"].to_numpy()
    events = np.concatenate([np.stack([starts, np.ones_like(starts)], 1), np.stack([ends, -np.ones_like(ends)], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # a finish frees its slot before a send at that instant
    peak = np.cumsum(events[:, 1]).max()
    assert peak <= cap and (peak == cap or cap == 16)  # 20 req/s of these fill 1 and 4 slots, not 16
    assert np.all(np.diff(starts) >= 0)  # sent in the order they were due
    summary = summarize(result, build_tables(result))
    assert summary["load"] == "capped open loop" and summary["completed"] == 150


def test_an_infinite_rate_with_a_cap_is_the_closed_loop() -> None:
    closed = simulate(RunConfig(concurrency=8, num_requests=60, input_len=300, output_len=30))
    capped_inf = simulate(RunConfig(rate=float("inf"), concurrency=8, num_requests=60, input_len=300, output_len=30))
    assert build_tables(capped_inf).requests.equals(build_tables(closed).requests)
