"""Cost models: how long one forward pass takes, given what the batch computes.

A step is summarised by a `StepShape` (token and context totals, which is all any of the models
needs, so a step's cost never loops over its sequences). A cost model is anything with
`step_time(shape) -> seconds`. `MeasuredCost` (the default) sums measured kernel times from a GPU
profile, interpolated; `RooflineCost` prices each operator by bytes and FLOPs alone, for hardware
that was never measured. `build_cost_model` picks one for a run.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

import numpy as np
import polars as pl

from simulator.errors import InputError
from simulator.hardware import GpuSpec, Profile, load_profile
from simulator.model import ModelSpec

if TYPE_CHECKING:
    from simulator.config import RunConfig

COST_MODELS = ("measured", "roofline")
LOG = logging.getLogger("servesim.cost")

# Elementwise kernels per layer in a vLLM Llama forward: two fused residual-add RMSNorms, rotary
# embedding, SiLU-and-multiply, and the KV-cache write.
ELEMENTWISE_KERNELS_PER_LAYER = 5


@dataclass(frozen=True)
class StepShape:
    """What one forward pass computes. Context counts include the tokens computed this step."""

    num_seqs: int = 0
    decode_seqs: int = 0
    decode_context: int = 0
    """Sum over single-token rows of their context length."""
    prefill_seqs: int = 0
    prefill_tokens: int = 0
    prefill_context: int = 0
    """Sum over multi-token rows of their context length (KV the chunk attends to)."""
    prefill_pairs: float = 0.0
    """Sum over multi-token rows of query-key pairs under the causal mask: n * (c0 + (n + 1) / 2)."""

    @property
    def num_tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, int]], decode_seqs: int = 0, decode_context: int = 0) -> StepShape:
        """Build a shape from (new tokens, context after the step) per row, on top of `decode_seqs`
        single-token rows whose contexts sum to `decode_context`."""
        prefill_seqs = prefill_tokens = prefill_context = 0
        prefill_pairs = 0.0
        for new, context in rows:
            if new == 1:
                decode_seqs += 1
                decode_context += context
            else:
                prefill_seqs += 1
                prefill_tokens += new
                prefill_context += context
                prefill_pairs += new * (context - new + (new + 1) / 2)
        return cls(decode_seqs + prefill_seqs, decode_seqs, decode_context, prefill_seqs, prefill_tokens,
                   prefill_context, prefill_pairs)


class CostModel(Protocol):
    """What the engine needs of a cost model: one step's time, the times of many decode-only steps at
    once (equal, bit for bit, to `step_time` of each), and what it extrapolated or stood in for."""

    def step_time(self, shape: StepShape) -> float: ...

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        """`step_time(StepShape(num_seqs, num_seqs, c))` for each `c` in `contexts`."""

    @property
    def extrapolated(self) -> Mapping[str, int]:
        """Steps priced beyond the measured range, by operator family."""

    @property
    def notes(self) -> tuple[str, ...]:
        """What the model's tables stood in for, noted at load."""


