"""The prefix cache block by block, one Python step per block: the reference `simulator.engine.kv`'s
KVBlocks (which works on runs of blocks at once) must match to the last bit (tests/test_prefix_cache.py).
Keys come from `simulator.engine.kv.block_keys`, so both hash the same blocks alike."""

from __future__ import annotations

from collections import OrderedDict, deque

from simulator.engine.kv import KVBlocks
from simulator.engine.offload import HostBlocks, HostTier
from simulator.engine.request import Request


class ReferenceHost(HostBlocks):
    """The host tier's counters as `simulator.engine.offload.HostBlocks` keeps them (the keys are
    `ReferenceKVBlocks`'s; a subclass, as the compiled KVBlocks holds only a HostBlocks)."""

    def __init__(self, tier: HostTier) -> None:
        super().__init__(tier)
        self.held = 0

    def __len__(self) -> int:
        return self.held


class ReferenceKVBlocks(KVBlocks):
    """`simulator.engine.kv.KVBlocks` with its cache bookkeeping one block at a time, in state of its own:
    each cached key's reference count, the free queue as positions (cached blocks one by one,
    uncached ones as runs), and each request's held keys (None: an uncached copy). The host tier is
    each host key's time of last use (a counter), the least recent dropped by a search."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._host_used: dict[int, int] = {}
        self._host_clock = 0
        self.offload = ReferenceHost(self.host) if self.host is not None else None
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
                self._store_one(key)
                n -= 1

    def _store_one(self, key: int) -> None:
        """An evicted block goes to the host tier (most recently used); the least recently used
        one past its capacity is dropped."""
        if self.host is None:
            return
        assert isinstance(self.offload, ReferenceHost)
        if key not in self._host_used:
            self.offload.stored += 1
        self._use(key)
        if len(self._host_used) > self.host.blocks:
            del self._host_used[min(self._host_used, key=self._host_used.__getitem__)]
        self.offload.held = len(self._host_used)

    def _use(self, key: int) -> None:
        self._host_clock += 1
        self._host_used[key] = self._host_clock

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
            if not ref:
                self.read_hits.append(keys[hits])  # type: ignore[arg-type]  # a key here, not a span
            hits += 1
        gpu_hits = hits
        while hits < limit and keys[hits] in self._host_used:
            hits += 1
        if hits > gpu_hits:
            self.read_hits.append(None)  # type: ignore[arg-type]  # a hit with a host part
            self.host_reads.append(request)
        request.computed = hits * self.block_size
        request.hit_blocks = hits
        request.hit_in_use = in_use

    def take_hit(self, request: Request) -> None:
        """At admission: hold the hit blocks `look_up` found that are still cached (a request
        loaded from the host holds its own already), and count the query."""
        if request.content is None:
            return
        held = self._hold_cached(request, request.hit_blocks)
        request.blocks = held
        request.computed = held * self.block_size
        first_loaded = request.host_end - request.host_loaded
        loaded = sum(1 for i in range(held) if first_loaded <= i < request.host_end)
        request.hit_blocks = request.hit_in_use = request.host_loaded = request.host_end = 0
        self.queried_tokens += request.prompt_tokens + request.emitted
        self.hit_tokens += request.computed
        self.host_hit_tokens += loaded * self.block_size
        if request.scheduled != request.scheduled:  # NaN: its first admission
            request.cached_tokens = request.computed
            request.cached_tokens_host = loaded * self.block_size

    def _hold_cached(self, request: Request, end: int) -> int:
        """Hold the request's cached blocks among its first `end`, up to the first not cached."""
        keys = self._keys(request)
        held = self._held.setdefault(request.id, [])
        refs = self._refs
        for key in keys[:end]:
            ref = refs.get(key)
            if ref is None:
                break
            if not ref:
                del self._evictable[key]
                self.num_free -= 1
            refs[key] = ref + 1
            held.append(key)
        return len(held)

    def start_load(self, request: Request) -> int:
        """Load the request's host part if all of it fits beside its GPU part's free blocks."""
        keys = self._keys(request)
        limit = min(len(keys), (request.prompt_tokens + request.emitted - 1) // self.block_size)
        gpu = 0
        while gpu < limit and keys[gpu] in self._refs:
            gpu += 1
        host = gpu
        while host < limit and keys[host] in self._host_used:
            host += 1
        if host == gpu:
            return 0
        free_gpu_part = sum(1 for key in keys[:gpu] if self._refs[key] == 0)
        if free_gpu_part + host - gpu > self.num_free:
            return -1
        self._hold_cached(request, gpu)
        for key in keys[gpu:host]:
            self._use(key)
        self.take(host - gpu)
        request.blocks = host
        request.computed = host * self.block_size
        request.host_loaded = host - gpu
        request.host_end = host
        request.hit_blocks = request.hit_in_use = 0
        return 1

    def room_sparing_hits(self, cap: int) -> int:
        """Blocks `take` can pop before it evicts a block of a hit `look_up` recorded: the free
        blocks queued ahead of the first such block (the queue pops in order of position)."""
        keys: set[int] = set(self.read_hits)  # type: ignore[arg-type]  # this look_up records keys
        read = [self._evictable[key] for key in keys if key in self._evictable]
        if None in keys and self._evictable:  # a host part: no cached block may be evicted
            read.append(min(self._evictable.values()))
        if not read:
            return cap
        first = min(read)
        ahead = sum(1 for position in self._evictable.values() if position < first)
        ahead += sum(min(max(first - start, 0), count) for start, count in self._uncached)
        return min(ahead, cap)

    def cached_tokens(self, request: Request, popped: int = 0) -> int:
        """The request's cached prefix once `popped` more blocks are taken (block by block)."""
        if not self.caching or request.content is None:
            return 0
        keys = self._keys(request)
        limit = min(len(keys), (request.prompt_tokens + request.emitted - 1) // self.block_size)
        evicted = self._evicted_by(popped)
        hits = 0
        while hits < limit and keys[hits] in self._refs and keys[hits] not in evicted:
            hits += 1
        return hits * self.block_size

    def _evicted_by(self, n: int) -> set[int]:
        """The cached keys `take(n)` would evict, as `take` walks the queue (without taking)."""
        runs = deque([list(run) for run in self._uncached])
        cached = iter(self._evictable.items())
        following = next(cached, None)
        evicted: set[int] = set()
        while n:
            head = following[1] if following is not None else self._next_position
            if runs and runs[0][0] < head:
                count = min(n, runs[0][1], head - runs[0][0])
                runs[0][0] += count
                runs[0][1] -= count
                n -= count
                if not runs[0][1]:
                    runs.popleft()
            elif following is not None:
                evicted.add(following[0])
                following = next(cached, None)
                n -= 1
            else:
                break
        return evicted
