"""A request's lengths, progress and timestamps (seconds of simulated time)."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass(eq=False, slots=True, init=False)
class Request:
    """There are no phases: `computed` catches up with `prompt_tokens + emitted`, and the step that
    closes the gap emits one token. A decoding request is one whose gap is a single token.

    While a request is one of the engine's decoders (`simulator.engine.decoders`), its `computed`
    and `emitted` are brought up to date only when it leaves them; policies never see it in
    between.

    Made with its lengths (and priority, prefix identity); every other field starts at its default.
    The `__init__` is written out: the one `dataclass` generates is interpreted Python, which a
    compiled build (setup.py) would call for every request."""

    id: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    """Lower runs first under `--scheduling-policy priority` (vLLM's convention)."""
    computed: int = 0
    emitted: int = 0
    scheduled: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    preemptions: int = 0
    blocks: int = 0
    """KV blocks it holds."""
    reserved_tokens: int = 0
    """KV reserved in full at admission (a padded batch); 0 = grow block by block."""
    admitted: int = -1
    """Admission number: the running set's order (each admission, re-admissions too, gets the next)."""
    content: tuple[tuple[int, int], ...] | None = None
    """Prefix identity: (segment id, tokens) pieces of its prompt and then its output; None: none
    (see `simulator.engine.kv`)."""
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache at its first admission (vLLM's num_cached_tokens)."""
    cached_tokens_host: int = 0
    """Of `cached_tokens`, those loaded from the KV cache's host tier (`simulator.engine.kv`)."""
    # The prefix cache's bookkeeping (simulator.engine.kv): chained block keys, the blocks it holds as
    # runs (block index it ends at, cached or uncached copies), and a waiting request's
    # looked-up hit.
    block_keys: list[int] | None = None
    held_runs: list[tuple[int, bool]] | None = None
    hit_blocks: int = 0
    hit_in_use: int = 0
    host_loaded: int = 0
    host_end: int = 0
    """Its last load from the KV cache's host tier while it waited (`KVBlocks.start_load`): blocks
    host_end - host_loaded to host_end, which its admission counts as host hits as far as it hits
    them."""
    # The engine's bookkeeping while the request is one of the decoders.
    decode_key: int = 0
    decode_since: int = 0
    # Speculative decoding (simulator.engine.speculation): the draft tokens accepted in each of its
    # verify steps, drawn at its first, and how many verify steps it has taken.
    accepted_draws: bytes | None = None
    verify_steps: int = 0

    def __init__(self, id: int = 0, arrival: float = 0.0, prompt_tokens: int = 0, output_tokens: int = 0,
                 priority: int = 0, content: tuple[tuple[int, int], ...] | None = None) -> None:
        # Defaults for every argument: copy and pickle make the object empty first, and a compiled
        # class's construction runs this __init__ then.
        self.id, self.arrival, self.prompt_tokens, self.output_tokens = id, arrival, prompt_tokens, output_tokens
        self.priority, self.content = priority, content
        self.computed = self.emitted = 0
        self.scheduled = self.first_token = self.finish = math.nan
        self.preemptions = self.blocks = self.reserved_tokens = 0
        self.admitted = -1
        self.cached_tokens = self.cached_tokens_host = 0
        self.block_keys = None
        self.held_runs = None
        self.hit_blocks = self.hit_in_use = self.host_loaded = self.host_end = 0
        self.decode_key = self.decode_since = 0
        self.accepted_draws = None
        self.verify_steps = 0

    @property
    def num_pending(self) -> int:
        """Tokens to compute before the next output token appears."""
        return self.prompt_tokens + self.emitted - self.computed

    @property
    def is_finished(self) -> bool:
        return self.emitted == self.output_tokens

    @property
    def is_decoding(self) -> bool:
        return self.emitted > 0 and self.num_pending == 1


class RequestRecord(NamedTuple):
    """One request's row of `RequestColumns` (NaN for times that did not happen)."""

    id: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    emitted: int
    scheduled: float
    first_token: float
    finish: float
    preemptions: int
    priority: int
    cached_tokens: int
    cached_tokens_host: int


@dataclass
class RequestColumns:
    """Every request that arrived, in id (arrival) order, one array per field (seconds, tokens);
    NaN times for what did not happen."""

    arrival: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    emitted: np.ndarray
    scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    preemptions: np.ndarray
    priority: np.ndarray
    cached_tokens: np.ndarray
    cached_tokens_host: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival)

    def __getitem__(self, i: int) -> RequestRecord:
        return RequestRecord(i, float(self.arrival[i]), int(self.prompt_tokens[i]), int(self.output_tokens[i]),
                             int(self.emitted[i]), float(self.scheduled[i]), float(self.first_token[i]),
                             float(self.finish[i]), int(self.preemptions[i]), int(self.priority[i]),
                             int(self.cached_tokens[i]), int(self.cached_tokens_host[i]))

    def __iter__(self) -> Iterator[RequestRecord]:
        for i in range(len(self)):
            yield self[i]

    @classmethod
    def from_requests(cls, requests: list[Request]) -> RequestColumns:
        """Each request's fields packed as one row (native reads in a compiled build, one call per
        request), the rows read as one structured array, then a contiguous array per field."""
        pack = _pack_record
        rows = bytearray()
        for r in requests:
            rows += pack(r.arrival, r.prompt_tokens, r.output_tokens, r.emitted, r.scheduled, r.first_token,
                         r.finish, r.preemptions, r.priority, r.cached_tokens, r.cached_tokens_host)
        table = np.frombuffer(rows, RECORD)
        return cls(*[np.ascontiguousarray(table[name]) for name in RECORD_FIELDS])


RECORD = np.dtype([("arrival", "=f8"), ("prompt_tokens", "=i8"), ("output_tokens", "=i8"), ("emitted", "=i8"),
                   ("scheduled", "=f8"), ("first_token", "=f8"), ("finish", "=f8"), ("preemptions", "=i8"),
                   ("priority", "=i8"), ("cached_tokens", "=i8"), ("cached_tokens_host", "=i8")])
"""A request's row as `RequestColumns.from_requests` packs it: its fields in `RequestColumns`' order,
native byte order, unaligned."""
RECORD_FIELDS: tuple[str, ...] = tuple(RECORD.fields or ())
_pack_record = struct.Struct("=" + "".join("d" if RECORD[name].kind == "f" else "q" for name in RECORD_FIELDS)).pack
