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
- Loads. A waiting request whose looked-up hit has a host part is not shown to the policy; after
  the step the policy chose took its blocks, if it preempted none (as vLLM's scheduler), those the
  policy passed over load in the order it passed them, until one does not fit
  (`KVBlocks.start_load`): its hit is looked up again, and if the free blocks hold its host part
  and the free cached blocks of its GPU part, it holds its GPU
  part, each host key in block order becomes the most recently used, it takes a GPU block for each
  from the free queue, and it leaves the waiting queue while the blocks cross the host link. Loads
  cross it one after another (`HostLink`), each taking its blocks times `HostTier.block_bytes` over
  `HostTier.bandwidth`; no step waits for them. When a load ends, the request releases its blocks,
  cached, and rejoins the waiting queue at its front (in its place under priority scheduling),
  where its hit now finds them on the GPU; its admission counts those it loaded as host hits
  (`Request.host_end`). vLLM keeps them allocated to the request until it is scheduled; here a
  waiting request holds no block, as a request that held blocks while waiting could starve a
  preempted one ahead of it for ever (a small cache and token budget did). This is vLLM's
  OffloadingConnector, which loads asynchronously (its scheduler side returns `(hit tokens, True)`
  from `get_num_new_matched_tokens`, and the request waits in WAITING_FOR_REMOTE_KVS with its
  blocks allocated, vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py).
- Decode stretches. A step after which loads may start is taken alone (the server); and while a
  looked-up hit has a host part, a stretch stops before it evicts any cached block
  (`KVBlocks.room_sparing_hits`): an eviction could lengthen that hit (the next block coming here)
  or, dropping a block from here, shorten it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from mypy_extensions import mypyc_attr


@dataclass(frozen=True)
class HostTier:
    """The host tier's size and link."""

    blocks: int
    """How many blocks it holds."""
    block_bytes: int
    """Bytes of one block on each GPU (its tensor-parallel shard), which crosses that GPU's own link."""
    bandwidth: float
    """Bytes/s of each GPU's host link, host to device."""

    def __deepcopy__(self, memo: dict[int, object]) -> HostTier:
        return self  # immutable; and a compiled frozen dataclass cannot be copied field by field


@mypyc_attr(allow_interpreted_subclasses=True)  # tests/kv_reference.py keeps its own (setup.py)
class HostBlocks:
    """The keys the host tier holds, least recently used first (the module docstring)."""

    def __init__(self, tier: HostTier) -> None:
        self.tier = tier
        self.stored = 0
        """Blocks stored (new here) so far."""
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


class HostLink:
    """The host-to-GPU direction of a server's host link: loads cross it one after another."""

    def __init__(self, tier: HostTier) -> None:
        self.tier = tier
        self.free_at = 0.0
        """When the last load queued on it ends."""

    def load(self, now: float, blocks: int) -> float:
        """A load of `blocks` asked for at `now`: when it ends, once the loads before it have."""
        start = now if now > self.free_at else self.free_at
        self.free_at = start + blocks * self.tier.block_bytes / self.tier.bandwidth
        return self.free_at
