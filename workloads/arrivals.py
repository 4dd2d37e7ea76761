"""Open-loop arrival processes: gamma-distributed gaps, as `vllm bench serve` draws them.

Inter-arrival gaps are Gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate, coefficient
of variation 1/sqrt(burstiness). Burstiness 1 is a Poisson process, below 1 is burstier, above 1 is
smoother, and infinity gives evenly spaced arrivals (vllm's limit case).

The first request arrives after the first gap, not at 0, so every gap (including the first) is a
draw from the same distribution and a Poisson process stays memoryless from time 0. This matches
vllm's cumulative sum of gaps. Unlike vllm, the times are not rescaled to make the last arrival
exactly n/rate: that rescaling conditions the process on its total and would no longer be Poisson.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from simulator.errors import InputError


def _check_rate(rate: float) -> None:
    if math.isnan(rate) or rate <= 0:
        raise InputError(f"arrival rate must be > 0 requests/s (or inf), got {rate}")


def _check_burstiness(burstiness: float) -> None:
    if math.isnan(burstiness) or burstiness <= 0:
        raise InputError(f"burstiness must be > 0, got {burstiness}")


def _gaps(
    rate: float, burstiness: float, n: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    if math.isinf(burstiness):
        return np.full(n, 1.0 / rate)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def poisson_arrivals(
    rate: float, n: int, burstiness: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Arrival times in seconds of `n` requests at `rate` requests/s; rate inf sends all at 0."""
    _check_rate(rate)
    _check_burstiness(burstiness)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"number of requests must be an integer >= 1, got {n!r}")
    if math.isinf(rate):
        return np.zeros(n)
    return np.cumsum(_gaps(rate, burstiness, int(n), rng))


def arrivals_until(
    rate: float, duration: float, burstiness: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Arrival times in seconds in [0, duration); may be empty when the rate is low."""
    _check_rate(rate)
    _check_burstiness(burstiness)
    if math.isinf(rate):
        raise InputError("an infinite arrival rate with a duration means infinitely many requests")
    if not duration > 0 or math.isinf(duration):
        raise InputError(f"duration must be a finite number of seconds > 0, got {duration}")
    expected = rate * duration
    chunk = int(expected + 5 * math.sqrt(expected)) + 16
    times: list[npt.NDArray[np.float64]] = []
    last = 0.0
    while last < duration:
        block = last + np.cumsum(_gaps(rate, burstiness, chunk, rng))
        times.append(block)
        last = float(block[-1])
    arrivals = np.concatenate(times)
    return arrivals[arrivals < duration]
