"""The `Workload`: the requests a simulation serves, as columns."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from simulator.errors import InputError


def _check_column(name: str, values: object, dtype: type[np.generic]) -> npt.NDArray[Any]:
    if not isinstance(values, np.ndarray) or values.dtype != dtype or values.ndim != 1:
        shape = getattr(values, "shape", None)
        kind = getattr(values, "dtype", type(values).__name__)
        raise InputError(
            f"workload {name} must be a 1-D {np.dtype(dtype)} array, got {kind} with shape {shape}"
        )
    return values


class Origin(Protocol):
    """Where a workload's requests were read from."""

    def where(self, request: int) -> str:
        """Request `request`'s place in its file, as a person finds it in an editor ("trace.csv line 7")."""
        ...


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests to simulate, columnar; `arrival` is None for a closed loop.

    Open loop: `arrival` holds each request's arrival in seconds (non-decreasing, >= 0; the first
    may be > 0) and `concurrency` is None. Closed loop: `arrival` is None, `concurrency` clients
    each send their next request when the previous one finishes, and the engine decides arrival
    times. Both: an open loop capped at `concurrency` requests in flight (`vllm bench serve
    --request-rate --max-concurrency`): a request due while that many are in flight is sent, in
    turn, when one of them finishes. Two workloads are equal when every column is (wherever they were read from).
    """

    prompt_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]
    arrival: npt.NDArray[np.float64] | None
    concurrency: int | None
    priority: npt.NDArray[np.int64] | None = None
    """Per request, lower first under the priority policy; None = all 0."""
    content: tuple[tuple[tuple[int, int], ...], ...] | None = None
    """Per request, its prompt's prefix identity as (segment id, tokens) pieces summing to its
    prompt length (`workloads.prefixes`); None = no identity (nothing is shared)."""
    turns: int = 1
    """Requests per multi-turn session (`workloads.sessions`); 1 = independent requests."""
    think_time: float = 0.0
    """Seconds between a turn's last token and the session's next turn."""
    origin: Origin | None = field(default=None, compare=False)
    """The file each request was read from (a trace), to name it in messages; None: made, not read."""

    def __post_init__(self) -> None:
        prompt = _check_column("prompt_tokens", self.prompt_tokens, np.int64)
        output = _check_column("output_tokens", self.output_tokens, np.int64)
        n = len(prompt)
        if n == 0:
            raise InputError("workload has no requests")
        if len(output) != n:
            raise InputError(f"workload has {n} prompt lengths but {len(output)} output lengths")
        for name, column in (("prompt_tokens", prompt), ("output_tokens", output)):
            bad = np.flatnonzero(column < 1)
            if bad.size:
                raise InputError(f"workload {name} must be >= 1, got {column[bad[0]]} for {self.describe(int(bad[0]))}")
        if self.priority is not None and len(_check_column("priority", self.priority, np.int64)) != n:
            raise InputError(f"workload has {n} requests but {len(self.priority)} priorities")
        if self.content is not None:
            _check_content(self.content, prompt)
        if isinstance(self.turns, bool) or not isinstance(self.turns, int) or self.turns < 1:
            raise InputError(f"workload turns must be a positive integer, got {self.turns!r}")
        if not (0 <= self.think_time < float("inf")):
            raise InputError(f"workload think time must be finite seconds >= 0, got {self.think_time!r}")
        if self.arrival is None and self.concurrency is None:
            raise InputError("workload needs arrival times (open loop), a concurrency (closed loop), or both")
        if self.concurrency is not None:
            if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
                raise InputError(f"concurrency must be an integer, got {self.concurrency!r}")
            if self.concurrency < 1:
                raise InputError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.arrival is None:
            return
        arrival = _check_column("arrival", self.arrival, np.float64)
        if len(arrival) != n:
            raise InputError(f"workload has {n} requests but {len(arrival)} arrival times")
        bad = np.flatnonzero(~np.isfinite(arrival) | (arrival < 0))
        if bad.size:
            raise InputError(f"arrival times must be finite seconds >= 0, got {arrival[bad[0]]} for "
                             f"{self.describe(int(bad[0]))}")
        bad = np.flatnonzero(np.diff(arrival) < 0)
        if bad.size:
            i = bad[0] + 1
            raise InputError(
                f"arrival times must be non-decreasing, request {i} arrives at {arrival[i]} "
                f"before request {i - 1} at {arrival[i - 1]}"
            )

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)

    def describe(self, request: int) -> str:
        """Request `request` (its id in the run's tables) as a message names it, with its place in
        the file it was read from."""
        return f"request {request}" + (f" ({self.origin.where(request)})" if self.origin is not None else "")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workload):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self) if f.compare)


def _check_content(content: object, prompt: npt.NDArray[np.int64]) -> None:
    if not isinstance(content, tuple) or len(content) != len(prompt):
        raise InputError(f"workload content must be a tuple of one prompt's segments per request ({len(prompt)}), "
                         f"got {type(content).__name__} of {len(content) if isinstance(content, tuple) else '?'}")
    for i, (segments, length) in enumerate(zip(content, prompt.tolist(), strict=True)):
        total = 0
        for piece in segments:
            if (not isinstance(piece, tuple) or len(piece) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in piece) or piece[1] < 1):
                raise InputError(f"workload content of request {i} has segment {piece!r}; expected (id, tokens >= 1)")
            total += piece[1]
        if total != length:
            raise InputError(f"workload content of request {i} covers {total} tokens, its prompt has {length}")


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b