@dataclass(frozen=True)
class RooflineCost:
    """Sum over the model's operators of max(bytes / achieved bandwidth, FLOPs / achieved FLOP/s)
    plus each kernel's fixed latency, plus the profile's per-step overhead."""

    model: ModelSpec
    gpu: GpuSpec

    def gemm_time(self, m: int, n: int, k: int) -> float:
        if m == 0:
            return 0.0
        nbytes = (n * k + m * k + m * n) * self.model.dtype_bytes
        return self.gpu.kernel_latency + max(nbytes / self.gpu.mem_bw, 2.0 * m * n * k / self.gpu.gemm_flops)

    def attention_time(self, kv_tokens: float, pairs: float) -> float:
        """One layer's attention over `kv_tokens` of cached context and `pairs` query-key products."""
        model = self.model
        nbytes = kv_tokens * model.kv_bytes_per_token_per_layer
        flops = 4.0 * model.num_heads * model.head_dim * pairs
        return self.gpu.attn_kernel_latency + max(nbytes / self.gpu.attn_bw, flops / self.gpu.attn_flops)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fixed_cache", {})

    def _fixed(self, tokens: int, num_seqs: int) -> tuple[float, float]:
        """The parts of a step that depend only on its token and sequence counts: per layer (GEMMs and
        elementwise kernels) and per step (LM head, sampling, overhead). Cached: a run repeats them."""
        key = (tokens, num_seqs)
        cache: dict[tuple[int, int], tuple[float, float]] = self._fixed_cache  # type: ignore[attr-defined]
        if key not in cache:
            model, gpu = self.model, self.gpu
            layer = sum(self.gemm_time(tokens, n, k) for _, n, k in model.linear_shapes)
            elementwise_bytes = tokens * model.dtype_bytes * (
                8 * model.hidden_size + 3 * model.intermediate_size
                + 2 * (model.num_heads + model.num_kv_heads) * model.head_dim
                + 2 * model.num_kv_heads * model.head_dim)
            layer += ELEMENTWISE_KERNELS_PER_LAYER * gpu.kernel_latency + elementwise_bytes / gpu.mem_bw
            # The LM head runs on one token per sequence; sampling reads its fp32 logits.
            head = self.gemm_time(num_seqs, model.vocab_size, model.hidden_size)
            sampling = gpu.kernel_latency + num_seqs * model.vocab_size * 4 / gpu.mem_bw
            cache[key] = (layer, head + sampling + gpu.step_overhead)
        return cache[key]

    @property
    def extrapolated(self) -> Mapping[str, int]:
        return {}  # a roofline has no measured range to leave

    @property
    def notes(self) -> tuple[str, ...]:
        return ()

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        """`step_time` of steps that decode `num_seqs` sequences whose contexts sum to each of
        `contexts`, for many steps at once: the same float operations elementwise, so the same bits."""
        model, gpu = self.model, self.gpu
        layer, per_step = self._fixed(num_seqs, num_seqs)
        nbytes = contexts * model.kv_bytes_per_token_per_layer
        flops = 4.0 * model.num_heads * model.head_dim * contexts
        attention = gpu.attn_kernel_latency + np.maximum(nbytes / gpu.attn_bw, flops / gpu.attn_flops)
        return model.num_layers * (layer + attention) + per_step  # type: ignore[no-any-return]

    def step_time(self, shape: StepShape) -> float:
        tokens = shape.num_tokens
        if tokens == 0:
            return 0.0
        layer, per_step = self._fixed(tokens, shape.num_seqs)
        if shape.decode_seqs:
            layer += self.attention_time(shape.decode_context, shape.decode_context)
        if shape.prefill_seqs:
            layer += self.attention_time(shape.prefill_context, shape.prefill_pairs)
        return self.model.num_layers * layer + per_step


def elementwise_ops(model: ModelSpec) -> tuple[tuple[str, bool, int, int], ...]:
    """The step's memory-bound kernels as (op, per sequence?, kernels per step, bytes per token or sequence).

    Per layer: two fused residual-add RMSNorms, rotary embedding, SiLU-and-multiply and the KV-cache
    write; per step: the embedding gather, the final norm, and sampling over fp32 logits."""
    h, dt, layers = model.hidden_size, model.dtype_bytes, model.num_layers
    return (
        ("add_rmsnorm", False, 2 * layers + 1, 4 * h * dt),
        ("rotary", False, layers, 2 * (model.num_heads + model.num_kv_heads) * model.head_dim * dt),
        ("silu_mul", False, layers, 3 * model.intermediate_size * dt),
        ("kv_write", False, layers, 4 * model.num_kv_heads * model.head_dim * dt),
        ("embedding", False, 1, 2 * h * dt),
        ("sampling", True, 1, model.vocab_size * 4),
    )


def causal_pairs(new_tokens: float, context: float) -> float:
    """Query-key pairs of one sequence computing `new_tokens` whose context (after them) is `context`."""
    return new_tokens * (context - new_tokens + (new_tokens + 1) / 2)


