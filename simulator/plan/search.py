"""The search: every deployment of the space, its capacity found, bounded or derived, one row each.

Single servers come first: each one's capacity is searched (`simulator.plan.capacity`), in parallel
over `jobs` processes or on Ray (`simulator.plan.runner`), best analytic bound per GPU (or per
dollar) first. A server whose bound cannot beat the best capacity found is skipped, and one that
fails at the rate it needs to beat it (one probe) is screened out, unless the plan is exhaustive.
Replicas behind the random router are not simulated where the arrivals are a Poisson stream
(`simulator.plan.space.symmetric`): each of k replicas then sees a Poisson stream of R/k, so k of
them serve exactly k times one server's capacity with the same latencies. Replicas behind the other
routers and prefill/decode pools are then searched for the best `FLEET_CANDIDATES` servers of each
tensor-parallel size and GPU, from the random router's capacity up. With a target rate, the fewest
GPUs (or the cheapest) that serve it: every fleet size, each probed at the target, skipping those
that cost more than the cheapest found; one that serves it has its capacity searched up from the
target, its headroom then comparable with every other's. Every probe is kept in the plan folder
(`simulator.plan.resume`) for an interrupted plan to resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from simulator.config import DEFAULTS
from simulator.errors import InputError
from simulator.plan.capacity import (
    PRECISION,
    Capacity,
    Probe,
    deployment_bound,
    find_capacity,
    probe,
    requests_for,
)
from simulator.plan.resume import ProbeStore
from simulator.plan.runner import Runner
from simulator.plan.slo import Slos
from simulator.plan.space import (
    FLEET_SETTINGS,
    Deployment,
    pool_fleets,
    refusal,
    replica_fleets,
    routers_for,
    server_settings,
    symmetric,
)

FLEET_CANDIDATES = 2
"""Servers of each TP size and GPU whose fleets (other routers, P/D pools) are searched."""


@dataclass(frozen=True)
class PlanSpec:
    fixed: dict[str, Any]
    """Settings given one value."""
    axes: dict[str, list[Any]]
    """Settings given several values (searched)."""
    slos: Slos
    max_gpus: int = 8
    hourly_cost: dict[str, float] = field(default_factory=dict)
    """USD per GPU-hour by GPU profile."""
    target_rate: float | None = None
    precision: float = PRECISION
    jobs: int = 1
    exhaustive: bool = False
    """Search every deployment's capacity (a whole frontier): no bound or screen skips any."""
    seeds: int = 1
    """Seeds a close decision rests on (`simulator.plan.capacity.probe`)."""
    folder: str | None = None
    """Where probes are kept for a rerun to resume from (`simulator.plan.resume`)."""
    executor: str = "local"
    """Where deployments are searched (`simulator.plan.runner`): worker processes, or Ray."""
    address: str | None = None
    """The Ray cluster (None: a local Ray instance)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_gpus <= 4096:
            raise InputError(f"--max-gpus must be an integer in [1, 4096], got {self.max_gpus}")
        if not 0 < self.precision < 1:
            raise InputError(f"--precision must be in (0, 1), got {self.precision}")
        if not 1 <= self.seeds <= 100:
            raise InputError(f"--seeds must be an integer in [1, 100], got {self.seeds}")

    @property
    def gpus(self) -> list[str]:
        """The GPU types searched (--gpu, one or several)."""
        return [str(gpu) for gpu in self.axes.get("gpu") or [self.fixed.get("gpu", DEFAULTS["gpu"])]]

    @property
    def fleet_axes(self) -> dict[str, list[Any]]:
        """The fleet settings given, one value or several, as lists."""
        fixed = {name: [value] for name, value in self.fixed.items() if name in FLEET_SETTINGS}
        return fixed | {name: values for name, values in self.axes.items() if name in FLEET_SETTINGS}

    def price(self, deployment: Deployment) -> float | None:
        """USD per hour of `deployment`, None where its GPU has no price."""
        pools = deployment.pool_gpus()
        if any(gpu not in self.hourly_cost for gpu, _ in pools):
            return None
        return sum(self.hourly_cost[gpu] * count for gpu, count in pools)

    def value(self, deployment: Deployment, rate: float) -> float:
        """What the plan maximises: req/s per dollar-hour where every GPU has a price, else per GPU."""
        price = self.price(deployment) if self.hourly_cost else None
        return rate / price if price else rate / deployment.gpus


@dataclass
class Outcome:
    deployment: Deployment
    bound: float
    capacity: Capacity | None = None
    reason: str | None = None
    how: str = "simulated"
    num_requests: int = 0


def evaluate(deployment: Deployment, slos: Slos, start: float, bound: float, precision: float,
             target: float | None, seeds: int = 1, store: ProbeStore | None = None, needed: float = 0.0) -> Outcome:
    """One deployment's capacity (with `target`: its verdict there, searched up from it where it serves
    it), simulated, each probe kept in `store` (`simulator.plan.resume`); when it fails at `needed`
    (the rate it must serve to beat the best found) the search stops there."""
    servers = deployment.servers
    count = requests_for(slos, servers)
    settings = deployment.settings

    def run(rate: float) -> Probe:
        if store is None:
            return probe(settings, slos, rate, count, seeds)
        key = store.key(settings, slos, rate, count, seeds)
        kept = store.kept.get(key)
        if kept is not None and kept.rate == rate:  # a line that names another rate was not this probe's
            return kept
        result = probe(settings, slos, rate, count, seeds)
        store.keep(key, result)
        return result

    screen = None
    if target is not None:
        screen = run(target)
        if not screen.met:
            return Outcome(deployment, bound, Capacity(0.0, target, None, [screen]), num_requests=count,
                           how="probed at --rate")
        # It serves the target: its capacity is searched up from there, so that its headroom ranks
        # against the capacities of single servers and random-router fleets, searched or derived.
    elif needed > 0:
        screen = run(needed)
        if not screen.met:
            return Outcome(deployment, bound, Capacity(math.nan, needed, None, [screen]),
                           reason=f"fails at {needed:.3g} req/s, the rate it needs to beat the best found",
                           how="screened", num_requests=count)
    try:
        capacity = find_capacity(run, start, bound, precision, passed=screen)
    except InputError as exc:
        return Outcome(deployment, bound, reason=str(exc), how="refused")
    return Outcome(deployment, bound, capacity, num_requests=count)


def bounded(deployments: list[Deployment], slos: Slos) -> tuple[list[tuple[Deployment, float]], list[Outcome]]:
    """Each deployment that can run with its bound (req/s), and the refused ones with their reason."""
    runnable, refused = [], []
    for deployment in deployments:
        reason = refusal(deployment)
        if reason is not None:
            refused.append(Outcome(deployment, 0.0, reason=reason, how="refused"))
            continue
        runnable.append((deployment, deployment_bound(deployment.settings, slos)))
    return runnable, refused


class Best:
    """The best found so far, and what a deployment must do to beat it: the most req/s per GPU (or
    per dollar); with a target rate, the fewest GPUs (or dollars) that serve it."""

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.value = 0.0
        self.cost = math.inf

    def cost_of(self, deployment: Deployment) -> float:
        return self.spec.price(deployment) or deployment.gpus if self.spec.hourly_cost else deployment.gpus

    def add(self, outcome: Outcome) -> None:
        capacity = outcome.capacity
        if capacity is None or not capacity.max_rate > 0:
            return
        self.value = max(self.value, self.spec.value(outcome.deployment, capacity.max_rate))
        target = self.spec.target_rate
        if target is not None and capacity.max_rate >= target:
            self.cost = min(self.cost, self.cost_of(outcome.deployment))

    def prepare(self, task: tuple[Any, ...]) -> tuple[Any, ...] | Outcome:
        """The task as it starts: skipped when its bound cannot beat the best found, else told the
        rate it needs to beat it (with a target rate: skipped when it cannot serve it, or costs more
        than the cheapest found that does)."""
        deployment, bound = task[0], task[3]
        target = self.spec.target_rate
        if self.spec.exhaustive:
            return task
        if target is not None:
            if bound < target and deployment.servers > 1:
                return Outcome(deployment, bound, reason=f"its bound, {bound:.3g} req/s, is below --rate",
                               how="skipped by its bound")
            if self.cost_of(deployment) > self.cost:
                return Outcome(deployment, bound, reason="costs more than the cheapest found to serve --rate",
                               how="skipped by its size")
            return task
        if self.value <= 0:
            return task
        if self.spec.value(deployment, bound) < self.value:
            return Outcome(deployment, bound, reason=f"its bound, {bound:.3g} req/s, cannot beat the best found",
                           how="skipped by its bound")
        return (*task[:8], self.value / self.spec.value(deployment, 1.0))


def search(spec: PlanSpec) -> list[Outcome]:
    """Every deployment's outcome: servers, their random-router fleets, then the other fleets."""
    slos = spec.slos
    servers = [Deployment(s) for s in server_settings(spec.fixed, spec.axes, spec.max_gpus)]
    runnable, outcomes = bounded(servers, slos)
    best = Best(spec)
    store = ProbeStore.open(spec.folder) if spec.folder is not None else None
    runner = Runner(spec.jobs, spec.executor, spec.address)
    try:
        runnable.sort(key=lambda item: -spec.value(item[0], item[1]))
        tasks = [(d, slos, 0.5 * b if math.isfinite(b) else 1.0, b, spec.precision, None, spec.seeds, store)
                 for d, b in runnable]
        singles = []
        for outcome in runner.map(tasks, best.prepare, evaluate):
            singles.append(outcome)
            best.add(outcome)
        outcomes += singles
        for outcome in random_fleets(singles, spec):
            outcomes.append(outcome)
            best.add(outcome)
        fleets = fleet_tasks(singles, spec)
        runnable_fleets, refused = bounded([d for d, _ in fleets], slos)
        outcomes += refused
        starts = {d.key: start for d, start in fleets}
        fleet_list = [(d, slos, min(starts[d.key], b), b, spec.precision, spec.target_rate, spec.seeds, store)
                      for d, b in runnable_fleets]
        if spec.target_rate is None:
            fleet_list.sort(key=lambda task: -spec.value(task[0], task[3]))
        else:
            fleet_list.sort(key=lambda task: best.cost_of(task[0]))
        for outcome in runner.map(fleet_list, best.prepare, evaluate):
            outcomes.append(outcome)
            best.add(outcome)
    finally:
        runner.close()
    return outcomes


