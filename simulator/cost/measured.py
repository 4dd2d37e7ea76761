"""The measured-kernel cost model: a step's time as the sum of measured kernel times for its shapes.

`build_tables` turns a profile's tables into interpolators once per (model, profile, GPU count);
`MeasuredCost` prices a step from them in O(1).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from simulator.cost.contract import StepShape
from simulator.cost.curves import BatchCurves, Curve
from simulator.cost.gemm import GemmTable, attention_rows
from simulator.cost.model_tables import AllToAll, mla_curves, moe_curves
from simulator.cost.moe import MoeTable
from simulator.cost.operators import elementwise_ops, gemm_weight_bytes
from simulator.cost.parallel import AllReduce, all_reduce_table
from simulator.cost.roofline import RooflineCost, host_overhead
from simulator.cost.window import SlidingCurves, sliding_curves
from simulator.deploy.hardware import GpuSpec, Profile, load_profile
from simulator.deploy.model import ModelSpec
from simulator.errors import InputError

LOG = logging.getLogger("servesim.cost")
SHAPES_KEPT = 1 << 16
"""Shapes whose token-only parts (and whole steps, `keep_shapes`) a cost model keeps: a run's decode
steps come back to the same few batch sizes; the bound holds its memory to a few MB."""


@dataclass(frozen=True)
class MeasuredTables:
    """Everything `MeasuredCost` needs, precomputed once per (model, profile) so a step costs O(1)."""

    model: ModelSpec
    """One GPU's shard of the model."""
    gpu: GpuSpec
    layer_gemms: tuple[tuple[Curve, int, int], ...]
    """Each linear layer's time over tokens, with its (n, k)."""
    lm_head: Curve
    lm_head_nk: tuple[int, int]
    gemm: GemmTable
    decode: BatchCurves | None
    """None: attention priced by `fallback` (MLA without its tables; sliding windows and sinks where
    the profile has no windowed tables); with `sliding`, the layers that attend to the whole context.
    Its times are in the rank's own heads, a stand-in table's scaled to them (`attention_rows`)."""
    prefill: BatchCurves | None
    elementwise: tuple[tuple[Curve, bool, int, int], ...]
    moe: Curve | None
    """The fused experts' time over tokens (MoE models)."""
    moe_table: MoeTable | None
    all_reduce: AllReduce | None
    tensor_parallel_size: int
    step_overhead: float
    notes: tuple[str, ...]
    """What the tables had to stand in for or extrapolate, once, at load."""
    dense_gemms: tuple[tuple[Curve, int, int], ...] = ()
    """The linear layers of the dense layers before the MoE ones."""
    fallback: RooflineCost | None = None
    """The roofline of the same GPU, for what the tables do not cover (said in `notes`)."""
    data_parallel_size: int = 1
    all_to_all: AllToAll | None = None
    """DeepEP's measured dispatch and combine (data-parallel attention with expert parallelism)."""
    sliding: SlidingCurves | None = None
    """The sliding-window layers' measured kernels; the other layers' are `decode` and `prefill`."""


def _table(profile: Profile, family: str, what: str) -> pl.DataFrame:
    if family not in profile.tables:
        raise InputError(f"profile {profile.meta['name']!r} has no {what} measurements ({family}.parquet): "
                         "use --cost roofline")
    return profile.tables[family]


def _suffix(dtype: str | None, profile: Profile) -> str:
    return "" if dtype is None or dtype == profile.meta["dtype"] else f"_{dtype}"


