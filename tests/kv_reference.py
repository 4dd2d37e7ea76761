"""The prefix cache block by block, one Python step per block: the reference `simulator.kv`'s
KVBlocks (which works on runs of blocks at once) must match to the last bit (tests/test_prefix_cache.py).
Keys come from `simulator.kv.block_keys`, so both hash the same blocks alike."""

from __future__ import annotations

from collections import OrderedDict, deque

from simulator.kv import KVBlocks
from simulator.request import Request


class ReferenceKVBlocks(KVBlocks):
    """`simulator.kv.KVBlocks` with its cache bookkeeping one block at a time, in state of its own:
    each cached key's reference count, the free queue as positions (cached blocks one by one,
    uncached ones as runs), and each request's held keys (None: an uncached copy)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, int] = OrderedDict()
        self._uncached: deque[list[int]] = deque([[0, self.num_blocks]])
        self._next_position = self.num_blocks
        self._held: dict[int, list[int | None]] = {}

    @property
    def num_cached(self) -> int:
        return len(self._refs)

    def _free_uncached(self, count: int) -> None:
        if not count:
            return
        uncached = self._uncached
        if uncached and uncached[-1][0] + uncached[-1][1] == self._next_position:
            uncached[-1][1] += count
        else:
            uncached.append([self._next_position, count])
        self._next_position += count
        self.num_free += count

    def take(self, n: int) -> None:
        """`n` blocks out of the free pool, from the head of the queue (evicting cached ones)."""
        assert n <= self.num_free, f"{n} blocks taken with {self.num_free} free"
        self.num_free -= n
        if not self.caching:
            return
        uncached, evictable = self._uncached, self._evictable
        while n:
            head = next(iter(evictable.values())) if evictable else self._next_position
            if uncached and uncached[0][0] < head:
                run = uncached[0]
                count = min(n, run[1], head - run[0])
                run[0] += count
                run[1] -= count
                n -= count
                if not run[1]:
                    uncached.popleft()
            else:
                key, _ = evictable.popitem(last=False)
                del self._refs[key]
                n -= 1

    def release(self, request: Request) -> None:
        """Give back the request's blocks; with caching, its full computed blocks stay cached."""
        if not self.caching:
            self.num_free += request.blocks
            request.blocks = 0
            assert self.num_free <= self.num_blocks
            return
        self.register(request, request.computed)
        held = self._held.pop(request.id, [])
        self._free_uncached(request.blocks - len(held))
        refs = self._refs
        for key in reversed(held):
            if key is None:
                self._free_uncached(1)
                continue
            refs[key] -= 1
            if not refs[key]:
                self._evictable[key] = self._next_position
                self._next_position += 1
                self.num_free += 1
        request.blocks = 0
        assert self.num_free <= self.num_blocks

    def register(self, request: Request, tokens: int) -> None:
        """Cache the request's full blocks among its first `tokens` tokens that are not yet."""
        if request.content is None:
            return
        keys = self._keys(request)
        held = self._held.setdefault(request.id, [])
        refs = self._refs
        for i in range(len(held), min(tokens // self.block_size, len(keys))):
            key = keys[i]
            if key in refs:
                held.append(None)  # an equal block is cached already: this copy stays uncached
            else:
                refs[key] = 1
                held.append(key)

    def look_up(self, request: Request) -> None:
        """A waiting request's hit as of now, without taking it (see the module docstring)."""
        if request.content is None:
            return
        keys = self._keys(request)
        limit = min(len(keys), (request.prompt_tokens + request.emitted - 1) // self.block_size)
        refs = self._refs
        hits = in_use = 0
        while hits < limit:
            ref = refs.get(keys[hits])
            if ref is None:
                break
            in_use += ref > 0
            hits += 1
        request.computed = hits * self.block_size
        request.hit_blocks = hits
        request.hit_in_use = in_use

    def take_hit(self, request: Request) -> None:
        """At admission: hold the hit blocks `look_up` found that are still cached, and count the
        query."""
        if request.content is None:
            return
        keys = self._keys(request)
        held = self._held.setdefault(request.id, [])
        refs = self._refs
        for key in keys[:request.hit_blocks]:
            ref = refs.get(key)
            if ref is None:
                break
            if not ref:
                del self._evictable[key]
                self.num_free -= 1
            refs[key] = ref + 1
            held.append(key)
        request.blocks = len(held)
        request.computed = len(held) * self.block_size
        request.hit_blocks = request.hit_in_use = 0
        self.queried_tokens += request.prompt_tokens + request.emitted
        self.hit_tokens += request.computed
        if request.scheduled != request.scheduled:  # NaN: its first admission
            request.cached_tokens = request.computed

