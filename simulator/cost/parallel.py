"""Tensor parallelism's communication: the all-reduce of the hidden state, priced from measured
collectives where the profile has them, by the ring all-reduce's roofline where it does not.

The shards themselves (which heads, columns and vocabulary rows a GPU holds) are `ModelSpec.shard`.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from simulator.cost.curves import Curve
from simulator.cost.operators import layer_all_reduces
from simulator.deploy.hardware import GpuSpec, Profile
from simulator.errors import InputError

if TYPE_CHECKING:
    import polars as pl

    from simulator.deploy.spec import ModelSpec


def all_reduce_table(profile: Profile, disable_custom_all_reduce: bool = False) -> pl.DataFrame:
    """The profile's all-reduce measurements as a server runs them: its stack's (custom all-reduce,
    symmetric memory or NCCL as the stack picks by size; calibration/README.md), or, with the custom
    all-reduce off, NCCL's at every size (`collectives_nccl`)."""
    if not disable_custom_all_reduce:
        return profile.tables["collectives"]
    if "collectives_nccl" not in profile.tables:
        raise InputError(f"--disable-custom-all-reduce: profile {profile.meta['name']!r} has no NCCL all-reduce "
                         "measurements (collectives_nccl.parquet)")
    return profile.tables["collectives_nccl"]


class AllReduce:
    """Seconds of one all-reduce of `nbytes` across `num_gpus` GPUs: the measured curve for that GPU
    count, linear in message size between its points, floored below them; beyond them, and for a
    GPU count never measured, a ring all-reduce on the interconnect: latency + 2 (N - 1) / N x bytes
    / bandwidth (NVLink's per-GPU bandwidth from the profile's system data)."""

    def __init__(self, num_gpus: int, gpu: GpuSpec, collectives: pl.DataFrame | None) -> None:
        self.num_gpus = num_gpus
        if gpu.interconnect_bw is None:
            raise InputError(f"GPU profile {gpu.name!r} has no interconnect_bw: cannot price "
                             f"--tensor-parallel-size {num_gpus}")
        self.bandwidth, self.latency = gpu.interconnect_bw, gpu.interconnect_latency
        self.note: str | None = None
        """What stood in for measurements, if anything."""
        rows = None
        if collectives is not None:
            import polars as pl  # the profile's tables are polars frames: it is loaded

            rows = collectives.filter((pl.col("op") == "all_reduce") & (pl.col("num_gpus") == num_gpus))
        if rows is None or rows.height == 0:
            self.note = (f"no all-reduce measured on {num_gpus} GPUs: a ring all-reduce at "
                         f"{self.bandwidth / 1e9:.0f} GB/s and {self.latency * 1e6:.1f} us")
            self.curve: Curve | None = None
        else:
            self.curve = Curve.from_points(f"all_reduce ({num_gpus} GPUs)", rows["message_bytes"].to_list(),
                                           rows["latency"].to_list())

    def roofline(self, nbytes: float) -> float:
        n = self.num_gpus
        return self.latency + 2 * (n - 1) / n * nbytes / self.bandwidth

    def time(self, nbytes: float, record: Counter[str]) -> float:
        if self.curve is None:
            return self.roofline(nbytes)
        return self.curve.at(nbytes, self.roofline, record)

    def layer_time(self, model: ModelSpec, tokens: int, record: Counter[str]) -> float:
        """One layer's all-reduces (`layer_all_reduces`) in a step of `tokens` tokens."""
        return sum(count * self.time(nbytes, record) for count, nbytes in layer_all_reduces(model, tokens))
