"""Workloads: what is sent to the server, before any server exists. Arrival processes, token-length
distributions, synthetic workloads, trace readers, shared prefixes and multi-turn sessions, as
plain arrays (`Workload`). May import only `simulator.errors`.

`read_trace` is imported on first use: the trace readers need polars, which a synthetic run never
loads."""

from typing import Any

from workloads.arrivals import arrivals_until, poisson_arrivals
from workloads.lengths import LengthDist, parse_length_dist
from workloads.synthetic import synthetic_workload
from workloads.workload import Workload

__all__ = [
    "LengthDist",
    "Workload",
    "arrivals_until",
    "parse_length_dist",
    "poisson_arrivals",
    "read_trace",
    "synthetic_workload",
]


def __getattr__(name: str) -> Any:
    if name == "read_trace":
        from workloads.traces import read_trace

        return read_trace
    raise AttributeError(f"module 'workloads' has no attribute {name!r}")
