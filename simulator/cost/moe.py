"""Measured fused mixture-of-experts kernels (vLLM's fused_moe: routing, gate/up, SiLU, down) by
tokens in the step, for each measured expert shape; other shapes through interpolated efficiency."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from simulator.cost.curves import Curve
from simulator.cost.operators import experts_touched
from simulator.errors import InputError

MoeShape = tuple[int, int, int, int]
"""(hidden size, each GPU's intermediate size of one expert, experts per token, experts)."""


class MoeTable:
    """Fused-MoE times by tokens for the shapes on the grid. A shape off the grid takes the
    efficiency (roofline time / measured time, at each measured token count) of the measured shapes
    with the same hidden size, top-k and expert count, interpolated in log intermediate size between
    the two either side (the edge's beyond them), and divides its own roofline time by it. With no
    such shapes, the nearest shape's efficiency stands in, and `notes` says so."""

    def __init__(self, frame: pl.DataFrame, dtype_bytes: float, weights: tuple[float, float, float]) -> None:
        """`weights`: (bytes per weight, achieved weight-streaming bandwidth, FLOP/s)."""
        self.dtype_bytes = dtype_bytes
        self.weight_bytes, self.mem_bw, self.flops = weights
        self.series: dict[MoeShape, tuple[np.ndarray, np.ndarray]] = {}
        for key, rows in frame.group_by("hidden_size", "inter_size", "topk", "num_experts"):
            rows = rows.group_by("num_tokens").agg(pl.col("latency").median()).sort("num_tokens")
            shape = tuple(int(v) for v in key)  # type: ignore[union-attr]
            self.series[shape] = (rows["num_tokens"].to_numpy().astype(float), rows["latency"].to_numpy())  # type: ignore[index]
        if not self.series:
            raise InputError("profile has no measured MoE kernels of this dtype")

    def roofline(self, tokens: float | np.ndarray, shape: MoeShape) -> float | np.ndarray:
        hidden, inter, top_k, experts = shape
        weights = experts_touched(tokens, experts, top_k) * 3 * hidden * inter * self.weight_bytes  # type: ignore[arg-type]
        activations = tokens * top_k * (2 * hidden + 3 * inter) * self.dtype_bytes
        flops = 2.0 * tokens * top_k * 3 * hidden * inter
        return np.maximum((weights + activations) / self.mem_bw, flops / self.flops)

    def _efficiency(self, shape: MoeShape, tokens: np.ndarray) -> np.ndarray:
        measured_tokens, times = self.series[shape]
        return np.asarray(self.roofline(tokens, shape)) / np.interp(tokens, measured_tokens, times)

    def curve(self, name: str, shape: MoeShape, notes: list[str]) -> Curve:
        if shape in self.series:
            tokens, times = self.series[shape]
            return Curve(name, tuple(tokens.tolist()), tuple(times.tolist()))
        hidden, inter, top_k, experts = shape
        family = sorted(s for s in self.series if (s[0], s[2], s[3]) == (hidden, top_k, experts))
        if family:
            inters = [s[1] for s in family]
            lo = max((i for i in inters if i <= inter), default=inters[0])
            hi = min((i for i in inters if i >= inter), default=inters[-1])
            weight = 0.0 if lo == hi else math.log(inter / lo) / math.log(hi / lo)
            corners = [((hidden, lo, top_k, experts), 1 - weight), ((hidden, hi, top_k, experts), weight)]
            if not inters[0] <= inter <= inters[-1]:
                notes.append(f"{name} (intermediate {inter}) lies outside the measured {inters[0]}..{inters[-1]}: "
                             "the edge's efficiency, scaled by roofline")
        else:
            nearest = min(self.series, key=lambda s: sum(abs(math.log(a / b)) for a, b in zip(s, shape, strict=True)))
            corners = [(nearest, 1.0)]
            notes.append(f"{name}: no measured MoE kernels with hidden {hidden}, top-{top_k} of {experts} experts; "
                         f"the efficiency of {nearest} (hidden, intermediate, top-k, experts), scaled by roofline")
        tokens = self.series[corners[0][0]][0]
        efficiency = sum(weight * self._efficiency(corner, tokens) for corner, weight in corners)
        times = np.asarray(self.roofline(tokens, shape)) / efficiency
        return Curve(name, tuple(tokens.tolist()), tuple(times.tolist()))
