"""The fleet's settings checked together: colocated replicas or prefill/decode pools, not both, and
each pool setting only where it applies."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simulator.errors import InputError
from simulator.routers import ROUTERS

if TYPE_CHECKING:
    from simulator.config import RunConfig

POOL_SETTINGS = ("prefill_tensor_parallel_size", "decode_tensor_parallel_size", "kv_transfer_bandwidth",
                 "kv_transfer_latency")
"""Settings that apply only to prefill/decode pools."""


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def disaggregated(config: RunConfig) -> bool:
    return config.prefill_replicas is not None


def is_fleet(config: RunConfig) -> bool:
    """More than one server: replicas, or prefill/decode pools."""
    return config.num_replicas > 1 or disaggregated(config)


def check_fleet(config: RunConfig) -> None:
    if not _positive_int(config.num_replicas):
        raise InputError(f"--num-replicas must be a positive integer, got {config.num_replicas!r}")
    if config.router not in ROUTERS:
        raise InputError(f"unknown --router {config.router!r} (choose from {', '.join(ROUTERS)})")
    pools = {"prefill_replicas": config.prefill_replicas, "decode_replicas": config.decode_replicas}
    for name, value in pools.items():
        if value is not None and not _positive_int(value):
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if (config.prefill_replicas is None) != (config.decode_replicas is None):
        given = "--prefill-replicas" if config.prefill_replicas is not None else "--decode-replicas"
        raise InputError(f"{given} needs both --prefill-replicas and --decode-replicas (the two pools' sizes)")
    if not disaggregated(config):
        for name in POOL_SETTINGS:
            if getattr(config, name) is not None:
                raise InputError(f"--{name.replace('_', '-')} applies only to prefill/decode pools "
                                 "(--prefill-replicas and --decode-replicas)")
        if config.router != "round-robin" and config.num_replicas == 1:
            raise InputError(f"--router {config.router} needs more than one server (--num-replicas, or "
                             "--prefill-replicas and --decode-replicas)")
        return
    if config.num_replicas != 1:
        raise InputError(f"--num-replicas {config.num_replicas} is for colocated replicas; prefill/decode pools "
                         "are sized by --prefill-replicas and --decode-replicas")
    for name in ("prefill_tensor_parallel_size", "decode_tensor_parallel_size"):
        value = getattr(config, name)
        if value is not None and not _positive_int(value):
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    bandwidth, latency = config.kv_transfer_bandwidth, config.kv_transfer_latency
    if bandwidth is not None and not (0 < bandwidth < math.inf):
        raise InputError(f"--kv-transfer-bandwidth must be a finite number of GB/s > 0, got {bandwidth}")
    if latency is not None and not (0 <= latency < math.inf):
        raise InputError(f"--kv-transfer-latency must be a finite number of seconds >= 0, got {latency}")