def random_fleets(singles: list[Outcome], spec: PlanSpec) -> list[Outcome]:
    """k replicas behind the random router: k times one server's capacity (Poisson thinning), for a
    workload where that holds (`symmetric`)."""
    outcomes = []
    for single in singles:
        settings = single.deployment.settings
        if single.capacity is None or single.capacity.at is None or not symmetric(settings):
            continue
        if "random" not in routers_for(settings, spec.fleet_axes):
            continue
        for fleet in replica_fleets(settings, spec.fleet_axes | {"router": ["random"]}, spec.max_gpus,
                                    all_sizes=spec.target_rate is not None):
            k = fleet.settings["num_replicas"]
            outcomes.append(Outcome(fleet, single.bound * k, single.capacity.scaled(
                k, f"{k} x one replica: each sees a Poisson stream of R/{k}"), how="symmetry",
                num_requests=single.num_requests * k))
    return outcomes


def fleet_tasks(singles: list[Outcome], spec: PlanSpec) -> list[tuple[Deployment, float]]:
    """(fleet, start rate) for the routers not derived by symmetry and the pools of the best servers
    of each TP and GPU."""
    ranked: dict[tuple[Any, ...], list[Outcome]] = {}
    for single in singles:
        if single.capacity is not None and single.capacity.max_rate > 0:
            s = single.deployment.settings
            ranked.setdefault((s["gpu"], s["tensor_parallel_size"]), []).append(single)
    tasks: list[tuple[Deployment, float]] = []
    axes = spec.fleet_axes
    pools_done: set[str] = set()
    for group in ranked.values():
        group.sort(key=lambda o: -o.capacity.max_rate if o.capacity else 0.0)
        for single in group[:FLEET_CANDIDATES]:
            assert single.capacity is not None
            c1, settings = single.capacity.max_rate, single.deployment.settings
            routers = [r for r in routers_for(settings, axes) if r != "random" or not symmetric(settings)]
            if routers:
                for fleet in replica_fleets(settings, axes | {"router": routers}, spec.max_gpus,
                                            spec.target_rate is not None):
                    tasks.append((fleet, c1 * fleet.settings["num_replicas"]))
            if settings["tensor_parallel_size"] == 1 and settings["policy"] != "static" and "num_replicas" not in axes:
                for fleet in pool_fleets(settings, axes, spec.max_gpus, spec.target_rate is not None, spec.gpus):
                    if fleet.key not in pools_done:
                        pools_done.add(fleet.key)
                        tasks.append((fleet, c1 * fleet.gpus * 0.8))
    return tasks