def _lookup(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear value at `xs[0] <= x <= xs[-1]`."""
    i = bisect_right(xs, x)
    if i >= len(xs):
        return ys[-1]
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Curve:
    """Measured times at increasing x, linear in between. Beyond the last point the extra work costs
    its roofline time (`time(edge) + roofline(x) - roofline(edge)`, rooflines in seconds); below the
    first point the time stays at the first point's, the kernel's floor."""

    name: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def from_points(cls, name: str, xs: Iterable[float], ys: Iterable[float]) -> Curve:
        frame = pl.DataFrame({"x": list(xs), "y": list(ys)}, schema={"x": pl.Float64, "y": pl.Float64})
        frame = frame.group_by("x").agg(pl.col("y").median()).sort("x")
        if frame.height == 0:
            raise InputError(f"profile has no measured points for {name}")
        return cls(name, tuple(frame["x"].to_list()), tuple(frame["y"].to_list()))

    def at(self, x: float, roofline: Callable[[float], float], record: Counter[str]) -> float:
        xs = self.xs
        if x > xs[-1]:
            record[f"{self.name} above measured {xs[-1]:g}"] += 1
            return self.ys[-1] + roofline(x) - roofline(xs[-1])
        if x < xs[0]:
            record[f"{self.name} below measured {xs[0]:g}"] += 1
            return self.ys[0]
        if len(xs) == 1:
            return self.ys[0]
        return _lookup(x, xs, self.ys)


@dataclass(frozen=True)
class BatchCurves:
    """Attention time by (sequences, x): one `Curve` over x per measured batch size, linear in the
    batch size between them; above the largest batch the extra sequences cost their roofline time."""

    name: str
    batches: tuple[int, ...]
    curves: tuple[Curve, ...]

    @classmethod
    def from_frame(cls, name: str, frame: pl.DataFrame, x: str) -> BatchCurves:
        batches = sorted(frame["batch_size"].unique().to_list())
        if not batches:
            raise InputError(f"profile has no measured points for {name}")
        curves = []
        for b in batches:
            rows = frame.filter(pl.col("batch_size") == b)
            curves.append(Curve.from_points(f"{name} (batch {b})", rows[x].to_list(), rows["latency"].to_list()))
        return cls(name, tuple(batches), tuple(curves))

    def at(self, batch: float, x: float, roofline: Callable[[float, float], float], record: Counter[str]) -> float:
        batches = self.batches
        i = bisect_right(batches, batch)
        if i == 0:
            record[f"{self.name} batch below measured {batches[0]}"] += 1
            return self.curves[0].at(x, lambda v: roofline(batches[0], v), record)
        b0 = batches[i - 1]
        t0 = self.curves[i - 1].at(x, lambda v: roofline(b0, v), record)
        if batch == b0:
            return t0
        if i == len(batches):
            record[f"{self.name} batch above measured {b0}"] += 1
            return t0 + roofline(batch, x) - roofline(b0, x)
        b1 = batches[i]
        t1 = self.curves[i].at(x, lambda v: roofline(b1, v), record)
        return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)


class GemmTable:
    """Measured GEMM times by (m, n, k), for shapes on the grid or between its points.

    A shape on the grid is its own curve over m. Off the grid, each bracketing (n, k) corner's
    efficiency (roofline time / measured time, at each measured m) is interpolated bilinearly in
    (log n, log k) and the shape's own roofline time is divided by it, so a GEMM stays flat in m
    while it streams weights and turns linear once arithmetic takes over. Outside the grid's n or k
    range the edge's efficiency is used (roofline extrapolation), and `notes` says so."""

    def __init__(self, frame: pl.DataFrame, gpu: GpuSpec, dtype_bytes: int) -> None:
        self.gpu, self.dtype_bytes = gpu, dtype_bytes
        self.series: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for (n, k), rows in frame.sort("m").group_by("n", "k"):
            rows = rows.group_by("m").agg(pl.col("latency").median()).sort("m")
            self.series[(int(n), int(k))] = (rows["m"].to_numpy().astype(float), rows["latency"].to_numpy())  # type: ignore[call-overload]
        if not self.series:
            raise InputError("profile has no measured GEMMs")
        self.ns = sorted({n for n, _ in self.series})
        self.ks = sorted({k for _, k in self.series})

    def roofline(self, m: float | np.ndarray, n: int, k: int) -> float | np.ndarray:
        nbytes = (n * k + m * k + m * n) * self.dtype_bytes
        return np.maximum(nbytes / self.gpu.mem_bw, 2.0 * m * n * k / self.gpu.gemm_flops)

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


def attention_rows(frame: pl.DataFrame, model: ModelSpec, family: str, notes: list[str]) -> tuple[pl.DataFrame, float]:
    """The measured rows for the model's head configuration, and the factor to scale their times by.

    Without an exact match, the nearest measured head count with the same head size and query heads
    per KV head stands in, scaled linearly in heads (attention's bytes and FLOPs both are)."""
    heads, kv_heads, head_dim = model.num_heads, model.num_kv_heads, model.head_dim
    exact = frame.filter((pl.col("num_heads") == heads) & (pl.col("num_kv_heads") == kv_heads)
                         & (pl.col("head_dim") == head_dim))
    if exact.height:
        return exact, 1.0
    same_group = frame.filter((pl.col("head_dim") == head_dim)
                              & (pl.col("num_heads") * kv_heads == pl.col("num_kv_heads") * heads))
    if same_group.height == 0:
        raise InputError(f"profile has no {family} measurements with head_dim {head_dim} and "
                         f"{heads // kv_heads} query heads per KV head (model {model.name!r})")
    stand_in = min(same_group["num_heads"].unique().to_list(), key=lambda h: abs(math.log(h / heads)))
    notes.append(f"{family}: no measurements for {heads} heads / {kv_heads} KV heads; "
                 f"{stand_in}-head measurements scaled by {heads / stand_in:g}")
    return same_group.filter(pl.col("num_heads") == stand_in), heads / stand_in


@dataclass(frozen=True)
class MeasuredTables:
    """Everything `MeasuredCost` needs, precomputed once per (model, profile) so a step costs O(1)."""

    model: ModelSpec
    gpu: GpuSpec
    layer_gemms: tuple[tuple[Curve, int, int], ...]
    """Each linear layer's time over tokens, with its (n, k)."""
    lm_head: Curve
    lm_head_nk: tuple[int, int]
    gemm: GemmTable
    decode: BatchCurves
    decode_scale: float
    prefill: BatchCurves
    prefill_scale: float
    elementwise: tuple[tuple[Curve, bool, int, int], ...]
    all_reduce: Curve | None
    tensor_parallel_size: int
    step_overhead: float
    notes: tuple[str, ...]
    """What the tables had to stand in for or extrapolate, once, at load."""


def rank_model(model: ModelSpec, tensor_parallel_size: int) -> ModelSpec:
    """The slice of `model` one GPU computes under Megatron-style tensor parallelism."""
    tp = tensor_parallel_size
    for name in ("num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        if getattr(model, name) % tp:
            raise InputError(f"tensor parallel size {tp} does not divide {model.name}'s {name} "
                             f"{getattr(model, name)}")
    return replace(model, num_heads=model.num_heads // tp, num_kv_heads=model.num_kv_heads // tp,
                   intermediate_size=model.intermediate_size // tp, vocab_size=model.vocab_size // tp)


def build_tables(model: ModelSpec, profile: Profile, tensor_parallel_size: int = 1) -> MeasuredTables:
    if tensor_parallel_size < 1:
        raise InputError(f"tensor parallel size must be >= 1, got {tensor_parallel_size}")
    rank = rank_model(model, tensor_parallel_size)
    notes: list[str] = []
    gemm = GemmTable(profile.tables["gemm"], profile.gpu, model.dtype_bytes)
    layer_gemms = tuple((gemm.curve(f"gemm {name}", n, k, notes), n, k) for name, n, k in rank.linear_shapes)
    lm_head_nk = (rank.vocab_size, rank.hidden_size)
    lm_head = gemm.curve("gemm lm_head", *lm_head_nk, notes)

    decode_rows, decode_scale = attention_rows(profile.tables["decode_attention"], rank, "decode attention", notes)
    decode = BatchCurves.from_frame("decode attention", decode_rows, "context")
    prefill_rows, prefill_scale = attention_rows(profile.tables["prefill_attention"], rank, "prefill attention", notes)
    prefill_rows = prefill_rows.with_columns(
        pairs=pl.col("new_tokens") * (pl.col("context") - pl.col("new_tokens") + (pl.col("new_tokens") + 1) / 2))
    prefill = BatchCurves.from_frame("prefill attention", prefill_rows, "pairs")

    table = profile.tables["elementwise"]
    elementwise = []
    for op, per_seq, count, unit_bytes in elementwise_ops(rank):
        rows = table.filter(pl.col("op") == op)
        if rows.height == 0:
            rows = table.filter(pl.col("op") == "elementwise")
        elementwise.append((Curve.from_points(f"elementwise {op}", rows["bytes"].to_list(), rows["latency"].to_list()),
                            per_seq, count, unit_bytes))

    all_reduce = None
    if tensor_parallel_size > 1:
        rows = profile.tables["collectives"].filter((pl.col("op") == "all_reduce")
                                                    & (pl.col("num_gpus") == tensor_parallel_size))
        if rows.height == 0:
            raise InputError(f"profile {profile.meta['name']!r} has no all-reduce measurements on "
                             f"{tensor_parallel_size} GPUs")
        all_reduce = Curve.from_points("all_reduce", rows["message_bytes"].to_list(), rows["latency"].to_list())
    return MeasuredTables(rank, profile.gpu, layer_gemms, lm_head, lm_head_nk, gemm, decode, decode_scale, prefill,
                          prefill_scale, tuple(elementwise), all_reduce, tensor_parallel_size, profile.step_overhead,
                          tuple(notes))


class MeasuredCost:
    """A step's time as the sum over the model's operators of measured kernel times for the step's
    shapes, interpolated, plus the profile's per-step overhead.

    - GEMMs (QKV, attention output, gate/up, down per layer; the LM head on one token per sequence):
      by tokens in the step, linear between measured m (see `GemmTable`).
    - Decode attention: the step's single-token rows as `decode_seqs` sequences of their mean context,
      linear in context (KV bytes) and in sequences between measured points.
    - Prefill attention: the multi-token rows as `prefill_seqs` sequences each with the mean number of
      causal query-key pairs, placed on the measured (batch, prompt length) grid by their pairs
      (a chunk of n tokens after c0 cached ones does n * (c0 + (n + 1) / 2) pairs, as a prompt of
      equal pairs does), linear in pairs and in sequences.
    - Elementwise kernels: by the bytes each moves (`elementwise_ops`).
    - Tensor parallelism: each GPU's slice of the model plus two all-reduces of the hidden state
      per layer.
    Beyond the measured range every family extrapolates by its roofline; `extrapolated` counts the
    steps that did, and `notes` lists what the tables stood in for at load."""

    def __init__(self, tables: MeasuredTables) -> None:
        self.tables = tables
        self.extrapolated: Counter[str] = Counter()
        model, gpu = tables.model, tables.gpu
        self._decode_seconds = model.kv_bytes_per_token_per_layer / gpu.attn_bw
        self._elementwise_roofline = lambda nbytes: nbytes / gpu.mem_bw
        # Interconnects have no roofline here: beyond the largest message, its measured time per byte.
        self._all_reduce_roofline = (lambda nbytes: 0.0) if tables.all_reduce is None else (
            lambda nbytes, c=tables.all_reduce: nbytes * c.ys[-1] / c.xs[-1])
        self._prefill_flops = 4.0 * model.num_heads * model.head_dim / gpu.attn_flops
        q_kv_o = 2 * model.num_heads + 2 * model.num_kv_heads
        self._prefill_bytes = q_kv_o * model.head_dim * model.dtype_bytes / gpu.attn_bw
        self._allreduce_bytes = model.hidden_size * model.dtype_bytes
        self._gemm_rooflines = [(curve, self._gemm_roofline(n, k)) for curve, n, k in tables.layer_gemms]
        self._lm_head_roofline = self._gemm_roofline(*tables.lm_head_nk)

    def _gemm_roofline(self, n: int, k: int) -> Callable[[float], float]:
        gemm = self.tables.gemm
        return lambda m: float(gemm.roofline(m, n, k))

    @property
    def notes(self) -> tuple[str, ...]:
        return self.tables.notes

    def _gemms(self, tokens: int, num_seqs: int) -> tuple[float, float]:
        t = self.tables
        layer = 0.0
        for curve, roofline in self._gemm_rooflines:
            layer += curve.at(tokens, roofline, self.extrapolated)
        head = t.lm_head.at(num_seqs, self._lm_head_roofline, self.extrapolated)
        return layer, head

    def decode_roofline(self, batch: float, context: float) -> float:
        return batch * context * self._decode_seconds

    def prefill_roofline(self, batch: float, pairs: float) -> float:
        tokens = (math.sqrt(1 + 8 * pairs) - 1) / 2  # the prompt length with these causal pairs
        return batch * max(pairs * self._prefill_flops, tokens * self._prefill_bytes)

    def _elementwise(self, tokens: int, num_seqs: int) -> float:
        total = 0.0
        for curve, per_seq, count, unit_bytes in self.tables.elementwise:
            total += count * curve.at((num_seqs if per_seq else tokens) * unit_bytes, self._elementwise_roofline,
                                      self.extrapolated)
        return total

    def _all_reduce(self, tokens: int) -> float:
        curve = self.tables.all_reduce
        if curve is None:
            return 0.0
        return 2 * self.tables.model.num_layers * curve.at(tokens * self._allreduce_bytes, self._all_reduce_roofline,
                                                           self.extrapolated)

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per operator family for one step (the sum is `step_time`)."""
        t = self.tables
        tokens = shape.num_tokens
        if tokens == 0:
            return {}
        layers = t.model.num_layers
        layer_gemms, head = self._gemms(tokens, shape.num_seqs)
        decode = prefill = 0.0
        if shape.decode_seqs:
            decode = layers * t.decode_scale * t.decode.at(shape.decode_seqs, shape.decode_context / shape.decode_seqs,
                                                           self.decode_roofline, self.extrapolated)
        if shape.prefill_seqs:
            prefill = layers * t.prefill_scale * t.prefill.at(
                shape.prefill_seqs, shape.prefill_pairs / shape.prefill_seqs, self.prefill_roofline, self.extrapolated)
        return {"gemm": layers * layer_gemms + head, "decode_attention": decode, "prefill_attention": prefill,
                "elementwise": self._elementwise(tokens, shape.num_seqs), "collectives": self._all_reduce(tokens),
                "overhead": t.step_overhead}

    def step_time(self, shape: StepShape) -> float:
        if shape.num_tokens == 0:
            return 0.0
        before = len(self.extrapolated)
        total = sum(self.breakdown(shape).values())
        if len(self.extrapolated) > before:
            LOG.warning("measured cost extrapolated by roofline: %s", ", ".join(list(self.extrapolated)[before:]))
        return total

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        return np.array([self.step_time(StepShape(num_seqs, num_seqs, int(c))) for c in contexts], dtype=np.float64)


@lru_cache(maxsize=32)
def _cached_tables(model: ModelSpec, profile: Profile, tensor_parallel_size: int) -> MeasuredTables:
    # Profiles hash by identity, and `load_profile` returns the same object until the files change.
    return build_tables(model, profile, tensor_parallel_size)


def measured_cost(model: ModelSpec, gpu: str, tensor_parallel_size: int = 1) -> MeasuredCost:
    """The measured-kernel cost of `model` on a profile (shipped name or path), with fresh records."""
    return MeasuredCost(_cached_tables(model, load_profile(gpu), tensor_parallel_size))


def build_cost_model(config: RunConfig, model: ModelSpec, gpu: GpuSpec) -> CostModel:
    """The cost model a run asks for: measured kernels from its profile, or the roofline."""
    if config.cost == "roofline":
        return RooflineCost(model, gpu)
    return measured_cost(model, config.gpu)