def build_tables(model: ModelSpec, profile: Profile, tensor_parallel_size: int = 1, expert_parallel_size: int = 1,
                 data_parallel_size: int = 1, disable_custom_all_reduce: bool = False) -> MeasuredTables:
    """Interpolators for one GPU of `model` (in its run's dtypes) split `tensor_parallel_size` ways
    (its experts over `expert_parallel_size` GPUs), its all-reduces NCCL's with the custom one off."""
    if tensor_parallel_size < 1:
        raise InputError(f"tensor parallel size must be >= 1, got {tensor_parallel_size}")
    rank = model.shard(tensor_parallel_size, expert_parallel_size)
    gpu, notes = profile.gpu, list[str]()
    act = rank.dtype_bytes
    base = GemmTable(profile.tables["gemm"], gpu, act)
    weights = base
    weight_suffix = _suffix(rank.weight_dtype, profile)
    rates = (act, gpu.mem_bw, gpu.gemm_flops)
    if weight_suffix:
        if gpu.fp8_mem_bw is None or gpu.fp8_gemm_flops is None:
            raise InputError(f"GPU profile {gpu.name!r} has no fp8_mem_bw or fp8_gemm_flops: cannot price fp8 weights")
        rates = (rank.weight_dtype_bytes, gpu.fp8_mem_bw, gpu.fp8_gemm_flops)
        weights = GemmTable(_table(profile, f"gemm{weight_suffix}", f"{rank.weight_dtype} GEMM"), gpu, act, rates)

    def curves(shapes: tuple[tuple[str, int, int], ...]) -> tuple[tuple[Curve, int, int], ...]:
        return tuple((((weights if gemm_weight_bytes(rank, name) != act else base)
                       .curve(f"gemm {name}", n, k, notes)), n, k) for name, n, k in shapes)

    layer_gemms = curves(rank.linear_shapes)
    dense_gemms = curves(rank.dense_layer_shapes) if rank.first_dense_layers else ()
    lm_head_nk = (rank.vocab_size, rank.hidden_size)
    lm_head = base.curve("gemm lm_head", *lm_head_nk, notes)

    decode = prefill = None
    kv_suffix = _suffix(rank.kv_cache_dtype, profile)
    sliding = sliding_curves(profile, rank, kv_suffix, notes)
    unmeasured = [] if sliding is not None else [what for what, has in (
        ("sliding-window layers", rank.sliding_layers), ("attention sinks", rank.attention_sinks)) if has]
    mla = mla_curves(profile, rank, notes) if rank.is_mla and not unmeasured else None
    if mla is not None:
        decode, prefill = mla.decode, mla.prefill
    elif unmeasured:
        notes.append(f"attention with {', '.join(unmeasured)}: priced by roofline (the profile's attention "
                     "tables are kernels over the whole context)")
    elif not rank.is_mla:  # MLA without its tables: `mla_curves` said so; the roofline prices it
        decode_rows = attention_rows(
            _table(profile, f"decode_attention{kv_suffix}", "decode attention"), rank, "decode attention", notes)
        decode = BatchCurves.from_frame("decode attention", decode_rows, "context")
        prefill_rows = attention_rows(
            _table(profile, f"prefill_attention{kv_suffix}", "prefill attention"), rank, "prefill attention", notes)
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

    moe, moe_table = moe_curves(profile, model, rank, tensor_parallel_size, rates, notes)
    all_to_all = None
    if data_parallel_size > 1 and rank.expert_parallel > 1 and "all_to_all" in profile.tables:
        all_to_all = AllToAll(profile.tables["all_to_all"], rank, notes)

    all_reduce = None
    if tensor_parallel_size > 1:
        all_reduce = AllReduce(tensor_parallel_size, gpu, all_reduce_table(profile, disable_custom_all_reduce))
        if all_reduce.note is not None:
            notes.append(all_reduce.note)
    fallback = None
    if unmeasured or sliding is not None or rank.is_mla or (rank.is_moe and moe is None) or data_parallel_size > 1:
        fallback = RooflineCost(model, gpu, tensor_parallel_size, all_reduce, expert_parallel_size, data_parallel_size)
    return MeasuredTables(rank, gpu, layer_gemms, lm_head, lm_head_nk, base, decode, prefill,
                          tuple(elementwise), moe, moe_table, all_reduce, tensor_parallel_size,
                          profile.step_overhead, tuple(notes), dense_gemms, fallback, data_parallel_size, all_to_all,
                          sliding)


