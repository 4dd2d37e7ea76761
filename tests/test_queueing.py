"""Queueing theory as an independent reference for the engine's clock.

`static` with `max_batch_size` 1, `max_queue_delay` 0, fixed lengths and Poisson arrivals is an
M/D/1 queue: one server, FIFO, every request served in the same deterministic time D. D is
computed here from the cost model alone — one prefill step of the prompt, then (output_len - 1)
decode steps whose context grows by one token each — never read back from the run.

The statistical checks (Pollaczek–Khinchine, utilisation) use output_len = 1, so D is a single
prefill step: every simulated request is then one engine step, which buys ~10x more requests per
second of test time, and the mean wait's statistical error is what limits this test. The
multi-step service time (prefill + decode steps at growing context) is checked exactly instead,
where no statistics are needed: request by request against Lindley's recursion, and by a closed
loop of one client whose throughput is 1/D.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from simulator.config import RunConfig
from simulator.cost import StepShape, build_cost_model
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate

PROMPT = 2000


def service_time(prompt: int, output: int) -> float:
    """D: prefill of the whole prompt (context = prompt), then one decode step per further token,
    the k-th at context prompt + k (the context counts the token computed in that step)."""
    config = RunConfig()  # the runs below use the default cost model
    cost = build_cost_model(config, load_model(config.model), load_gpu(config.gpu))
    prefill = cost.step_time(StepShape.from_rows([(prompt, prompt)]))
    return prefill + sum(cost.step_time(StepShape.from_rows([(1, prompt + k)])) for k in range(1, output))


def md1_config(rho: float, output: int, num_requests: int, seed: int) -> RunConfig:
    return RunConfig(policy="static", max_batch_size=1, max_queue_delay=0.0, rate=rho / service_time(PROMPT, output),
                     num_requests=num_requests, input_len=PROMPT, output_len=output, seed=seed)


def lindley_waits(arrival: np.ndarray, d: float) -> np.ndarray:
    """FIFO single server, deterministic service: W[n+1] = max(0, W[n] + D - (A[n+1] - A[n]))."""
    waits = np.empty_like(arrival)
    free = 0.0
    for i, a in enumerate(arrival.tolist()):
        start = max(a, free)
        waits[i] = start - a
        free = start + d
    return waits


# Run lengths, sized from measurements (Lindley's recursion on 40 seeds of 100,000 requests, and
# batch means on the simulator's own runs): the relative standard error of the mean wait is about
# 2.4% per 100,000 requests at rho = 0.8 (waits are strongly autocorrelated there) and about 1.2%
# at rho = 0.5, shrinking as 1/sqrt(n). With 8 x 150,000 = 1.2 M requests at 0.8 the error is
# ~0.7%, with 4 x 100,000 at 0.5 it is ~0.6%; the 3% tolerance is then >= 4 standard errors on
# both, and the test also recomputes the standard error by batch means and insists on that margin.
# The initial transient (the queue starts empty) biases the mean by well under 0.1% at these n.
# Measured (D = 41.49 ms, Llama-3.1-8B on H100, 2000-token prompt): rho 0.5 -> mean queue / P-K
# = 0.9974, batch-means standard error 0.48%; rho 0.8 -> 0.9945, standard error 0.60% (seeds
# range 0.975..1.012). Utilisation 0.5007 and 0.8004. Simulating the 1.6 M one-step requests
# takes ~25 s on a 2-core machine (the whole file ~27 s).
RUNS = {0.5: (4, 100_000), 0.8: (8, 150_000)}
TOLERANCE = 0.03
BATCHES_PER_RUN = 10  # batches of 10,000-15,000 requests, far longer than the waits' correlation time


@dataclass
class MD1Runs:
    rho: float
    d: float
    mean_queue: float
    """Mean over the seeds of each run's summary `mean_queue` (equal-sized runs)."""
    busy: float
    span: float
    batch_means: np.ndarray


