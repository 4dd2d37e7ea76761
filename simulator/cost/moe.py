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


def uniform_routing_times(tokens: np.ndarray, times: np.ndarray, top_k: int, experts: int) -> np.ndarray:
    """Fused-MoE times measured under balanced routing, as they are under uniform routing.

    The kernel-db routes balanced: T tokens of top-k send T x k / E to every expert, so the kernel
    reads a share min(1, T k / E) of a GPU's experts, all of them from T = E / k on. A server's
    tokens each pick their experts independently (uniform, servesim's routing everywhere else), and
    only 1 - (1 - k / E)^T of the experts are touched (`experts_touched`). The weights of the
    experts balanced routing touches and uniform does not are taken off at the cost per share of
    experts the curve itself shows between one token and E / k tokens, where balanced routing adds k
    experts per token: (t(E / k) - t(1)) / (1 - k / E)."""
    share = top_k / experts
    full = 1.0 / share
    if full <= tokens[0] or share >= 1.0:
        return times
    rise = float(np.interp(full, tokens, times)) - float(times[0])
    per_share = max(0.0, rise / (1.0 - tokens[0] * share))
    balanced = np.minimum(1.0, tokens * share)
    uniform = experts_touched(tokens, experts, top_k) / experts  # type: ignore[arg-type]
    return np.maximum(times - per_share * (balanced - uniform), times[0])


class MoeTable:
    """Fused-MoE times by tokens for the shapes on the grid, measured under balanced routing and
    priced under uniform routing (`uniform_routing_times`). A shape off the grid takes the
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
            shape: MoeShape = tuple(int(v) for v in key)  # type: ignore[assignment, union-attr]
            tokens = rows["num_tokens"].to_numpy().astype(float)
            self.series[shape] = (tokens, uniform_routing_times(tokens, rows["latency"].to_numpy(), shape[2], shape[3]))
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
