"""A decode-only step priced for the k steps it repeats until the next event, as one SimPy timeout.

The stretch ends at the first of: the step in which the next decoder finishes (a padded batch: its
last member; its other members finish inside the stretch but hold their rows), the last step whose
KV blocks fit, the step whose blocks evict part of a prefix-cache hit the policy read while
deciding (`KVBlocks.room_sparing_hits`: the hit would shrink, and a shorter hit can make a waiting
request cheaper to admit), the last step ending before the time limit, the step during which the
next event that could see the server (`Server.horizon`: an arrival) or the policy's `wake_at` falls
(a padded batch admits nobody, so arrivals do not end its stretch). Steps are priced one by one
for short stretches and as arrays (`CostModel.decode_step_times`, the same float operations
elementwise) for long ones; step ends are a sequential cumulative sum, the same additions one
timeout per step would make, so the results are those of a step-by-step engine to the last bit
(tests/oracle.py).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

import numpy as np

from simulator.cost import StepShape
from simulator.engine.server import Process, Server

RUN_MIN, RUN_MAX = 32, 4096
"""Stretches at least this long are priced as arrays, at most this many steps at a time."""


def step_ends(start: float, durations: np.ndarray) -> np.ndarray:
    """Ends of consecutive steps from `start`, added in sequence (the same bits as step by step)."""
    return np.cumsum(np.concatenate(([start], durations)))[1:]  # type: ignore[no-any-return]


def decode_stretch(server: Server, wake_at: float | None) -> Process:
    decoders, kv, batch, env = server.decoders, server.kv, server.batch, server.env
    steps0 = decoders.steps
    if batch is not None:
        rows = len(batch.members)
        position0 = batch.position(steps0)
        context0, per_step = rows * position0, rows
        horizon = math.inf  # nobody joins a padded batch
        last = decoders.next_finish() if server.finish_seen_elsewhere else batch.last_step
        growing = False
    else:
        rows = decoders.count
        context0, per_step = decoders.decode_context, rows
        horizon = server.horizon()
        last = decoders.next_finish()
        growing = True
    if wake_at is not None:
        horizon = min(horizon, wake_at)
    limit = server.limit
    k_max = min(last - steps0, RUN_MAX)
    first = server.cost.step_time(StepShape(rows, rows, context0))
    stop = min(horizon, limit)
    estimate = k_max if stop == math.inf else min(k_max, int((stop - server.clock) / first) + 1)
    if server.clock + first >= stop or k_max == 1:  # a stretch of one step, taken the short way
        start = server.clock
        end = start + first
        if end >= limit:
            yield env.timeout_at(end, server.priority)  # the clock stops during it
            return
        num_live = decoders.count
        if growing:
            kv.take(decoders.blocks_needed())
        decoders.steps += 1
        log = server.log
        log.lazy_step.append(len(log))
        finishing = decoders.pop_finished()
        if finishing or end >= (horizon if batch is None and wake_at is None else server.horizon()):
            yield env.timeout_at(end, server.priority)
        server.clock = end
        for step, request in finishing:
            server.finish(request, end, step)
        log.append(start, first, num_live, 0, num_live, rows - num_live if batch is not None else 0, kv.num_used,
                   len(server.waiting), server.num_running, 0)
        return
    arrays = estimate >= RUN_MIN and server.cost.pure
    crossing = None
    durations: Any  # numpy arrays for a long stretch, lists for a short one
    ends: Any
    used: Any
    if arrays:
        durations, ends, used = _array(server, rows, context0, per_step, estimate, growing, horizon, first)
    else:
        durations, ends, used, crossing = _scalar(server, rows, context0, per_step, k_max, growing, horizon, first)
    k = len(ends)
    assert k > 0, "a first step past the limit or the next event, or short of KV, is taken the short way above"
    waiting0, kv_used0, running0 = len(server.waiting), kv.num_used, server.num_running
    live0 = decoders.count
    end = float(ends[-1])
    submitted = server.submitted = []  # arrivals meanwhile, and closed-loop clients' next requests at finishes
    if decoders.next_finish() <= steps0 + k or end >= server.horizon():
        server.stretch_kv = (ends, used) if growing else None
        yield env.timeout_at(end, server.priority)
        server.stretch_kv = None
    start = server.clock
    # Commit the k steps: the decoders' step count, their KV, the finishes, the log.
    log = server.log
    index0 = len(log)
    decoders.steps += k
    if growing:
        kv.take(int(used[-1]))
    finishing = decoders.pop_finished()
    for step, request in finishing:
        server.finish(request, float(ends[step - steps0 - 1]), step)
    pad = rows - live0 if batch is not None else 0
    if arrays:
        log.lazy_step.frombytes(np.arange(index0, index0 + k, dtype=np.int32).tobytes())
        finish_steps = np.array([s for s, _ in finishing], dtype=np.int64)
        live = live0 - np.searchsorted(finish_steps, steps0 + np.arange(k, dtype=np.int64), side="right")
        num_waiting = waiting0 + np.searchsorted(np.sort(np.array(submitted)), ends, side="right")
        kv_used = kv_used0 + (used if growing else np.zeros(k, dtype=np.int64))
        num_running = np.full(k, running0, dtype=np.int64)
        kv_used[-1], num_running[-1] = kv.num_used, server.num_running
        log.extend(np.concatenate(([start], ends[:-1])), durations,
                   {"num_seqs": live, "decode_tokens": live, "padded_tokens": rows - live, "kv_blocks_used": kv_used,
                    "num_waiting": num_waiting, "num_running": num_running})
    else:
        submitted = sorted(submitted)
        done = [s for s, _ in finishing]
        for j in range(k):
            log.lazy_step.append(index0 + j)
            num_live = live0 - bisect_right(done, steps0 + j)
            last_row = j == k - 1
            log.append(start, durations[j], num_live, 0, num_live, pad + live0 - num_live,
                       kv.num_used if last_row else kv_used0 + used[j], waiting0 + bisect_right(submitted, ends[j]),
                       server.num_running if last_row else running0, 0)
            start = ends[j]
    server.clock = end
    server.submitted = None
    if crossing is not None:  # priced already: the step the clock stops in
        yield env.timeout_at(crossing, server.priority)


def _array(server: Server, rows: int, context0: int, per_step: int, k: int, growing: bool, horizon: float,
           first: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = np.arange(k, dtype=np.int64)
    used = np.cumsum(server.decoders.blocks_needed_ahead(k)) if growing else np.zeros(k, dtype=np.int64)
    if growing:
        k = min(k, int(np.searchsorted(used, server.kv.num_free, side="right")))
        if k:  # up to the step that evicts part of a hit the policy read: the policy decides again after it
            k = min(k, int(np.searchsorted(used, server.kv.room_sparing_hits(int(used[k - 1])), side="right")) + 1)
    durations = np.concatenate(([first], server.cost.decode_step_times(rows, context0 + per_step * offsets[1:k])))
    ends = step_ends(server.clock, durations)
    k = min(k, int(np.searchsorted(ends, server.limit, side="left")),
            int(np.searchsorted(ends, horizon, side="left")) + 1)
    return durations[:k], ends[:k], used[:k]


def _scalar(server: Server, rows: int, context0: int, per_step: int, k_max: int, growing: bool, horizon: float,
            first: float) -> tuple[list[float], list[float], list[int], float | None]:
    """Steps priced one at a time, exactly those that run; and the end of the step the time limit
    falls in, when it does (priced, never run)."""
    step_time, blocks_needed = server.cost.step_time, server.decoders.blocks_needed
    free, limit = server.kv.num_free, server.limit
    room = server.kv.room_sparing_hits(free) if growing else free
    durations: list[float] = []
    ends: list[float] = []
    used: list[int] = []
    t, total = server.clock, 0
    for j in range(k_max):
        need = blocks_needed(j) if growing else 0
        if total + need > free:
            break
        duration = first if j == 0 else step_time(StepShape(rows, rows, context0 + per_step * j))
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
