"""A run's result: its settings, what it ran on, every request's columns and the step log."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from simulator.config import RunConfig
from simulator.deploy.hardware import GpuSpec
from simulator.deploy.model import ModelSpec
from simulator.engine.offload import HostTier
from simulator.engine.request import RequestColumns
from simulator.engine.steplog import StepLog
from simulator.fleet.engine import FleetResult, Pool
from workloads import Workload


@dataclass
class RunResult:
    config: RunConfig
    model: ModelSpec
    gpu: GpuSpec
    kv_blocks: int
    requests: RequestColumns
    """Every request that arrived, in id (arrival) order."""
    log: StepLog
    num_requests: int
    """Requests in the workload, arrived or not."""
    end_time: float
    cost_extrapolated: dict[str, int]
    """Steps whose cost the model extrapolated beyond its measurements, by operator family."""
    cost_notes: tuple[str, ...]
    """What the cost model's tables stood in for, noted at load."""
    fleet: FleetResult | None = None
    """Servers, routing and transfers of a run of more than one server (`simulator.fleet.engine`)."""
    host: HostTier | None = None
    """The KV cache's host tier (`--kv-offload-gb`), where the run kept one."""


def run_result(config: RunConfig, model: ModelSpec, gpu: GpuSpec, pools: list[Pool], workload: Workload,
               requests: RequestColumns, log: StepLog, end_time: float, fleet: FleetResult | None = None) -> RunResult:
    """The result of a run of `workload` on `pools`: their cost models' extrapolations summed, their
    notes joined."""
    extrapolated: Counter[str] = Counter()
    notes: list[str] = []
    for pool in pools:
        extrapolated.update(pool.cost.extrapolated)
        notes += [note for note in pool.cost.notes if note not in notes]
    host = pools[-1].host if pools[-1].prefix_caching else None
    return RunResult(config, model, gpu, pools[-1].kv_blocks, requests, log, workload.num_requests, end_time,
                     dict(extrapolated), tuple(notes), fleet, host)
