"""The step log: one entry per forward pass, and where every output token was emitted.

Held compactly: times as float64 (the clock's exact bits), counts as int32 (4 bytes; a run of 1M
requests has ~5M steps). Tokens are never per-token objects but flat arrays in two forms: single
tokens as (request, step), and runs of consecutive decoder steps as (request, first, count) over
`lazy_step`, which lists the step index of each step in which the decoders ran (a decoder emits one
token in every one of them without being touched, see `simulator.decoders`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

STEP_COUNTS = ("num_seqs", "prefill_tokens", "decode_tokens", "padded_tokens", "kv_blocks_used", "num_waiting",
               "num_running", "num_preempted")
"""The per-step integer columns, in the order `StepLog.append` takes them."""


def _floats() -> array:
    return array("d")


def _ints() -> array:
    return array("i")


@dataclass
class StepLog:
    start: array = field(default_factory=_floats)
    duration: array = field(default_factory=_floats)
    num_seqs: array = field(default_factory=_ints)
    prefill_tokens: array = field(default_factory=_ints)
    decode_tokens: array = field(default_factory=_ints)
    padded_tokens: array = field(default_factory=_ints)
    kv_blocks_used: array = field(default_factory=_ints)
    num_waiting: array = field(default_factory=_ints)
    num_running: array = field(default_factory=_ints)
    num_preempted: array = field(default_factory=_ints)
    token_request: array = field(default_factory=_ints)
    token_step: array = field(default_factory=_ints)
    run_request: array = field(default_factory=_ints)
    run_first: array = field(default_factory=_ints)
    run_count: array = field(default_factory=_ints)
    lazy_step: array = field(default_factory=_ints)

    def __len__(self) -> int:
        return len(self.start)

    def append(self, start: float, duration: float, num_seqs: int, prefill_tokens: int, decode_tokens: int,
               padded_tokens: int, kv_blocks_used: int, num_waiting: int, num_running: int, num_preempted: int) -> None:
        """One step: its start and duration (s), then the `STEP_COUNTS`."""
        self.start.append(start)
        self.duration.append(duration)
        self.num_seqs.append(num_seqs)
        self.prefill_tokens.append(prefill_tokens)
        self.decode_tokens.append(decode_tokens)
        self.padded_tokens.append(padded_tokens)
        self.kv_blocks_used.append(kv_blocks_used)
        self.num_waiting.append(num_waiting)
        self.num_running.append(num_running)
        self.num_preempted.append(num_preempted)

    def extend(self, starts: np.ndarray, durations: np.ndarray, counts: dict[str, np.ndarray | int]) -> None:
        """Many steps at once, each count an array or one value for all (0 when not given)."""
        k = len(starts)
        self.start.frombytes(starts.astype(np.float64).tobytes())
        self.duration.frombytes(durations.astype(np.float64).tobytes())
        for name in STEP_COUNTS:
            values = np.broadcast_to(counts.get(name, 0), k).astype(np.int32)
            getattr(self, name).frombytes(values.tobytes())

    def column(self, name: str) -> np.ndarray:
        """A column as numpy: float64 times, int64 counts."""
        values: array = getattr(self, name)
        if values.typecode == "d":
            return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0, dtype=np.float64)
        ints = np.frombuffer(values, dtype=np.int32) if len(values) else np.zeros(0, dtype=np.int32)
        return ints.astype(np.int64)