class MeasuredCost:
    pure = False  # `extrapolated` counts every step it prices
    """A step's time as the sum over one GPU's operators (`operators.py`) of measured kernel times
    for the step's shapes, interpolated, plus the profile's host overhead.

    - GEMMs (QKV, attention output, gate/up, down per layer, or the router of a MoE layer; the LM
      head on one token per sequence): by tokens in the step, linear between measured m (see
      `GemmTable`), from the fp8 tables for fp8 weights.
    - Experts of a MoE layer: the fused-MoE kernel by tokens (see `MoeTable`).
    - Decode attention: the step's single-token rows as `decode_seqs` sequences of their mean context,
      linear in context (KV bytes) and in sequences between measured points (fp8 KV from its own rows).
      A row that verifies draft tokens (speculative decoding) is priced as its decode kernel: its
      k + 1 queries read the KV once, and the measured kernel is bound by that read.
    - Prefill attention: the multi-token rows as `prefill_seqs` sequences each with the mean number of
      causal query-key pairs, placed on the measured (batch, prompt length) grid by their pairs
      (a chunk of n tokens after c0 cached ones does n * (c0 + (n + 1) / 2) pairs, as a prompt of
      equal pairs does), linear in pairs and in sequences.
    - Sliding-window layers (gpt-oss's): the profile's windowed kernels (`simulator.cost.window`).
    - Elementwise kernels: by the bytes each moves (`elementwise_ops`).
    - Tensor parallelism: each GPU's shard of the model plus two all-reduces of the hidden state
      per layer (`AllReduce`).
    Beyond the measured range every family extrapolates by its roofline; `extrapolated` counts the
    steps that did, and `notes` lists what the tables stood in for at load."""

    def __init__(self, tables: MeasuredTables) -> None:
        self.tables = tables
        self.extrapolated: Counter[str] = Counter()
        self._by_tokens: dict[tuple[int, int, int, int], tuple[tuple[float, ...], list[str]]] = {}
        self._by_shape: dict[StepShape, tuple[float, list[str]]] = {}
        self.keep_shapes = False
        """Keep step times per shape: set for a pool's servers (`simulator.run.pools`), whose steps
        in step repeat shapes; a lone server's rarely do (its contexts grow)."""
        model, gpu = tables.model, tables.gpu
        self._decode_seconds = model.kv_bytes_per_token_per_layer / gpu.attn_bw
        self._decode_floor_seconds = model.kv_bytes_per_token_per_layer / gpu.datasheet_mem_bw  # none reads faster
        self._elementwise_roofline = lambda nbytes: nbytes / gpu.mem_bw
        self._prefill_flops = 4.0 * model.num_heads * model.head_dim / gpu.attn_flops
        q_kv_o = 2 * model.num_heads + 2 * model.num_kv_heads
        self._prefill_bytes = q_kv_o * model.head_dim * model.dtype_bytes / gpu.attn_bw
        if model.is_mla:  # prefill up-projects the latent: keys of head_dim, values of v_head_dim per head
            per_head = model.head_dim + model.v_head_dim
            self._prefill_flops = 2.0 * model.num_heads * per_head / gpu.attn_flops
            self._prefill_bytes = 2 * model.num_heads * per_head * model.dtype_bytes / gpu.attn_bw
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

    def sliding_attention(self, shape: StepShape) -> tuple[float, float]:
        """(decode, prefill) attention of the sliding-window layers (`simulator.cost.window`)."""
        t = self.tables
        assert t.sliding is not None and t.fallback is not None
        return t.sliding.time(shape, t.fallback, self.extrapolated, self.decode_roofline, self._prefill_flops)

    def _elementwise(self, tokens: int, num_seqs: int) -> float:
        return sum(count * curve.at((num_seqs if per_seq else tokens) * unit_bytes, self._elementwise_roofline,
                                    self.extrapolated) for curve, per_seq, count, unit_bytes in self.tables.elementwise)

    def _moe(self, tokens: int) -> float:
        t = self.tables
        if t.moe is None or t.moe_table is None:
            if t.fallback is not None and t.model.is_moe:
                return t.model.moe_layers * t.fallback.moe_time(tokens * t.data_parallel_size)
            return 0.0
        m = t.model
        shape = (m.hidden_size, m.moe_intermediate_size, m.num_experts_per_tok, m.num_experts)
        table = t.moe_table
        return m.moe_layers * t.moe.at(tokens * t.data_parallel_size, lambda x: float(table.roofline(x, shape)),
                                       self.extrapolated)

    def _dense_layers(self, tokens: int, moe_layer_gemms: float) -> float:
        """The dense layers' GEMMs less the MoE layer's, which `breakdown` counts for every layer."""
        t = self.tables
        if not t.dense_gemms:
            return 0.0
        dense = sum(curve.at(tokens, self._gemm_roofline(n, k), self.extrapolated) for curve, n, k in t.dense_gemms)
        return t.model.first_dense_layers * (dense - moe_layer_gemms)

    def _all_reduce(self, tokens: int) -> float:
        t = self.tables
        if t.all_reduce is None:
            return 0.0
        return t.model.num_layers * t.all_reduce.layer_time(t.model, tokens, self.extrapolated)

    def _kept(self, part: int, tokens: int, num_seqs: int, logit_rows: int,
              compute: Callable[[], tuple[float, ...]]) -> tuple[float, ...]:
        """`compute()`, a part of a step's time that depends only on its tokens, sequences and logit
        rows (sequences plus verified draft tokens), kept per (part, tokens, sequences, logit rows)
        with the extrapolations it recorded, which a step of that shape records again: the same
        numbers, counts and order of records as computing it every step."""
        key = (part, tokens, num_seqs, logit_rows)
        kept = self._by_tokens.get(key)
        if kept is not None:
            values, recorded = kept
            if recorded:
                self.extrapolated.update(recorded)
            return values
        outer = self.extrapolated
        self.extrapolated = Counter()
        try:
            values = compute()
            recorded = list(self.extrapolated.elements())
        finally:
            outer.update(self.extrapolated)
            self.extrapolated = outer
        if len(self._by_tokens) < SHAPES_KEPT:
            self._by_tokens[key] = (values, recorded)
        return values

    def _gemms_and_dispatch(self, tokens: int, logit_rows: int) -> tuple[float, ...]:
        """(a layer's GEMMs, the LM head, the MoE layers' all-to-all)."""
        t = self.tables
        layer_gemms, head = self._gemms(tokens, logit_rows)
        collectives = 0.0
        if t.all_to_all is not None and t.fallback is not None:
            collectives = t.model.moe_layers * t.all_to_all.time(tokens, t.fallback.all_to_all_time, self.extrapolated)
        elif t.fallback is not None:
            collectives = t.model.moe_layers * t.fallback.all_to_all_time(tokens)
        return layer_gemms, head, collectives

    def _other_families(self, tokens: int, num_seqs: int, logit_rows: int, layer_gemms: float) -> tuple[float, ...]:
        """(the dense layers' GEMMs, MoE, elementwise, all-reduces, host overhead)."""
        t = self.tables
        return (self._dense_layers(tokens, layer_gemms), self._moe(tokens), self._elementwise(tokens, logit_rows),
                self._all_reduce(tokens), host_overhead(t.gpu, t.step_overhead, num_seqs, tokens))

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per operator family for one step (the sum is `step_time`)."""
        t = self.tables
        tokens = shape.num_tokens
        if tokens == 0:
            return {}
        layers, num_seqs = t.model.num_layers, shape.num_seqs
        logit_rows = num_seqs + shape.spec_tokens  # the LM head and sampling see every verified draft token
        layer_gemms, head, collectives = self._kept(0, tokens, num_seqs, logit_rows,
                                                    lambda: self._gemms_and_dispatch(tokens, logit_rows))
        decode = prefill = 0.0
        full = layers - t.sliding.layers if t.sliding is not None else layers
        if t.decode is None or t.prefill is None:
            assert t.fallback is not None
            if shape.decode_seqs:
                decode = t.fallback.attention_all_layers(StepShape(shape.decode_seqs, shape.decode_seqs,
                                                                   shape.decode_context, spec_tokens=shape.spec_tokens))
            if shape.prefill_seqs:
                prefill = t.fallback.attention_all_layers(StepShape(shape.prefill_seqs, 0, 0, *shape[3:7]))
        elif shape.decode_seqs:
            least = self._decode_floor_seconds  # `Curve.at`'s floor
            decode = full * t.decode.at(shape.decode_seqs, shape.decode_context / shape.decode_seqs,
                                        self.decode_roofline, self.extrapolated, lambda b, c: b * c * least)
        if shape.prefill_seqs and t.prefill is not None:
            prefill = full * t.prefill.at(shape.prefill_seqs, shape.prefill_pairs / shape.prefill_seqs,
                                          self.prefill_roofline, self.extrapolated)
            if t.model.is_mla and t.fallback is not None:  # the cached context's up projection (kv_b)
                prefill += layers * t.fallback.mla_context_up_projection(shape)
        if t.sliding is not None:
            sliding_decode, sliding_prefill = self.sliding_attention(shape)
            decode, prefill = decode + sliding_decode, prefill + sliding_prefill
        dense, moe, elementwise, all_reduce, overhead = self._kept(
            1, tokens, num_seqs, logit_rows, lambda: self._other_families(tokens, num_seqs, logit_rows, layer_gemms))
        return {"gemm": layers * layer_gemms + head + dense, "moe": moe, "decode_attention": decode,
                "prefill_attention": prefill, "elementwise": elementwise, "collectives": all_reduce + collectives,
                "overhead": overhead}

    def step_time(self, shape: StepShape) -> float:
        """The sum of `breakdown`; with `keep_shapes`, kept per shape with the extrapolations it
        recorded, which a step of that shape records again."""
        if shape.num_tokens == 0:
            return 0.0
        if not self.keep_shapes:
            before = len(self.extrapolated)
            total = sum(self.breakdown(shape).values())
            if len(self.extrapolated) > before:
                LOG.warning("measured cost extrapolated: %s", ", ".join(list(self.extrapolated)[before:]))
            return total
        kept = self._by_shape.get(shape)
        if kept is not None:
            self.extrapolated.update(kept[1])
            return kept[0]
        outer = self.extrapolated
        before = len(outer)
        inner: Counter[str] = Counter()
        self.extrapolated = inner  # what this shape records, added to the run's below
        try:
            total = sum(self.breakdown(shape).values())
        finally:
            self.extrapolated = outer
            if inner:
                outer.update(inner)
        if len(outer) > before:
            LOG.warning("measured cost extrapolated: %s", ", ".join(list(outer)[before:]))
        if len(self._by_shape) < SHAPES_KEPT:
            self._by_shape[shape] = (total, list(inner.elements()) if inner else [])
        return total

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        """`step_time` of decode-only steps, one call each: the same numbers by construction."""
        return np.array([self.step_time(StepShape(num_seqs, num_seqs, int(c))) for c in contexts], dtype=np.float64)


@lru_cache(maxsize=128)
def _cached_tables(model: ModelSpec, profile: Profile, tensor_parallel_size: int, expert_parallel_size: int,
                   data_parallel_size: int, disable_custom_all_reduce: bool) -> MeasuredTables:
    # Profiles hash by identity (`load_profile` returns the same object until the files change); 128
    # deployments of ~0.5 MB: `simulate compare`'s worker meets the table's 61, each built in 0.4-0.9 s.
    return build_tables(model, profile, tensor_parallel_size, expert_parallel_size, data_parallel_size,
                        disable_custom_all_reduce)


def measured_cost(model: ModelSpec, gpu: str, tensor_parallel_size: int = 1, expert_parallel_size: int = 1,
                  data_parallel_size: int = 1, disable_custom_all_reduce: bool = False) -> MeasuredCost:
    """The measured-kernel cost of `model` on a profile (shipped name or path), with fresh records."""
    return MeasuredCost(_cached_tables(model, load_profile(gpu), tensor_parallel_size, expert_parallel_size,
                                       data_parallel_size, disable_custom_all_reduce))
