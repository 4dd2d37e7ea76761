"""Measured kernel times as interpolating curves: over one variable, and over batch size too.

Beyond the measured range a curve extrapolates and records that it did: by the kernel's roofline,
or, where the caller gives the least time the extra work can take (`floor`), at the kernel's own
last measured rate where that is faster than the roofline's (`Curve`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.errors import InputError

if TYPE_CHECKING:
    import polars as pl


def _lookup(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear value at `xs[0] <= x <= xs[-1]`."""
    i = bisect_right(xs, x)
    if i >= len(xs):
        return ys[-1]
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Curve:
    """Measured times at increasing x, linear in between. Below the first point the time stays at
    the first point's, the kernel's floor. Beyond the last point the extra work costs its roofline
    time (`time(edge) + roofline(x) - roofline(edge)`, rooflines in seconds); given `floor` (the
    least time the work up to x can take: its bytes at the GPU's datasheet bandwidth), it costs
    the last measured segment's time per unit of x where that is less, and never less than
    `floor(x) - floor(edge)`. The roofline's rates are medians over every kernel of a profile; a
    kernel that already runs faster at its largest measured sizes keeps its own rate (decode
    attention past its tables' contexts: `tests/test_cost_measured.py` holds it to the measured
    kernels it was not given)."""

    name: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def from_points(cls, name: str, xs: Iterable[float], ys: Iterable[float]) -> Curve:
        import polars as pl  # here: a roofline run never loads it

        frame = pl.DataFrame({"x": list(xs), "y": list(ys)}, schema={"x": pl.Float64, "y": pl.Float64})
        frame = frame.group_by("x").agg(pl.col("y").median()).sort("x")
        if frame.height == 0:
            raise InputError(f"profile has no measured points for {name}")
        return cls(name, tuple(frame["x"].to_list()), tuple(frame["y"].to_list()))

    def at(self, x: float, roofline: Callable[[float], float], record: Counter[str],
           floor: Callable[[float], float] | None = None) -> float:
        xs = self.xs
        if x > xs[-1]:
            record[f"{self.name} above measured {xs[-1]:g}"] += 1
            if floor is None or len(xs) < 2:
                return self.ys[-1] + roofline(x) - roofline(xs[-1])
            last = (self.ys[-1] - self.ys[-2]) / (xs[-1] - xs[-2]) * (x - xs[-1])
            return self.ys[-1] + max(min(last, roofline(x) - roofline(xs[-1])), floor(x) - floor(xs[-1]))
        if x < xs[0]:
            record[f"{self.name} below measured {xs[0]:g}"] += 1
            return self.ys[0]
        if len(xs) == 1:
            return self.ys[0]
        return _lookup(x, xs, self.ys)


@dataclass(frozen=True)
class BatchCurves:
    """Attention time by (sequences, x): one `Curve` over x per measured batch size, linear in the
    batch size between them; above the largest batch the extra sequences cost their roofline time.
    `floor(sequences, x)`, where given, is each curve's `floor` beyond its largest measured x."""

    name: str
    batches: tuple[int, ...]
    curves: tuple[Curve, ...]

    @classmethod
    def from_frame(cls, name: str, frame: pl.DataFrame, x: str) -> BatchCurves:
        import polars as pl

        batches = sorted(frame["batch_size"].unique().to_list())
        if not batches:
            raise InputError(f"profile has no measured points for {name}")
        curves = []
        for b in batches:
            rows = frame.filter(pl.col("batch_size") == b)
            curves.append(Curve.from_points(f"{name} (batch {b})", rows[x].to_list(), rows["latency"].to_list()))
        return cls(name, tuple(batches), tuple(curves))

    def at(self, batch: float, x: float, roofline: Callable[[float, float], float], record: Counter[str],
           floor: Callable[[float, float], float] | None = None) -> float:
        batches = self.batches
        i = bisect_right(batches, batch)

        def curve_at(j: int) -> float:
            b = batches[j]
            edge = None if floor is None else (lambda v: floor(b, v))
            return self.curves[j].at(x, lambda v: roofline(b, v), record, edge)

        if i == 0:
            record[f"{self.name} batch below measured {batches[0]}"] += 1
            return curve_at(0)
        b0 = batches[i - 1]
        t0 = curve_at(i - 1)
        if batch == b0:
            return t0
        if i == len(batches):
            record[f"{self.name} batch above measured {b0}"] += 1
            return t0 + roofline(batch, x) - roofline(b0, x)
        t1 = curve_at(i)
        return t0 + (t1 - t0) * (batch - b0) / (batches[i] - b0)
