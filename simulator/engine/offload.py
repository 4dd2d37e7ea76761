"""The KV cache's host tier (`--kv-offload-gb`): blocks the GPU prefix cache evicts, kept in host
memory and loaded back on a hit instead of computed again. `simulator.engine.kv` calls it; the
rules, as `tests/kv_reference.py` states them again block by block:

- Stores. A cached block popped from the free queue (evicted) is stored under its key, in
  eviction order, as the most recently used; a key already here only becomes the most recently
  used. Past `HostTier.blocks` the least recently used is dropped. Stores cost no step time: they
  cross the link's device-to-host direction, which loads do not use (PCIe is full duplex).
- Hits. After a request's GPU hit (its longest prefix of GPU-cached blocks) come the blocks found
  here, one after another up to the first that is not, within the same limit: the hit is the GPU
  part then the host part (`Request.hit_blocks` counts both, `computed` their tokens).
- Loads. At admission the host part, as far as it is still here and free GPU blocks allow, is
  loaded: each of its keys, in block order, becomes the most recently used, then the request takes
  a GPU block for each from the free queue (the policy's `extra_blocks` charged them as blocks for
  tokens it computes) and registers them as it registers computed blocks. The step that admits it
  waits for its loads: the blocks loaded times `HostTier.block_bytes` over `HostTier.bandwidth`
  (`HostBlocks.take_load_time`), added to the step's time by the server (vLLM's connector loads
  asynchronously instead: docs/concepts/kv-cache.md).
- Decode stretches. While a looked-up hit has a host part, a stretch stops before it evicts any
  cached block (`KVBlocks.room_sparing_hits`): an eviction could lengthen that hit (the next block
  coming here) or, dropping a block from here, shorten it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class HostTier:
    """The host tier's size and link."""

    blocks: int
    """How many blocks it holds."""
    block_bytes: int
    """Bytes of one block on each GPU (its tensor-parallel shard), which crosses that GPU's own link."""
    bandwidth: float
    """Bytes/s of each GPU's host link, host to device."""


class HostBlocks:
    """The keys the host tier holds, least recently used first (the module docstring)."""

    def __init__(self, tier: HostTier) -> None:
        self.tier = tier
        self.stored = 0
        """Blocks stored (new here) so far."""
        self.loading = 0
        """Blocks loaded since `take_load_time` was last called."""
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def store(self, keys: list[int], first: int, end: int) -> None:
        """Evicted blocks `keys[first:end]`, the last first (as the free queue pops a span)."""
        held, capacity = self._keys, self.tier.blocks
        for i in range(end - 1, first - 1, -1):
            key = keys[i]
            if key in held:
                held.move_to_end(key)
                continue
            held[key] = None
            self.stored += 1
            if len(held) > capacity:
                held.popitem(last=False)

    def run_end(self, keys: list[int], first: int, end: int) -> int:
        """Where the run of `keys` held here from `first` on stops, at most `end`."""
        held = self._keys
        while first < end and keys[first] in held:
            first += 1
        return first

    def load(self, keys: list[int]) -> None:
        """`keys`, loaded, become the most recently used, in order."""
        for key in keys:
            self._keys.move_to_end(key)
        self.loading += len(keys)

    def take_load_time(self) -> float:
        """Seconds the loads since the last call take on the link (bytes / bandwidth); the step
        that made them waits for them."""
        seconds = self.loading * self.tier.block_bytes / self.tier.bandwidth
        self.loading = 0
        return seconds
