"""The decoders: the running requests that need exactly one token per step, kept so that a step
costs O(1) however many there are.

The decoders keep `steps`, the number of steps in which they ran, and per decoder `decode_key =
prompt + emitted - steps`, constant while it decodes. From it follow its emitted tokens (`key -
prompt + steps`), its context (`key + steps`) and the step it finishes in (`output + prompt - key`).
As each decoder joins or leaves they keep:

- `decode_context`: the sum of the decoders' contexts after their next token, `key_sum + count *
  steps`, as the cost model wants it;
- a heap of finishing steps, each entry one int, `step << 32 | admitted` (so (step, admission)
  order, admission numbers being unique and below 2**32), and the request of each entry: an entry
  is stale when its request left the decoders since, or holds another entry now (it left and joined
  again, or was admitted again); a request that left and joined again at the same entry is popped once;
- how many growing decoders sit in each residue of `key` modulo the block size: a decoder needs a new
  KV block when its context crosses a block boundary, so the blocks the next step needs are one count
  (`blocks_needed`). Decoders whose KV was reserved in full never need one.

A decoder's state is brought up to date only when it leaves; its tokens are then one run of
consecutive decode steps, which `leave` hands back for the step log.
"""

from __future__ import annotations

from heapq import heappop, heappush

import numpy as np

from simulator.engine.kv import KVBlocks
from simulator.engine.request import Request


class Decoders:
    """The running requests that need one token per step, as one (see the module docstring)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.steps = 0
        self.key_sum = 0
        self.members: set[Request] = set()
        self.count = 0
        """How many decoders there are (`len(members)`, kept as they join and leave)."""
        self.residues = [0] * block_size
        self._finishing: list[int] = []
        """A heap of `finish_entry`s: ints, compared as such (a heap of tuples compared field by field
        cost several times as much per push and pop)."""
        self._finisher: dict[int, Request] = {}
        """Each entry's request, until the entry is popped."""

    def __len__(self) -> int:
        return self.count

    @property
    def decode_context(self) -> int:
        """Sum of the decoders' contexts after their next token (the cost model's `decode_context`)."""
        return self.key_sum + self.count * self.steps

    def join(self, request: Request) -> None:
        key = request.prompt_tokens + request.emitted - self.steps
        request.decode_key = key
        request.decode_since = self.steps
        self.members.add(request)
        self.count += 1
        self.key_sum += key
        if not request.reserved_tokens:
            self.residues[key % self.block_size] += 1
        entry = finish_entry(request)
        self._finisher[entry] = request
        heappush(self._finishing, entry)

    def leave(self, request: Request, steps: int | None = None) -> int:
        """Bring the request's state up to date (as of `steps`, by default now) and take it out of
        the decoders. Returns how many tokens it emitted as a decoder: one in each of the decode
        steps from its `decode_since`."""
        key = request.decode_key
        steps = self.steps if steps is None else steps
        self.members.remove(request)
        self.count -= 1
        self.key_sum -= key
        if not request.reserved_tokens:
            self.residues[key % self.block_size] -= 1
            request.blocks = self._held(key, steps)
        request.emitted = key - request.prompt_tokens + steps
        request.computed = request.prompt_tokens + request.emitted - 1
        return steps - request.decode_since

    def blocks_to_hold(self, kv: KVBlocks) -> int:
        """KV blocks the decoders still need to hold all their tokens, prompt and every output token
        (`kv.extra_blocks` of each at its full length), read off their keys without bringing them
        up to date: a growing decoder holds the blocks of its context before its next token, as
        `leave` sets them; one whose KV was reserved in full holds what it was given."""
        total, steps = 0, self.steps
        for request in self.members:
            held = request.blocks if request.reserved_tokens else self._held(request.decode_key, steps)
            extra = kv.blocks_for(request.prompt_tokens + request.output_tokens) - held - request.hit_in_use
            if extra > 0:
                total += extra
        return total

    def _held(self, key: int, steps: int) -> int:
        """The KV blocks a growing decoder of `key` holds after `steps` steps: its context's before
        its next token."""
        return -(-(key + steps - 1) // self.block_size)

    def blocks_needed(self, ahead: int = 0) -> int:
        """KV blocks the decoders need for the step `ahead` steps from now."""
        return self.residues[(1 - self.steps - ahead) % self.block_size]

    def blocks_needed_ahead(self, k: int) -> np.ndarray:
        """`blocks_needed(j)` for j in 0..k-1, as an array."""
        offsets = np.arange(k, dtype=np.int64)
        return np.asarray(self.residues, dtype=np.int64)[(1 - self.steps - offsets) % self.block_size]

    def needs_block(self, request: Request) -> bool:
        """Does this decoder need a new block in the next step?"""
        block_size = self.block_size
        return not request.reserved_tokens and request.decode_key % block_size == (1 - self.steps) % block_size

    def take_blocks(self, kv: KVBlocks, need: int) -> None:
        """Take the `need` blocks the decoders' next step needs (`blocks_needed`), as a count: each
        decoder's own are counted when it leaves."""
        kv.take(need)

    def blocks_needed_by(self, request: Request) -> int:
        """KV blocks this decoder needs for the next step."""
        return int(self.needs_block(request))

    def next_finish(self) -> int:
        """The step count at which the next decoder emits its last token (a large number if none)."""
        finishing = self._finishing
        while finishing and not self._current(finishing[0]):
            self._finisher.pop(heappop(finishing), None)
        return finishing[0] >> 32 if finishing else 1 << 62

    def pop_finished(self) -> list[tuple[int, Request]]:
        """(step, decoder) for the decoders whose last token came in a step up to now, in (step,
        admission) order; they stay members until the caller makes them leave."""
        done = []
        finishing, finisher, below = self._finishing, self._finisher, (self.steps + 1) << 32
        while finishing and finishing[0] < below:
            entry = heappop(finishing)
            if self._current(entry):
                done.append((entry >> 32, finisher.pop(entry)))
            else:
                finisher.pop(entry, None)
        return done

    def _current(self, entry: int) -> bool:
        """Is `entry` its request's as it decodes now (not stale, not popped already)?"""
        request = self._finisher.get(entry)
        return request is not None and request in self.members and finish_entry(request) == entry


def finish_entry(decoder: Request) -> int:
    """A decoder's entry in the finishing heap: the step it finishes in, then its admission number."""
    return (decoder.output_tokens + decoder.prompt_tokens - decoder.decode_key) << 32 | decoder.admitted
