"""Measured points rerun in parallel, as a sweep runs its configurations (`simulator.sweep.executors`).

The unit of work is a list of points rerun one after the other in one process (today one point;
a concurrency sweep run back to back against one server is one unit). Units run in spawned worker
processes, `jobs` at a time, and come back in completion order with their index, so the caller
puts the rows back in the file's order: the rows do not depend on where or in what order they ran.
A point whose rerun servesim refuses (a model that does not fit, a TP that does not divide its
heads) is skipped with the refusal as its reason, never failing the others.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import InputError
from simulator.sim2real.compare import DEFAULT_SCHEDULER, Scheduler, compare_point, default_profile
from simulator.sim2real.points import MeasuredPoint
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


def run_unit(index: int, unit: Unit, profiles: dict[str, str], seed: int, scheduler: Scheduler) -> UnitResult:
    """Every point of `unit` rerun on its profile, in order; the cost model's notes kept, not printed."""
    result = UnitResult(index)
    log = logging.getLogger(COST_LOG)
    notes, propagate = _Notes(), log.propagate
    log.addHandler(notes)
    log.propagate = False
    try:
        for point in unit:
            try:
                profile = profiles.get(point.gpu, default_profile(point.gpu))
                result.rows += compare_point(point, profile, seed, scheduler)
            except InputError as exc:
                result.skipped.append((point.name, str(exc)))
    finally:
        log.removeHandler(notes)
        log.propagate = propagate
    result.notes = sorted(set(notes.messages))
    return result


def run_units(units: list[Unit], profiles: dict[str, str], seed: int = 0, scheduler: Scheduler = DEFAULT_SCHEDULER,
              jobs: int = 1) -> Iterator[UnitResult]:
    """Each unit's result as it finishes: in this process with one job, else in `jobs` spawned workers."""
    if jobs == 1 or len(units) <= 1:
        for index, unit in enumerate(units):
            yield run_unit(index, unit, profiles, seed, scheduler)
        return
    # Longest first (requests x output tokens), so the last to finish is not the one that started last.
    order = sorted(range(len(units)), key=lambda i: -sum(p.num_requests * max(p.output_lens) for p in units[i]))
    yield from in_workers([(run_unit, (i, units[i], profiles, seed, scheduler)) for i in order], jobs)
