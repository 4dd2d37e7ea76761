"""Synthetic workloads: drawn lengths with gamma arrivals (open loop) or N clients (closed loop)."""

from __future__ import annotations

import math

import numpy as np

from simulator.errors import InputError
from workloads.arrivals import arrivals_until, poisson_arrivals
from workloads.lengths import LengthDist, parse_length_dist
from workloads.workload import Workload


def length_dists(input_len: int, output_len: int, input_dist: str, output_dist: str) -> tuple[LengthDist, LengthDist]:
    """The prompt and output length distributions, once both means are whole numbers of tokens."""
    for name, value in (("input_len", input_len), ("output_len", output_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be an integer >= 1 tokens, got {value!r}")
    return parse_length_dist(input_dist), parse_length_dist(output_dist)


def check_settings(rate: float | None, concurrency: int | None, num_requests: int | None, seed: int,
                   burstiness: float) -> None:
    """Refuse neither a rate nor a concurrency, a count or seed that is not a whole number, and a
    burstiness that is not positive (what only one loop takes is checked with that loop)."""
    if rate is None and concurrency is None:
        raise InputError("give a rate (open loop), a concurrency (closed loop), or both (an open loop capped at "
                         "that many requests in flight)")
    if num_requests is not None and (
        isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1
    ):
        raise InputError(f"number of requests must be an integer >= 1, got {num_requests!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"seed must be an integer >= 0, got {seed!r}")
    if math.isnan(burstiness) or burstiness <= 0:
        raise InputError(f"burstiness must be > 0, got {burstiness}")


def open_loop_arrivals(rate: float, burstiness: float, num_requests: int | None, duration: float | None,
                       rng: np.random.Generator) -> np.ndarray:
    """Arrival times of `num_requests` requests, or of those within `duration` (at most `num_requests`)."""
    if duration is not None:
        arrival = arrivals_until(rate, duration, burstiness, rng)[:num_requests]
        if arrival.size == 0:
            raise InputError(
                f"no request arrives within --duration {duration} s at --rate {rate}/s; "
                f"raise the rate or the duration"
            )
        return arrival
    if num_requests is not None:
        return poisson_arrivals(rate, num_requests, burstiness, rng)
    raise InputError("an open-loop workload needs num_requests or duration")


def closed_loop_requests(burstiness: float, num_requests: int | None, duration: float | None) -> int:
    """The request count of a closed loop, which takes neither a duration nor a burstiness."""
    if duration is not None:
        raise InputError(
            f"duration {duration} is not supported for a closed loop (concurrency); "
            f"give num_requests instead"
        )
    if burstiness != 1.0:
        raise InputError(
            f"burstiness {burstiness} applies only to an open loop (rate), not to concurrency"
        )
    if num_requests is None:
        raise InputError("a closed-loop workload (concurrency) needs num_requests")
    return num_requests


def synthetic_workload(
    *,
    input_len: int,
    output_len: int,
    input_dist: str = "fixed",
    output_dist: str = "fixed",
    rate: float | None = None,
    burstiness: float = 1.0,
    concurrency: int | None = None,
    num_requests: int | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> Workload:
    """Build a synthetic workload; the same arguments always give the same workload.

    Give `rate` (open loop, requests/s, inf = all at once), `concurrency` (closed loop), or both
    (an open loop whose client holds at most `concurrency` requests in flight). An open loop needs
    `num_requests` or `duration` (seconds; with both, `num_requests` caps the count). A closed loop
    needs `num_requests`.

    Arrivals, prompt lengths and output lengths come from three independent streams spawned from
    `seed`, so changing the rate or burstiness leaves the lengths of a given seed unchanged (and a
    longer run extends a shorter one's lengths rather than redrawing them).
    """
    input_lengths, output_lengths = length_dists(input_len, output_len, input_dist, output_dist)
    check_settings(rate, concurrency, num_requests, seed, burstiness)
    arrival_rng, input_rng, output_rng = np.random.default_rng(seed).spawn(3)
    arrival: np.ndarray | None
    if rate is not None:
        arrival = open_loop_arrivals(rate, burstiness, num_requests, duration, arrival_rng)
        n = arrival.size
    else:
        arrival, n = None, closed_loop_requests(burstiness, num_requests, duration)
    return Workload(
        prompt_tokens=input_lengths.sample(input_len, n, input_rng),
        output_tokens=output_lengths.sample(output_len, n, output_rng),
        arrival=arrival,
        concurrency=concurrency,
    )
