"""A decode stretch: a decode-only step repeated k times until the next event, priced as one.

The stretch ends at the first of: the step in which the next decoder finishes (a padded batch: its
last member; its other members finish inside the stretch but hold their rows), the last step whose
KV blocks fit, the step whose blocks evict part of a prefix-cache hit the policy read while
deciding (`KVBlocks.room_sparing_hits`: the hit would shrink, and a shorter hit can make a waiting
request cheaper to admit), the last step ending before the time limit, the step during which the
next event that could see the server (`Server.horizon`: an arrival) or the policy's `wake_at` (or a
KV host-tier load's end, which the server folds into it) falls
(a padded batch admits nobody, so arrivals do not end its stretch). Steps are priced one by one
for short stretches and as arrays (`CostModel.decode_step_times`, the same float operations
elementwise) for long ones; step ends are a sequential cumulative sum, the same additions one
timeout per step would make, so the results are those of a step-by-step engine to the last bit
(tests/oracle.py). This module only plans and prices: the server waits for the stretch, and the
running set commits it (`RunningSet.run_decoders`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.cost import CostModel, StepShape
from simulator.cost.contract import decode_shape
from simulator.engine.running import RunningSet

RUN_MIN, RUN_MAX = 32, 4096
"""Stretches at least this long are priced as arrays, at most this many steps at a time."""


@dataclass(slots=True, init=False)
class Stretch:
    """k decode-only steps from `start`, priced, which the server waits for as one and the running
    set then commits (`RunningSet.run_decoders`). (Its `__init__` is written out, as `Request`'s is.)"""

    start: float
    durations: Any
    """Each step's duration (s): a numpy array for a long stretch, a list for a short one."""
    ends: Any
    """Each step's end (s), likewise."""
    used: Any
    """KV blocks the decoders took by the end of each step (cumulative), likewise."""
    growing: bool
    """Do the decoders take blocks as they go (a padded batch's are reserved in full)?"""
    crossing: float | None
    """The end of the step the time limit falls in, when it does (priced, never run)."""
    k: int
    """How many steps it is."""
    end: float
    """Its last step's end (s)."""

    def __init__(self, start: float, durations: Any, ends: Any, used: Any, growing: bool, crossing: float | None,
                 k: int, end: float) -> None:
        self.start, self.durations, self.ends, self.used = start, durations, ends, used
        self.growing, self.crossing, self.k, self.end = growing, crossing, k, end


def step_ends(start: float, durations: np.ndarray) -> np.ndarray:
    """Ends of consecutive steps from `start`, added in sequence (the same bits as step by step)."""
    return np.cumsum(np.concatenate(([start], durations)))[1:]  # type: ignore[no-any-return]


def plan(running: RunningSet, cost: CostModel, start: float, shape: StepShape, first: float, last: int,
         horizon: float, limit: float) -> Stretch:
    """The decode-only steps of `shape` from `start` until the next event: the decoders' step count
    reaching `last` (a finish), `horizon`, `limit` or a KV shortfall. The first, which takes `first`,
    is not the last (the server takes that one alone)."""
    k_max = min(last - running.decoders.steps, RUN_MAX)
    stop = min(horizon, limit)
    estimate = k_max if stop == math.inf else min(k_max, int((stop - start) / first) + 1)
    growing = running.batch is None
    crossing = None
    durations: Any
    ends: Any
    used: Any
    if estimate >= RUN_MIN and cost.pure:
        durations, ends, used = _array(running, cost, start, shape, first, estimate, growing, horizon, limit)
    else:
        durations, ends, used, crossing = _scalar(running, cost, start, shape, first, k_max, growing, horizon, limit)
    assert len(ends), "a first step past the limit or the next event, or short of KV, is taken alone"
    return Stretch(start, durations, ends, used, growing, crossing, len(ends), float(ends[-1]))


def _array(running: RunningSet, cost: CostModel, start: float, shape: StepShape, first: float, k: int,
           growing: bool, horizon: float, limit: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = np.arange(k, dtype=np.int64)
    kv = running.kv
    used = np.cumsum(running.decoders.blocks_needed_ahead(k)) if growing else np.zeros(k, dtype=np.int64)
    if growing:
        k = min(k, int(np.searchsorted(used, kv.num_free, side="right")))
        if k:  # up to the step that evicts part of a hit the policy read: the policy decides again after it
            k = min(k, int(np.searchsorted(used, kv.room_sparing_hits(int(used[k - 1])), side="right")) + 1)
    rows = shape.num_seqs
    durations = np.concatenate(([first], cost.decode_step_times(rows, shape.decode_context + rows * offsets[1:k])))
    ends = step_ends(start, durations)
    k = min(k, int(np.searchsorted(ends, limit, side="left")), int(np.searchsorted(ends, horizon, side="left")) + 1)
    return durations[:k], ends[:k], used[:k]


def _scalar(running: RunningSet, cost: CostModel, start: float, shape: StepShape, first: float, k_max: int,
            growing: bool, horizon: float, limit: float) -> tuple[list[float], list[float], list[int], float | None]:
    """Steps priced one at a time, exactly those that run; and the end of the step the time limit
    falls in, when it does (priced, never run)."""
    step_time, blocks_needed = cost.step_time, running.decoders.blocks_needed
    free = running.kv.num_free
    room = running.kv.room_sparing_hits(free) if growing else free
    rows, context0 = shape.num_seqs, shape.decode_context
    durations: list[float] = []
    ends: list[float] = []
    used: list[int] = []
    t, total = start, 0
    for j in range(k_max):
        need = blocks_needed(j) if growing else 0
        if total + need > free:
            break
        duration = first if j == 0 else step_time(decode_shape(rows, context0 + rows * j))
        end = t + duration
        if end >= limit:
            return durations, ends, used, end
        total += need
        durations.append(duration)
        ends.append(end)
        used.append(total)
        t = end
        if end >= horizon or total > room:
            break
    return durations, ends, used, None
