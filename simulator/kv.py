"""Paged KV-cache memory: how many blocks the GPU holds, who holds how many, and which are cached.

Without prefix caching (`--no-enable-prefix-caching`, a static batch, or a workload without prefix
identity) blocks are counts only: `num_free`, and `request.blocks` per request.

With it (vLLM V1's automatic prefix caching, `KVBlocks(caching=True)`):

- Identity. A request's `content` is a sequence of segments (segment id, tokens): a shared prefix,
  a unique question, a Mooncake 512-token block, a previous answer; tokens of equal segments at equal
  offsets are equal tokens. Block i of a request covers tokens [i * block_size, (i + 1) * block_size)
  and its key is a chained hash, a function of its parent's key and its own tokens, so equal keys
  mean equal prefixes: `block_keys` chains by segment (one hash per segment for what came before,
  one per block for the offset of its last token in its segment), which is that identity computed
  a segment at a time. Python's hash of a tuple of ints does not depend on PYTHONHASHSEED, so keys
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
  and a cached block popped is evicted (its key forgotten). Uncached free blocks are kept as runs of
  consecutive queue positions, so the queue costs O(1) per run, not per block; a request's blocks
  are registered, held, freed and evicted with C-level bulk operations (itertools over dicts), the
  block-by-block rules of tests/kv_reference.py, which the tests hold this to. A hit on a cached
  block nobody holds takes it out of the queue.
- Hits. A waiting request's hit is its longest prefix of cached blocks, at most
  `(prompt + emitted - 1) // block_size` blocks so that the last token is recomputed (vLLM). It is
  looked up, without side effects, whenever the policy reads the request in the waiting queue
  (`look_up`: `request.computed` becomes the hit's tokens; `extra_blocks` does not charge the hit
  blocks that other requests hold), and taken at admission (`take_hit`), after the step's running
  rows took their blocks (which may have evicted part of it). Requests admitted in the same step do
  not hit each other's blocks (vLLM's scheduler can; here they are registered after the step's
  admissions).
- Statistics as vLLM's: tokens queried (prompt + emitted at each admission) and hit.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import compress, islice, repeat, takewhile
from operator import add, eq, not_, sub
from typing import Any, cast

from simulator.errors import InputError
from simulator.model import ModelSpec
from simulator.request import Request

# Scratch memory vLLM's profiling run finds on top of the weights: the largest step's activations
# (hidden states, QKV, the gated MLP's intermediate) plus the fp32 logits of every sequence.


def activation_reserve_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak activation memory of the largest step the scheduler can build (vLLM profiles this)."""
    per_token = model.dtype_bytes * (
        2 * model.hidden_size
        + (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
        + 3 * model.ffn_intermediate_per_token)
    logits = max_num_seqs * model.vocab_size * 4
    return max_num_batched_tokens * per_token + logits


def check_weights_fit(model: ModelSpec, tensor_parallel_size: int, memory_bytes: int,
                      gpu_memory_utilization: float) -> None:
    """Refuse a model whose weights alone overflow each GPU's usable memory, saying how many GPUs
    it takes. `model` is one GPU's shard."""
    usable = memory_bytes * gpu_memory_utilization
    if model.weight_bytes < usable:
        return
    total = model.weight_bytes * tensor_parallel_size
    suggestion = tensor_parallel_size * 2
    while total / suggestion >= usable * 0.8:
        suggestion *= 2
    raise InputError(
        f"{model.name}'s weights ({model.weight_dtype or model.dtype}) need {model.weight_bytes / 1e9:.1f} GB per GPU "
        f"at --tensor-parallel-size {tensor_parallel_size}, more than the {usable / 1e9:.1f} GB usable "
        f"(--gpu-memory-utilization {gpu_memory_utilization} of {memory_bytes / 1e9:.1f} GB): "
        f"try --tensor-parallel-size {suggestion}")


def kv_capacity_blocks(*, memory_bytes: int, gpu_memory_utilization: float, weight_bytes: int,
                       activation_bytes: int, kv_bytes_per_token: int, block_size: int) -> int:
    """Blocks = (memory x utilization - weights - activations) / bytes per block."""
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise InputError(f"--block-size must be a positive number of tokens, got {block_size}")
    free = memory_bytes * gpu_memory_utilization - weight_bytes - activation_bytes
    blocks = int(free // (kv_bytes_per_token * block_size))
    if blocks < 1:
        raise InputError(
            f"no room for one KV block: {memory_bytes * gpu_memory_utilization / 1e9:.1f} GB usable "
            f"(--gpu-memory-utilization {gpu_memory_utilization}) minus {weight_bytes / 1e9:.1f} GB of weights "
            f"and {activation_bytes / 1e9:.1f} GB of activations leaves {max(free, 0) / 1e9:.1f} GB, less than one "
            f"block of --block-size {block_size} tokens ({kv_bytes_per_token * block_size / 1e9:.1f} GB); a larger "
            "--tensor-parallel-size shares the weights")
    return blocks


@dataclass
class KVBlocks:
    """Paged KV memory as block counts, and with `caching` the prefix cache over them (module
    docstring): each request holds `request.blocks`; which physical blocks they are does not affect
    timing."""

    num_blocks: int
    block_size: int
    caching: bool = False

    def __post_init__(self) -> None:
        self.num_free = self.num_blocks
        self.queried_tokens = 0
        self.hit_tokens = 0
        self._refs: dict[int, int] = {}
        """Cached block key -> requests holding it (0: free, in the queue)."""
        self._evictable: OrderedDict[int, int] = OrderedDict()
        """Free cached blocks in queue order: key -> queue position."""
        self._uncached: deque[list[int]] = deque([[0, self.num_blocks]])
        """Free uncached blocks as runs [first queue position, count], in queue order."""
        self._next_position = self.num_blocks
        self._segment_keys: dict[tuple[int, int, int, int], tuple[list[int], int]] = {}

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._refs)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def extra_blocks(self, request: Request, tokens: int) -> int:
        """Blocks a request must still get to hold `tokens` tokens (a waiting request's hit blocks
        that others hold cost none)."""
        return max(0, -(-tokens // self.block_size) - request.blocks - request.hit_in_use)

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
                continue
            count = n
            if uncached:  # evict up to the next uncached run in the queue
                count = bisect_left(list(islice(evictable.values(), n)), uncached[0][0])
            evicted = list(islice(evictable, count))
            deque(map(evictable.pop, evicted), 0)
            deque(map(self._refs.__delitem__, evicted), 0)
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
        held = request.held_keys or []
        self._free_uncached(request.blocks - len(held))
        refs = self._refs
        if None in held:  # uncached copies among them take their own places in the queue
            for key in reversed(held):
                if key is None:
                    self._free_uncached(1)
                else:
                    self._free_cached([key], [refs[key]])
        elif held:
            keys = cast(list[int], held)
            self._free_cached(keys, list(map(refs.__getitem__, keys)))
        held.clear()
        request.blocks = 0
        assert self.num_free <= self.num_blocks

    def _free_cached(self, keys: list[int], counts: list[int]) -> None:
        """Drop one reference to each of `keys` (cached, in block order); those left with none join
        the queue, last block first."""
        self._refs.update(zip(keys, map(sub, counts, repeat(1)), strict=True))
        freed = list(compress(reversed(keys), map(eq, reversed(counts), repeat(1))))
        position = self._next_position
        self._evictable.update(zip(freed, range(position, position + len(freed)), strict=True))
        self._next_position += len(freed)
        self.num_free += len(freed)

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

    def register(self, request: Request, tokens: int) -> None:
        """Cache the request's full blocks among its first `tokens` tokens that are not yet."""
        if request.content is None:
            return
        keys = self._keys(request)
        held = _held(request)
        new = keys[len(held):tokens // self.block_size]
        refs = self._refs
        if refs.keys().isdisjoint(new):
            refs.update(zip(new, repeat(1), strict=False))
            held.extend(new)
            return
        for key in new:
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
        refs = self._refs
        limit = (request.prompt_tokens + request.emitted - 1) // self.block_size
        hits = list(takewhile(refs.__contains__, islice(keys, limit)))
        request.computed = len(hits) * self.block_size
        request.hit_blocks = len(hits)
        request.hit_in_use = len(hits) - list(map(refs.__getitem__, hits)).count(0)

    def cached_tokens(self, request: Request) -> int:
        """Prompt tokens of `request` cached here now, as its admission here would skip them
        (block-aligned, the last prompt token left to compute); 0 without caching or prefix
        identity. It only reads: a prefix-aware router asks every server."""
        if not self.caching or request.content is None:
            return 0
        limit = (request.prompt_tokens + request.emitted - 1) // self.block_size
        hits = takewhile(self._refs.__contains__, islice(self._keys(request), limit))
        return sum(1 for _ in hits) * self.block_size

    def take_hit(self, request: Request) -> None:
        """At admission: hold the hit blocks `look_up` found that are still cached, and count the
        query."""
        if request.content is None:
            return
        refs = self._refs
        hits = list(takewhile(refs.__contains__, islice(self._keys(request), request.hit_blocks)))
        counts = list(map(refs.__getitem__, hits))
        unheld = list(compress(hits, map(not_, counts)))
        deque(map(self._evictable.pop, unheld), 0)
        self.num_free -= len(unheld)
        refs.update(zip(hits, map(add, counts, repeat(1)), strict=True))
        _held(request).extend(hits)
        request.blocks = len(hits)
        request.computed = len(hits) * self.block_size
        request.hit_blocks = request.hit_in_use = 0
        self.queried_tokens += request.prompt_tokens + request.emitted
        self.hit_tokens += request.computed
        if request.scheduled != request.scheduled:  # NaN: its first admission
            request.cached_tokens = request.computed

    def _keys(self, request: Request) -> list[int]:
        if request.block_keys is None:
            assert request.content is not None
            request.block_keys = block_keys(request.content, self.block_size, self._segment_keys)
        return request.block_keys


class WaitingWithHits:
    """A waiting queue as a policy reads it under prefix caching: each request it hands over is
    looked up first (`KVBlocks.look_up`), so its `computed` and `num_pending` count its hit."""

    def __init__(self, queue: Any, kv: KVBlocks) -> None:
        self._queue = queue
        self._kv = kv

    def __iter__(self) -> Iterator[Request]:
        look_up = self._kv.look_up
        for request in self._queue:
            look_up(request)
            yield request

    def __len__(self) -> int:
        return len(self._queue)

    def first(self) -> Request:
        request: Request = self._queue.first()
        self._kv.look_up(request)
        return request


def _held(request: Request) -> list[int | None]:
    if request.held_keys is None:
        request.held_keys = []
    return request.held_keys


SEGMENT_KEYS_KEPT = 1 << 16
"""Segments whose block keys `block_keys` remembers (then it starts afresh)."""


def block_keys(content: tuple[tuple[int, int], ...], block_size: int,
               memo: dict[tuple[int, int, int, int], tuple[list[int], int]]) -> list[int]:
    """The keys of the full blocks of `content` (segments as (segment id, tokens)).

    Chained by segment: `chain` stands for everything before a segment (0 at the start, then
    hash((chain, segment, tokens)) after each); a block ending `offset` tokens into a segment has
    key hash((chain, segment, offset)), which is thus a function of the whole prefix up to its last
    token. A segment's keys are computed once per chain and block size (`memo`), so a prefix many
    prompts share costs one pass."""
    keys: list[int] = []
    chain = position = 0
    for segment, length in content:
        known = memo.get((chain, segment, length, block_size))
        if known is None:
            ends = range(block_size - position % block_size, length + 1, block_size)
            known = (list(map(hash, zip(repeat(chain), repeat(segment), ends))), hash((chain, segment, length)))
            if len(memo) >= SEGMENT_KEYS_KEPT:
                memo.clear()
            memo[(chain, segment, length, block_size)] = known
        keys += known[0]
        chain = known[1]
        position += length
    return keys
