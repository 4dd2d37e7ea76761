"""Measured points rerun in parallel, as a sweep runs its configurations (`simulator.sweep.executors`).

The unit of work is a list of points rerun one after the other in one process (today one point;
a concurrency sweep run back to back against one server is one unit). Units run in spawned worker
processes, `jobs` at a time, and come back in completion order with their index, so the caller
puts the rows back in the file's order: the rows do not depend on where or in what order they ran.
A point whose rerun servesim refuses (a model that does not fit, a TP that does not divide its
heads) is skipped with the refusal as its reason, never failing the others.

A unit may carry a rule (`simulator.sim2real.sweeps.Hypothesis`): how its rows were measured, as the
data supports it for their stack (`sweeps.SUPPORTED`); each of its points then reruns on the rule's
scheduler (for a vLLM silicon row, the token budget max batch + isl + 1500) instead of the caller's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from simulator.errors import InputError
from simulator.sim2real.compare import DEFAULT_SCHEDULER, Scheduler, compare_point, default_profile
from simulator.sim2real.points import MeasuredPoint
from simulator.sim2real.sweeps import Hypothesis
from simulator.sim2real.sweeps import Unit as Sweep
from simulator.sweep.executors import in_workers

Unit = list[MeasuredPoint]
COST_LOG = "servesim.cost"
"""The logger of the measured cost model's notes (a shape past its tables, priced by roofline)."""


@dataclass
class UnitResult:
    """A unit's rows, its skipped points (name, reason) and its cost model's notes."""

    index: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Notes(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def units_of(points: list[MeasuredPoint]) -> list[Unit]:
    """The units to rerun: each point alone."""
    return [[point] for point in points]


def point_scheduler(point: MeasuredPoint, scheduler: Scheduler, rule: Hypothesis | None) -> Scheduler:
    """The scheduler `point` reruns on: `rule`'s for its own server where given (with `scheduler`'s
    speculation), else `scheduler`."""
    if rule is None:
        return scheduler
    return replace(rule.scheduler_for(Sweep((point,))), speculation=scheduler.speculation)


def run_unit(index: int, unit: Unit, profiles: dict[str, str], seed: int, scheduler: Scheduler,
             rule: Hypothesis | None = None) -> UnitResult:
    """Every point of `unit` rerun on its profile (its stack's, `default_profile`, unless `profiles`
    maps its GPU), in order, on `rule`'s scheduler or `scheduler`; the cost model's notes kept."""
    result = UnitResult(index)
    log = logging.getLogger(COST_LOG)
    notes, propagate = _Notes(), log.propagate
    log.addHandler(notes)
    log.propagate = False
    try:
        for point in unit:
            try:
                profile = profiles.get(point.gpu) or default_profile(point.gpu, point.backend)
                sent = rule.sent(point, seed) if rule is not None else point
                result.rows += compare_point(sent, profile, seed, point_scheduler(point, scheduler, rule))
            except InputError as exc:
                result.skipped.append((point.name, str(exc)))
    finally:
        log.removeHandler(notes)
        log.propagate = propagate
    result.notes = sorted(set(notes.messages))
    return result


def run_units(units: list[Unit], profiles: dict[str, str], seed: int = 0, scheduler: Scheduler = DEFAULT_SCHEDULER,
              jobs: int = 1, rules: list[Hypothesis | None] | None = None) -> Iterator[UnitResult]:
    """Each unit's result as it finishes: in this process with one job, else in `jobs` spawned workers;
    `rules[i]`, where given, is how unit i's rows were measured (`run_unit`)."""
    rules = rules if rules is not None else [None] * len(units)
    if jobs == 1 or len(units) <= 1:
        for index, unit in enumerate(units):
            yield run_unit(index, unit, profiles, seed, scheduler, rules[index])
        return
    # Longest first (requests x output tokens), so the last to finish is not the one that started last.
    order = sorted(range(len(units)), key=lambda i: -sum(p.num_requests * max(p.output_lens) for p in units[i]))
    yield from in_workers([(run_unit, (i, units[i], profiles, seed, scheduler, rules[i])) for i in order], jobs)
