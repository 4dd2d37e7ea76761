"""Paged KV-cache memory: who holds how many blocks, and which are cached (how many blocks a GPU
holds: `simulator.deploy.memory`).

Without prefix caching (`--no-enable-prefix-caching`, a static batch, or a workload without prefix
identity) blocks are counts only: `num_free`, and `request.blocks` per request.

With it (vLLM V1's automatic prefix caching, `KVBlocks(caching=True)`):

- Identity. A request's `content` is a sequence of segments (segment id, tokens): a shared prefix,
  a unique question, a Mooncake 512-token block, a previous answer; tokens of equal segments at equal
  offsets are equal tokens. Block i of a request covers tokens [i * block_size, (i + 1) * block_size)
  and its key is a chained hash, a function of its parent's key and its own tokens, so equal keys
  mean equal prefixes: `block_keys` chains by segment (one hash per segment for what came before,
  plus the offset of a block's last token in its segment), which is that identity computed a
  segment at a time. Python's hash of a tuple of ints does not depend on PYTHONHASHSEED, so keys
  (and runs) are the same in every process; a 64-bit collision would count as a hit, as vLLM
  accepts with its own hash. Only full blocks have keys.
- Caching. A block is registered under its key when a request computes it outside a decode step
  (prefill, or recomputation after preemption: at scheduling, as vLLM does), and every full block a
  request computed is registered when it releases its KV (finish or preemption), so answers and
  decoded tokens become cacheable at the latest then. A key already cached is not registered twice:
  the second copy stays an ordinary block. Cached blocks are reference-counted.
- Free pool. Blocks with no reference, cached or not, count as free: `num_free`. They form one FIFO
  queue, vLLM's free-block queue: a released request appends its blocks in reverse (its last block
  first, so a request's tail is evicted before its prefix); taking a block pops the queue's head,
  and a cached block popped is evicted (its key forgotten). A hit on a cached block nobody holds
  takes it out of the queue.
- Spans. The rules are block by block (tests/kv_reference.py says them so, and the tests hold this
  module to it, table for table); the bookkeeping is by spans, so it costs per span, not per block.
  A span is consecutive cached blocks of one chain that the same requests hold (`Span`): created
  whole when a request registers blocks not cached, split where a hit ends inside it, shortened
  from its end when evicted. Only a span's first key is indexed: a key is in at most one span, so
  walking a request's keys, the span holding block j either begins at j or holds block j - 1 too
  (`_pieces`). A request holds its blocks as runs (cached spans, uncached copies); freed, a span
  joins the queue whole, its last block first, as a request's blocks released in reverse would;
  uncached free blocks are runs of counts in the same queue.
- Hits. A waiting request's hit is its longest prefix of cached blocks, at most
  `(prompt + emitted - 1) // block_size` blocks so that the last token is recomputed (vLLM). It is
  looked up, without side effects, whenever the policy reads the request in the waiting queue
  (`look_up`: `request.computed` becomes the hit's tokens; `extra_blocks` does not charge the hit
  blocks that other requests hold), and taken at admission (`take_hit`), after the step's running
  rows took their blocks (which may have evicted part of it). Requests admitted in the same step do
  not hit each other's blocks (vLLM's scheduler can; here they are registered after the step's
  admissions).
- Statistics as vLLM's: tokens queried (prompt + emitted at each admission) and hit.

A host tier (`--kv-offload-gb`): evicted blocks go to host memory (`simulator.engine.offload`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from itertools import compress, count
from typing import Any, Final

from mypy_extensions import mypyc_attr

from simulator.engine.blocks import block_keys, hold_run
from simulator.engine.offload import HostBlocks, HostTier
from simulator.engine.request import Request


@dataclass(eq=False, slots=True)
class Span:
    """Cached blocks `keys[first:end]` (block indices first..end - 1 of every request whose prompt
    they begin), held by the same `refs` requests; with none, free and in the free queue, where
    its last block comes first."""

    keys: list[int]
    first: int
    end: int
    refs: int


HOST_READ: Final = Span([], 0, 0, 0)  # in `KVBlocks.read_hits`: a looked-up hit with a host part


@mypyc_attr(allow_interpreted_subclasses=True)  # tests/kv_reference.py checks it block by block (setup.py)
@dataclass
class KVBlocks:
    """Paged KV memory as block counts, and with `caching` the prefix cache over them (module
    docstring): each request holds `request.blocks`; which physical blocks they are does not affect
    timing."""

    num_blocks: int
    block_size: int
    caching: bool = False
    host: HostTier | None = None
    """A host tier under the prefix cache (with `caching` only)."""

    def __post_init__(self) -> None:
        self.num_free = self.num_blocks
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.host_hit_tokens = 0
        """Of `hit_tokens`, those loaded from the host tier."""
        self.offload = HostBlocks(self.host) if self.host is not None else None
        self._starts: dict[int, Span] = {}
        """Each cached span by its first block's key (a cached key is in one span)."""
        self._queue: deque[Span | list[int]] = deque([[self.num_blocks]])
        """Free blocks in queue order: free spans, and uncached blocks as runs [count]. A span
        emptied by a hit stays in it, empty, until the head reaches it."""
        self._num_cached = 0
        self.read_hits: list[tuple[Span, int]] = []
        """Free spans holding part of a hit `look_up` found, with where that part stops, since the
        server last cleared it (before each policy call): what a decode stretch must not evict."""
        self.host_reads: list[Request] = []
        """Requests `look_up` found a hit with a host part for, in order: loads to start (`start_load`)."""

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return self._num_cached

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def extra_blocks(self, request: Request, tokens: int) -> int:
        """Blocks a request must still get to hold `tokens` tokens (a waiting request's hit blocks
        that others hold cost none)."""
        extra = -(-tokens // self.block_size) - request.blocks - request.hit_in_use
        return extra if extra > 0 else 0

    def take(self, n: int) -> None:
        """`n` blocks out of the free pool, from the head of the queue (evicting cached ones)."""
        assert n <= self.num_free, f"{n} blocks taken with {self.num_free} free"
        self.num_free -= n
        if not self.caching:
            return
        queue = self._queue
        while n:
            entry = queue[0]
            if isinstance(entry, Span):
                count = min(n, entry.end - entry.first)
                if self.offload is not None and count:
                    self.offload.store(entry.keys, entry.end - count, entry.end)
                entry.end -= count
                self._num_cached -= count
                if entry.end == entry.first:
                    queue.popleft()
                    if count:
                        del self._starts[entry.keys[entry.first]]
            else:
                count = min(n, entry[0])
                entry[0] -= count
                if not entry[0]:
                    queue.popleft()
            n -= count

    def grow(self, request: Request, tokens: int) -> None:
        extra = self.extra_blocks(request, tokens)
        assert extra <= self.num_free, f"request {request.id} needs {extra} blocks, {self.num_free} free"
        self.take(extra)
        request.blocks += extra

    def release(self, request: Request) -> None:
        """Give back the request's blocks; with caching, its full computed blocks stay cached."""
        if not self.caching:
            self.num_free += request.blocks
            request.blocks = 0
            assert self.num_free <= self.num_blocks
            return
        self.register(request, request.computed)
        runs = request.held_runs or []
        self._free_uncached(request.blocks - (runs[-1][0] if runs else 0))
        starts, queue = self._starts, self._queue
        keys = request.block_keys
        for k in range(len(runs) - 1, -1, -1):
            first, (end, cached) = runs[k - 1][0] if k else 0, runs[k]
            if not cached:
                self._free_uncached(end - first)
                continue
            assert keys is not None
            spans = []
            while first < end:  # its cached runs are whole spans (a hit splits the span it ends in)
                span = starts[keys[first]]
                spans.append(span)
                first = span.end
            for span in reversed(spans):
                span.refs -= 1
                if not span.refs:
                    queue.append(span)
                    self.num_free += span.end - span.first
        request.held_runs = None
        request.blocks = 0
        assert self.num_free <= self.num_blocks

    def _free_uncached(self, count: int) -> None:
        if not count:
            return
        queue = self._queue
        if queue and not isinstance(queue[-1], Span):
            queue[-1][0] += count
        else:
            queue.append([count])
        self.num_free += count

    def register(self, request: Request, tokens: int) -> None:
        """Cache the request's full blocks among its first `tokens` tokens that are not yet."""
        if request.content is None:
            return
        keys = self._keys(request)
        runs = request.held_runs
        held = runs[-1][0] if runs else 0
        end = min(tokens // self.block_size, len(keys))
        if held >= end:
            return
        # After a block it holds cached, its next block can only begin a span; after a copy, walk
        # from the start (the copy's span may reach on).
        for span, first, stop in self._pieces(keys, held if not runs or runs[-1][1] else 0, end, whole=True):
            if stop <= held:
                continue
            first = max(first, held)
            if span is None:
                self._starts[keys[first]] = Span(keys, first, stop, 1)
                self._num_cached += stop - first
            hold_run(request, stop, cached=span is None)
            held = stop

    def _pieces(self, keys: list[int], i: int, end: int, whole: bool) -> list[tuple[Any, int, int]]:
        """keys[i:end] as (span, first, stop) pieces in order, span None where not cached (with
        `whole`; else up to the first block not cached). No span may hold both keys[i - 1] and
        keys[i]: a key is in one span, so the span holding keys[j] either begins at j or holds
        keys[j - 1] too."""
        starts = self._starts
        pieces: list[tuple[Any, int, int]] = []
        while i < end:
            span = starts.get(keys[i])
            if span is None:
                if not whole:
                    break
                rest = keys[i + 1:end]
                stop = end if starts.keys().isdisjoint(rest) else next(
                    compress(count(i + 1), map(starts.__contains__, rest)))
                pieces.append((None, i, stop))
                i = stop
                continue
            stop = min(end, span.end)
            theirs = span.keys
            if theirs is not keys and keys[stop - 1] != theirs[stop - 1]:  # the prompts part inside it
                # Chained keys: equal at a block, equal at every block before it.
                stop = i + bisect_left(range(i, stop), True, key=lambda j: keys[j] != theirs[j])
            pieces.append((span, i, stop))
            i = stop
        return pieces

    def look_up(self, request: Request) -> None:
        """A waiting request's hit as of now, without taking it (see the module docstring)."""
        if request.content is None:
            return
        keys = self._keys(request)
        limit = self._hit_limit(request, keys)
        hits, in_use = self._gpu_hit(keys, limit, self.read_hits)
        if self.offload is not None and hits < limit:
            on_host = self.offload.run_end(keys, hits, limit)
            if on_host > hits:
                self.read_hits.append((HOST_READ, on_host))
                self.host_reads.append(request)
                hits = on_host
        request.computed = hits * self.block_size
        request.hit_blocks = hits
        request.hit_in_use = in_use

    def _gpu_hit(self, keys: list[int], limit: int, read: list[tuple[Span, int]] | None) -> tuple[int, int]:
        """The longest prefix of GPU-cached blocks among `keys[:limit]`, and how many other requests
        hold; the free spans holding part of it are added to `read` (with where that part stops)."""
        hits = in_use = 0
        for span, first, stop in self._pieces(keys, 0, limit, whole=False):
            hits = stop
            if span.refs:
                in_use += stop - first
            elif read is not None:
                read.append((span, stop))
        return hits, in_use

    def cached_tokens(self, request: Request, popped: int = 0) -> int:
        """Prompt tokens of `request` cached here once `popped` more blocks are taken (a decode
        stretch in flight took them at its steps' starts, and commits them at its end), as its
        admission here would skip them (block-aligned, the last prompt token left to compute); 0
        without caching or prefix identity. It only reads: a prefix-aware router asks every server."""
        if not self.caching or request.content is None:
            return 0
        keys = self._keys(request)
        limit = self._hit_limit(request, keys)
        ends = self._ends_after_taking(popped)
        hits = 0
        for span, first, stop in self._pieces(keys, 0, limit, whole=False):
            end = ends.get(span, stop)
            if end < stop:
                return max(end, first) * self.block_size
            hits = stop
        return hits * self.block_size

    def _ends_after_taking(self, n: int) -> dict[Span, int]:
        """Where the free spans `take(n)` would shorten end then."""
        ends: dict[Span, int] = {}
        for entry in self._queue:
            if not n:
                break
            size = entry.end - entry.first if isinstance(entry, Span) else entry[0]
            if isinstance(entry, Span) and size:
                ends[entry] = entry.end - min(n, size)
            n -= min(n, size)
        return ends

    def room_sparing_hits(self, cap: int) -> int:
        """Blocks `take` can pop before it evicts a block of a hit in `read_hits` (a hit the
        policy read, which would shrink), or any cached block while such a hit has a host part;
        or `cap` if at least that many."""
        if not self.read_hits:
            return cap
        stops: dict[Span, int] = {}
        for span, stop in self.read_hits:
            stops[span] = max(stop, stops.get(span, 0))
        room = 0
        for entry in self._queue:
            if room >= cap:
                break
            if isinstance(entry, Span):
                if HOST_READ in stops and entry.end > entry.first:
                    return min(cap, room)
                if entry in stops:
                    return min(cap, room + entry.end - stops[entry])
                room += entry.end - entry.first
            else:
                room += entry[0]
        return min(room, cap)

    def take_hit(self, request: Request) -> None:
        """At admission: hold the hit blocks `look_up` found that are still cached, and count the
        query (those its last load brought from the host tier as host hits)."""
        if request.content is None:
            return
        assert not request.held_runs
        hits = request.blocks = self._hold_hit(request, self._keys(request), request.hit_blocks)
        request.computed = hits * self.block_size
        loaded = max(0, min(hits, request.host_end) - (request.host_end - request.host_loaded))
        request.hit_blocks = request.hit_in_use = request.host_loaded = request.host_end = 0
        self.queried_tokens += request.prompt_tokens + request.emitted
        self.hit_tokens += request.computed
        self.host_hit_tokens += loaded * self.block_size
        if request.scheduled != request.scheduled:  # NaN: its first admission
            request.cached_tokens = request.computed
            request.cached_tokens_host = loaded * self.block_size

    def _hold_hit(self, request: Request, keys: list[int], end: int) -> int:
        """The request holds its longest prefix of cached blocks among `keys[:end]`; returns its length."""
        starts, hits = self._starts, 0
        for span, first, stop in self._pieces(keys, 0, end, whole=False):
            # The hit is a prefix of the span: that part is held by one more request, as a new span;
            # the rest stays where it was (in the queue if free: dropped, emptied, when the head
            # reaches it).
            held = Span(keys, first, stop, span.refs + 1)
            span.first = stop
            if stop < span.end:
                starts[span.keys[stop]] = span
            if not span.refs:
                self.num_free -= stop - first
            starts[keys[first]] = held
            hits = stop
        if hits:
            hold_run(request, hits, cached=True)
        return hits

    def start_load(self, request: Request) -> int:
        """Start loading a waiting request's host part (1), if it has one (else 0) and it fits (else
        -1): the `simulator.engine.offload` docstring. When the load ends it releases its blocks."""
        assert self.offload is not None and not request.held_runs
        keys = self._keys(request)
        limit = self._hit_limit(request, keys)
        hits, in_use = self._gpu_hit(keys, limit, None)
        on_host = self.offload.run_end(keys, hits, limit)
        if on_host == hits:
            return 0
        if on_host - in_use > self.num_free:
            return -1
        self._hold_hit(request, keys, hits)
        self.offload.load(keys[hits:on_host])
        self.take(on_host - hits)  # the GPU blocks they are loaded into
        request.blocks = on_host
        request.computed = on_host * self.block_size
        request.host_loaded = on_host - hits
        request.host_end = on_host
        request.hit_blocks = request.hit_in_use = 0
        return 1

    def _hit_limit(self, request: Request, keys: list[int]) -> int:
        """The most blocks a hit may hold: full blocks only, the last token left to compute."""
        return min(len(keys), (request.prompt_tokens + request.emitted - 1) // self.block_size)

    def _keys(self, request: Request) -> list[int]:
        if request.block_keys is None:
            assert request.content is not None
            request.block_keys = block_keys(request.content, self.block_size)
        return request.block_keys
