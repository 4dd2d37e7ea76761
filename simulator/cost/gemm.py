"""Measured kernel tables made into interpolators: GEMMs by shape, attention by head layout.

A GEMM off the measured grid is priced through interpolated efficiency (roofline time over measured
time); attention for an unmeasured head count through the nearest measured one, scaled.
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np
import polars as pl

from simulator.cost.curves import Curve
from simulator.deploy.hardware import GpuSpec
from simulator.deploy.model import ModelSpec
from simulator.errors import InputError


class GemmTable:
    """Measured GEMM times by (m, n, k), for shapes on the grid or between its points.

    A shape on the grid is its own curve over m. Off the grid, each bracketing (n, k) corner's
    efficiency (roofline time / measured time, at each measured m) is interpolated bilinearly in
    (log n, log k) and the shape's own roofline time is divided by it, so a GEMM stays flat in m
    while it streams weights and turns linear once arithmetic takes over. Outside the grid's n or k
    range the edge's efficiency is used (roofline extrapolation), and `notes` says so."""

    def __init__(self, frame: pl.DataFrame, gpu: GpuSpec, dtype_bytes: int,
                 weights: tuple[int, float, float] | None = None) -> None:
        """`weights`: (bytes per weight, achieved bandwidth, FLOP/s) when the weights are not in the
        activations' dtype (fp8)."""
        self.gpu, self.dtype_bytes = gpu, dtype_bytes
        self.weight_bytes, self.mem_bw, self.flops = weights or (dtype_bytes, gpu.mem_bw, gpu.gemm_flops)
        self.series: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for (n, k), rows in frame.sort("m").group_by("n", "k"):
            rows = rows.group_by("m").agg(pl.col("latency").median()).sort("m")
            self.series[(int(n), int(k))] = (rows["m"].to_numpy().astype(float), rows["latency"].to_numpy())  # type: ignore[call-overload]
        if not self.series:
            raise InputError("profile has no measured GEMMs")
        self.ns = sorted({n for n, _ in self.series})
        self.ks = sorted({k for _, k in self.series})

    def roofline(self, m: float | np.ndarray, n: int, k: int) -> float | np.ndarray:
        nbytes = n * k * self.weight_bytes + m * k * self.dtype_bytes + m * n * self.dtype_bytes
        return np.maximum(nbytes / self.mem_bw, 2.0 * m * n * k / self.flops)

    def curve(self, name: str, n: int, k: int, notes: list[str]) -> Curve:
        if (n, k) in self.series:
            ms, ts = self.series[(n, k)]
            return Curve(name, tuple(ms.tolist()), tuple(ts.tolist()))
        (n0, n1, wn), (k0, k1, wk) = self._bracket(self.ns, n), self._bracket(self.ks, k)
        corners = [((n0, k0), (1 - wn) * (1 - wk)), ((n0, k1), (1 - wn) * wk),
                   ((n1, k0), wn * (1 - wk)), ((n1, k1), wn * wk)]
        if any(c not in self.series for c, _ in corners):
            nearest = min(self.series, key=lambda c: abs(math.log(c[0] / n)) + abs(math.log(c[1] / k)))
            corners = [(nearest, 1.0)]
        if not (self.ns[0] <= n <= self.ns[-1] and self.ks[0] <= k <= self.ks[-1]):
            notes.append(f"{name} GEMM (n={n}, k={k}) lies outside the measured n {self.ns[0]}..{self.ns[-1]}, "
                         f"k {self.ks[0]}..{self.ks[-1]}: the edge's efficiency, scaled by roofline")
        ms = self.series[corners[0][0]][0]
        efficiency = np.zeros_like(ms)
        for (cn, ck), weight in corners:
            cms, cts = self.series[(cn, ck)]
            efficiency += weight * self.roofline(ms, cn, ck) / np.interp(ms, cms, cts)
        times = self.roofline(ms, n, k) / efficiency
        return Curve(name, tuple(ms.tolist()), tuple(np.asarray(times).tolist()))

    @staticmethod
    def _bracket(grid: list[int], value: int) -> tuple[int, int, float]:
        """Grid points either side of `value` and its fraction of the way between them in log space."""
        if value <= grid[0]:
            return grid[0], grid[0], 0.0
        if value >= grid[-1]:
            return grid[-1], grid[-1], 0.0
        i = bisect_right(grid, value)
        lo, hi = grid[i - 1], grid[i]
        return lo, hi, math.log(value / lo) / math.log(hi / lo)


def attention_rows(frame: pl.DataFrame, model: ModelSpec, family: str, notes: list[str]) -> pl.DataFrame:
    """The measured rows for the model's head configuration, times in its own heads.

    Without an exact match, the nearest measured head count with the same head size and query heads
    per KV head stands in, its times scaled linearly in heads (attention's bytes and FLOPs both
    are), so that curves built on them extrapolate by the model's own rooflines."""
    heads, kv_heads, head_dim = model.num_heads, model.num_kv_heads, model.head_dim
    exact = frame.filter((pl.col("num_heads") == heads) & (pl.col("num_kv_heads") == kv_heads)
                         & (pl.col("head_dim") == head_dim))
    if exact.height:
        return exact
    same_group = frame.filter((pl.col("head_dim") == head_dim)
                              & (pl.col("num_heads") * kv_heads == pl.col("num_kv_heads") * heads))
    if same_group.height == 0:
        raise InputError(f"profile has no {family} measurements with head_dim {head_dim} and "
                         f"{heads // kv_heads} query heads per KV head (model {model.name!r})")
    stand_in = min(same_group["num_heads"].unique().to_list(), key=lambda h: abs(math.log(h / heads)))
    notes.append(f"{family}: no measurements for {heads} heads / {kv_heads} KV heads; "
                 f"{stand_in}-head measurements scaled by {heads / stand_in:g}")
    return same_group.filter(pl.col("num_heads") == stand_in).with_columns(pl.col("latency") * (heads / stand_in))
