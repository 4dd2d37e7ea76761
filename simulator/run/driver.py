"""The one driver of the engine: a run's clock, its requests, its clients and its servers (one
server, or a fleet), run until the time limit, closed, and read back as columns.

`drive` is the run procedure every caller goes through (`simulate`, sweeps, fleets, `compare`'s
reruns); `run_engine` and `run_fleet` are it with one server or with pools, each with the signature
the tests' oracle engines implement (tests/oracle.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from simulator.cost import CostModel
from simulator.engine.clock import Clock
from simulator.engine.kv import KVBlocks
from simulator.engine.offload import HostTier
from simulator.engine.request import RequestColumns
from simulator.engine.server import Server
from simulator.engine.speculation import Speculation
from simulator.engine.step import Policy
from simulator.engine.steplog import StepLog
from simulator.fleet.engine import Fleet, FleetResult, Pool
from simulator.fleet.transfer import KVLink
from simulator.progress import RunProgress
from simulator.run.clients import ClientKind, Clients, Entry, Requests, workload_clients
from workloads import Workload

ServersT = TypeVar("ServersT", bound=Entry)

Engine = Callable[..., tuple[RequestColumns, StepLog, float]]
"""`run_engine`'s signature (the tests' oracle)."""
FleetEngine = Callable[[list[Pool], KVLink | None, Workload, float | None, Callable[[int, float], None] | None],
                       tuple[RequestColumns, StepLog, float, FleetResult]]
"""`run_fleet`'s signature (the tests' oracle fleet)."""


def drive(workload: Workload, time_limit: float | None, clients: ClientKind,
          servers: Callable[[Clock, Clients], ServersT]) -> tuple[RequestColumns, float, ServersT]:
    """Run `workload`, sent by `clients` to `servers` (built on the run's clock for those clients),
    until `time_limit` or until nothing is left; returns every request sent (in id order), the end
    time and the servers."""
    env = Clock()
    requests = Requests(workload)
    senders = clients(env, requests)
    entry = servers(env, senders)
    senders.start(entry)
    env.run(until=time_limit)
    entry.close()
    return requests.columns(), env.now, entry


def run_engine(policy: Policy, cost: CostModel, kv_blocks: int, block_size: int, workload: Workload,
               time_limit: float | None, on_step: Callable[[int, float], None] | None = None,
               prefix_caching: bool = False, clients: ClientKind = workload_clients,
               speculation: Speculation | None = None, host: HostTier | None = None,
               async_scheduling: bool = False, output_lag: bool = False) -> tuple[RequestColumns, StepLog, float]:
    """One server, fed by `clients` (by default the ones the workload says), speculating as
    `speculation` says (`simulator.engine.speculation`) or not at all; `host`: its KV cache's host
    tier."""
    log = StepLog()
    kv = KVBlocks(kv_blocks, block_size, prefix_caching, host)

    def server(env: Clock, senders: Clients) -> Server:
        return Server(env, policy, cost, kv, log, time_limit, on_finish=senders.on_finish, on_step=on_step,
                      speculation=speculation, async_scheduling=async_scheduling, output_lag=output_lag)

    requests, end_time, _ = drive(workload, time_limit, clients, server)
    return requests, log, end_time


def run_fleet(pools: list[Pool], link: KVLink | None, workload: Workload, time_limit: float | None,
              on_step: Callable[[int, float], None] | None = None, clients: ClientKind = workload_clients
              ) -> tuple[RequestColumns, StepLog, float, FleetResult]:
    """`pools` in one clock (one pool of replicas, or a prefill pool and a decode pool joined by
    `link`), fed by `clients`."""

    def fleet(env: Clock, senders: Clients) -> Fleet:
        return Fleet(env, pools, link, workload.num_requests, time_limit, on_step, senders.on_finish,
                     senders.arrivals)

    requests, end_time, servers = drive(workload, time_limit, clients, fleet)
    log, result = servers.result(len(requests))
    return requests, log, end_time, result


@contextmanager
def run_progress(num_requests: int, enabled: bool) -> Iterator[Callable[[int, float], None] | None]:
    """A run's progress bar on stderr while the run lasts: its `on_step` (None when not enabled)."""
    bar = RunProgress(num_requests, enabled=enabled)
    try:
        yield bar.update if enabled else None
    finally:
        bar.close()
