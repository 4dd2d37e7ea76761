"""The KV-cache transfer from a prefill server to a decode server, over a link held as a SimPy resource.

A prefilled request's KV is its prompt's tokens times the KV bytes per token that one GPU holds;
the ranks of a tensor-parallel pair send their shards side by side, so the transfer takes
`bytes / bandwidth + latency`, bytes being the larger rank's share (the pool with fewer GPUs).
Each prefill server sends over its own link, one transfer at a time in the order they were asked
(`simpy.Resource`): transfers that find the link busy wait, and that wait is theirs to report.
Defaults: the GPU profile's `interconnect_bw` and `interconnect_latency`, which the shipped profiles
take from aiconfigurator's system.yaml (`intra_node_bw` 450 GB/s per GPU one way, NVLink within a
node; `p2p_latency` 10 us).
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simulator.deploy.hardware import GpuSpec
from simulator.errors import InputError

BYTES_PER_GB = 1e9


@dataclass(frozen=True)
class KVLink:
    bandwidth: float
    """Bytes/s, one direction, per GPU."""
    latency: float
    """Seconds per transfer."""
    kv_bytes_per_token: int
    """KV bytes of one token on the rank that sends or receives the most."""

    def transfer_time(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.bandwidth + self.latency


def kv_link(bandwidth_gb_s: float | None, latency: float | None, gpu: GpuSpec, kv_bytes_per_token: int) -> KVLink:
    """The link from the flags (GB/s, s), or the GPU profile's interconnect where not given."""
    if bandwidth_gb_s is None:
        if gpu.interconnect_bw is None:
            raise InputError(f"GPU profile {gpu.name!r} has no interconnect_bw: give --kv-transfer-bandwidth")
        bandwidth = gpu.interconnect_bw
    else:
        bandwidth = bandwidth_gb_s * BYTES_PER_GB
    return KVLink(bandwidth, gpu.interconnect_latency if latency is None else latency, kv_bytes_per_token)


def links(env: simpy.Environment, count: int) -> list[simpy.Resource]:
    """One link per prefill server, one transfer on it at a time."""
    return [simpy.Resource(env, capacity=1) for _ in range(count)]