@pytest.fixture(scope="module", params=sorted(RUNS), ids=lambda rho: f"rho={rho}")
def md1(request: pytest.FixtureRequest) -> MD1Runs:
    rho = request.param
    seeds, n = RUNS[rho]
    d = service_time(PROMPT, 1)
    mean_queue, busy, span, batch_means = [], [], [], []
    for seed in range(seeds):
        result = simulate(md1_config(rho, 1, n, seed))
        tables = build_tables(result)
        summary = summarize(result, tables)
        assert summary["completed"] == n and summary["unfinished"] == 0
        # Deterministic service: every step is exactly D, one per request.
        durations = tables.steps["duration"].to_numpy()
        assert len(durations) == n
        np.testing.assert_allclose(durations, d, rtol=1e-12)
        mean_queue.append(summary["mean_queue"])
        busy.append(float(durations.sum()))
        span.append(summary["duration"])
        queue = tables.requests["queue"].to_numpy()
        batch_means.extend(queue.reshape(BATCHES_PER_RUN, -1).mean(axis=1))
    return MD1Runs(rho, d, float(np.mean(mean_queue)), sum(busy), sum(span), np.array(batch_means))


def test_mean_queueing_delay_matches_pollaczek_khinchine(md1: MD1Runs) -> None:
    rho, d = md1.rho, md1.d
    lam = rho / d
    pk = lam * d**2 / (2 * (1 - rho))
    standard_error = float(md1.batch_means.std(ddof=1) / np.sqrt(len(md1.batch_means)))
    # The tolerance must be statistically meaningful: at least 3 standard errors.
    assert TOLERANCE * pk >= 3 * standard_error, (standard_error / pk, TOLERANCE)
    observed = md1.mean_queue
    assert observed == pytest.approx(pk, rel=TOLERANCE), (
        f"rho={rho}: mean queue {observed * 1e3:.3f} ms, P-K {pk * 1e3:.3f} ms, "
        f"ratio {observed / pk:.4f}, standard error {standard_error / pk:.4f} of P-K")


def test_utilisation_is_rho(md1: MD1Runs) -> None:
    # Busy time / (first arrival .. last finish); the arrival count in that span has a relative
    # standard deviation of 1/sqrt(n) <= 0.16%, so 1% is over 6 standard deviations.
    assert md1.busy / md1.span == pytest.approx(md1.rho, rel=0.01)


@pytest.mark.parametrize("output", [1, 12])
def test_every_wait_follows_lindleys_recursion(output: int) -> None:
    """Exact, request by request, with D including `output - 1` decode steps at growing context."""
    d = service_time(PROMPT, output)
    result = simulate(md1_config(0.8, output, 2000, seed=7))
    arrival = np.array([r.arrival for r in result.requests])
    queue = np.array([r.scheduled - r.arrival for r in result.requests])
    service = np.array([r.finish - r.scheduled for r in result.requests])
    np.testing.assert_allclose(service, d, rtol=1e-9)
    np.testing.assert_allclose(queue, lindley_waits(arrival, d), rtol=1e-9, atol=1e-9)
    assert (queue > 0).mean() == pytest.approx(0.8, abs=0.05)  # P(wait > 0) = rho for M/G/1


@pytest.mark.parametrize("output", [1, 12])
def test_closed_loop_of_one_client_never_queues(output: int) -> None:
    """Concurrency 1: each request arrives as the previous finishes, waits 0, and throughput is 1/D."""
    d = service_time(PROMPT, output)
    n = 200
    config = RunConfig(policy="static", max_batch_size=1, max_queue_delay=0.0, concurrency=1, num_requests=n,
                       input_len=PROMPT, output_len=output)
    result = simulate(config)
    summary = summarize(result, build_tables(result))
    assert summary["completed"] == n
    assert all(r.scheduled == r.arrival for r in result.requests)
    assert summary["mean_queue"] == 0.0
    assert summary["request_throughput"] == pytest.approx(1 / d, rel=1e-9)
    assert summary["utilisation"] == pytest.approx(1.0, rel=1e-9)
