"""The step log: one entry per forward pass, and where every output token was emitted.

Held compactly: each step one packed row of its times as float64 (the clock's exact bits) and its
counts as int32 (4 bytes; a run of 1M requests has millions of steps), appended in one call.
Tokens are never per-token objects but packed int32 rows in two forms: single tokens as (request,
step) (`TOKEN`), and runs of consecutive decode steps as (request, first, count) (`RUN`) over
`decode_step`, which lists the step index of each step in which the decoders ran (a decoder emits
one token in every one of them without being touched, see `simulator.engine.decoders`); each row is
appended in one call. A server's running set is its log's one writer (`simulator.engine.running`).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field

import numpy as np

STEP_COUNTS = ("num_seqs", "prefill_tokens", "decode_tokens", "padded_tokens", "kv_blocks_used", "num_waiting",
               "num_running", "num_preempted")
"""The per-step integer columns, in the order `StepLog.append` takes them."""
_INT = "i"
ROW = np.dtype([("start", np.float64), ("duration", np.float64)] + [(name, np.int32) for name in STEP_COUNTS])
"""A step's row as it is held: packed, native byte order (48 bytes)."""
ROW_SIZE = ROW.itemsize

# One step's values as the row's bytes: one call (faster than one per value, or one per kind).
_pack_row = struct.Struct(f"=2d{len(STEP_COUNTS)}i").pack
assert struct.calcsize(f"=2d{len(STEP_COUNTS)}i") == ROW_SIZE

TOKEN = np.dtype([("token_request", np.int32), ("token_step", np.int32)])
"""A token emitted alone, as it is held: its request and step (packed, native byte order)."""
RUN = np.dtype([("run_request", np.int32), ("run_first", np.int32), ("run_count", np.int32)])
"""A run of decode tokens, as it is held: its request, its first step's index in `decode_step`, and
how many steps (tokens) it spans."""
_pack_token, _pack_run = struct.Struct("=2i").pack, struct.Struct("=3i").pack
PACKED = {name: (kind, dtype) for kind, dtype in (("tokens", TOKEN), ("runs", RUN)) for name in dtype.names or ()}
"""The token and run columns, by name: the log's attribute that holds them, and its row."""


def _ints() -> array:
    return array(_INT)


def _counters() -> array:
    return array("q")


@dataclass
class StepLog:
    rows: bytearray = field(default_factory=bytearray)
    """Each step's start and duration (s) and its `STEP_COUNTS`, packed as `ROW`."""
    tokens: bytearray = field(default_factory=bytearray)
    """Each token emitted alone, packed as `TOKEN` (`token`)."""
    runs: bytearray = field(default_factory=bytearray)
    """Each run of decode tokens, packed as `RUN` (`run`)."""
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
    held: array = field(default_factory=_ints)
    """Steps whose tokens reached their clients when the step after them ended, not at their own
    end (output lag, `simulator.engine.delivery`)."""

    def __len__(self) -> int:
        return len(self.rows) // ROW_SIZE

    def append(self, start: float, duration: float, num_seqs: int, prefill_tokens: int, decode_tokens: int,
               padded_tokens: int, kv_blocks_used: int, num_waiting: int, num_running: int, num_preempted: int) -> None:
        """One step: its start and duration (s), then the `STEP_COUNTS`."""
        self.rows += _pack_row(start, duration, num_seqs, prefill_tokens, decode_tokens, padded_tokens, kv_blocks_used,
                               num_waiting, num_running, num_preempted)

    def token(self, request: int, step: int) -> None:
        """Request `request` emitted one token in step `step`."""
        self.tokens += _pack_token(request, step)

    def run(self, request: int, first: int, count: int) -> None:
        """Request `request` emitted one token in each of `count` decode steps from `decode_step[first]`."""
        self.runs += _pack_run(request, first, count)

    @property
    def num_tokens_alone(self) -> int:
        """How many tokens were emitted alone (rows of `tokens`)."""
        return len(self.tokens) // TOKEN.itemsize

    @property
    def num_runs(self) -> int:
        """How many runs of decode tokens there are (rows of `runs`)."""
        return len(self.runs) // RUN.itemsize

    def cache_queries(self, step: int, queried: int, hit: int, host_hit: int = 0) -> None:
        """Step `step`'s admissions queried `queried` prompt tokens of the prefix cache and hit `hit`,
        `host_hit` of them on the host tier."""
        self.cache_step.append(step)
        self.cache_queried.append(queried)
        self.cache_hit.append(hit)
        self.cache_host_hit.append(host_hit)

    def extend(self, starts: np.ndarray, durations: np.ndarray, counts: dict[str, np.ndarray | int]) -> None:
        """Many steps at once, each count an array or one value for all (0 when not given)."""
        table = np.zeros(len(starts), dtype=ROW)
        table["start"], table["duration"] = starts, durations
        for name, values in counts.items():
            table[name] = values
        self.rows += table.tobytes()

    def _table(self) -> np.ndarray:
        """The rows as a structured array over the log's bytes (read it before the log grows)."""
        return np.frombuffer(self.rows, dtype=ROW) if len(self.rows) else np.zeros(0, dtype=ROW)

    def step_ends(self) -> np.ndarray:
        """Each step's end: start + duration (s), the sum of the two `column`s without their copies."""
        rows = self._table()
        return rows["start"] + rows["duration"]

    def token_times(self) -> np.ndarray:
        """When each step's tokens reached their clients (s): its end, or the next step's end for a
        `held` step."""
        ends = self.step_ends()
        if len(self.held):
            held = np.frombuffer(self.held, dtype=np.int32)
            ends[held] = ends[held + 1]
        return ends

    def int32_column(self, name: str) -> np.ndarray:
        """A token, run or cache column as the log holds it (int32, half of `column`'s bytes), for a
        caller that only indexes or counts with it."""
        return self._ints_held(name).copy()

    def column(self, name: str) -> np.ndarray:
        """A column as numpy: float64 times, int64 counts."""
        if name in ("start", "duration"):
            return self._table()[name].copy()
        if name in STEP_COUNTS:
            return self._table()[name].astype(np.int64)
        return self._ints_held(name).astype(np.int64)

    def _ints_held(self, name: str) -> np.ndarray:
        """The int32 column `name` as numpy over the log's bytes (read it before the log grows)."""
        if name in PACKED:
            kind, row = PACKED[name]
            held: bytearray = getattr(self, kind)
            return np.frombuffer(held, dtype=row)[name] if held else np.zeros(0, dtype=np.int32)
        values: array = getattr(self, name)
        return np.frombuffer(values, dtype=np.int32) if len(values) else np.zeros(0, dtype=np.int32)
