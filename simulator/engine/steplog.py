"""The step log: one entry per forward pass, and where every output token was emitted.

Held compactly: times as float64 (the clock's exact bits), counts as int32 (4 bytes; a run of 1M
requests has millions of steps), each step's values appended in one call to one interleaved array.
Tokens are never per-token objects but flat arrays in two forms: single tokens as (request, step),
and runs of consecutive decode steps as (request, first, count) over `decode_step`, which lists the
step index of each step in which the decoders ran (a decoder emits one token in every one of them
without being touched, see `simulator.engine.decoders`). A server's running set is its log's one
writer (`simulator.engine.running`).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field

import numpy as np

STEP_COUNTS = ("num_seqs", "prefill_tokens", "decode_tokens", "padded_tokens", "kv_blocks_used", "num_waiting",
               "num_running", "num_preempted")
"""The per-step integer columns, in the order `StepLog.append` takes them."""
_FLOAT, _INT = "d", "i"


# One step's values as the arrays' native bytes (faster than extending them from a tuple).
_pack_times = struct.Struct(f"2{_FLOAT}").pack
_pack_counts = struct.Struct(f"{len(STEP_COUNTS)}{_INT}").pack


def _floats() -> array:
    return array(_FLOAT)


def _ints() -> array:
    return array(_INT)


def _counters() -> array:
    return array("q")


@dataclass
class StepLog:
    times: array = field(default_factory=_floats)
    """start, duration of each step, interleaved (s)."""
    counts: array = field(default_factory=_ints)
    """The `STEP_COUNTS` of each step, interleaved."""
    token_request: array = field(default_factory=_ints)
    token_step: array = field(default_factory=_ints)
    run_request: array = field(default_factory=_ints)
    run_first: array = field(default_factory=_ints)
    run_count: array = field(default_factory=_ints)
    decode_step: array = field(default_factory=_ints)
    cache_step: array = field(default_factory=_ints)
    """Steps whose admissions queried the prefix cache, with the tokens queried and hit (of them,
    loaded from the host tier)."""
    cache_queried: array = field(default_factory=_ints)
    cache_hit: array = field(default_factory=_ints)
    cache_host_hit: array = field(default_factory=_ints)
    spec_accepted: array = field(default_factory=_counters)
    """Speculative decoding's verify steps by the draft tokens they accepted (index 0..k; empty
    without speculation)."""

    def __len__(self) -> int:
        return len(self.times) >> 1

    def append(self, start: float, duration: float, num_seqs: int, prefill_tokens: int, decode_tokens: int,
               padded_tokens: int, kv_blocks_used: int, num_waiting: int, num_running: int, num_preempted: int) -> None:
        """One step: its start and duration (s), then the `STEP_COUNTS`."""
        self.times.frombytes(_pack_times(start, duration))
        self.counts.frombytes(_pack_counts(num_seqs, prefill_tokens, decode_tokens, padded_tokens, kv_blocks_used,
                                           num_waiting, num_running, num_preempted))

    def cache_queries(self, step: int, queried: int, hit: int, host_hit: int = 0) -> None:
        """Step `step`'s admissions queried `queried` prompt tokens of the prefix cache and hit `hit`,
        `host_hit` of them on the host tier."""
        self.cache_step.append(step)
        self.cache_queried.append(queried)
        self.cache_hit.append(hit)
        self.cache_host_hit.append(host_hit)

    def extend(self, starts: np.ndarray, durations: np.ndarray, counts: dict[str, np.ndarray | int]) -> None:
        """Many steps at once, each count an array or one value for all (0 when not given)."""
        k = len(starts)
        self.times.frombytes(np.column_stack((starts, durations)).astype(np.float64).tobytes())
        table = np.zeros((k, len(STEP_COUNTS)), dtype=np.int32)
        for i, name in enumerate(STEP_COUNTS):
            if name in counts:
                table[:, i] = counts[name]
        self.counts.frombytes(table.tobytes())

    def step_ends(self) -> np.ndarray:
        """Each step's end: start + duration (s), the sum of the two `column`s without their copies."""
        times = np.frombuffer(self.times, dtype=np.float64) if len(self.times) else np.zeros(0)
        return times[0::2] + times[1::2]

    def int32_column(self, name: str) -> np.ndarray:
        """A token, run or cache column as the log holds it (int32, half of `column`'s bytes), for a
        caller that only indexes or counts with it."""
        values: array = getattr(self, name)
        return np.frombuffer(values, dtype=np.int32).copy() if len(values) else np.zeros(0, dtype=np.int32)

    def column(self, name: str) -> np.ndarray:
        """A column as numpy: float64 times, int64 counts."""
        if name in ("start", "duration"):
            times = np.frombuffer(self.times, dtype=np.float64) if len(self.times) else np.zeros(0)
            return times[name == "duration"::2].copy()
        if name in STEP_COUNTS:
            counts = np.frombuffer(self.counts, dtype=np.int32) if len(self.counts) else np.zeros(0, np.int32)
            return counts[STEP_COUNTS.index(name)::len(STEP_COUNTS)].astype(np.int64)
        values: array = getattr(self, name)
        ints = np.frombuffer(values, dtype=np.int32) if len(values) else np.zeros(0, dtype=np.int32)
        return ints.astype(np.int64)
