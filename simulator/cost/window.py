"""Sliding-window layers' attention from a profile's measured windowed kernels.

gpt-oss's alternate layers attend to the last `sliding_window` tokens. The kernel database measured
each stack's attention with such a window (128 tokens on every stack, and 1,024 and 8,192 on
SGLang's); `calibration/kernel_db.py` writes those rows as `prefill_attention_window` and
`decode_attention_window` tables where the window was applied (not vLLM's H200 decode rows, which
take full attention's time). `sliding_curves` reads them at the model's window and heads per GPU,
and `SlidingCurves.time` prices a step's sliding layers:
- decode: the single-token rows as `decode_seqs` sequences of their mean context, as the full
  layers' table is read (the measured kernel at a context past the window is the window's cost);
- prefill: the multi-token rows by their windowed query-key pairs per sequence, min(pairs, tokens x
  window), on the measured prompts' pairs counted the same way (a query sees at most `window` keys:
  exact once the queries are past the window; over by at most window x (window - 1) / 2 per prompt
  before, a prompt's first `window` queries seeing fewer).
A part the profile has no table for is left to the roofline (`RooflineCost.sliding_attention`),
said in the notes. Attention sinks (one learned logit per head, a key more per query) are priced as
the kernels measured them: TensorRT-LLM's rows at head size 64 carry sinks, vLLM's and SGLang's do
not; a sink is under 1% of a 128-key window's work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from simulator.cost.contract import StepShape
from simulator.cost.curves import BatchCurves
from simulator.cost.gemm import attention_rows
from simulator.cost.roofline import RooflineCost
from simulator.deploy.hardware import Profile
from simulator.deploy.model import ModelSpec
from simulator.errors import InputError


@dataclass(frozen=True)
class SlidingCurves:
    """The measured windowed kernels of one GPU's shard, for its sliding-window layers."""

    layers: int
    window: int
    decode: BatchCurves | None
    """None: the decode rows are left to the roofline. Times in the rank's own heads (`attention_rows`)."""
    prefill: BatchCurves | None

    def time(self, shape: StepShape, fallback: RooflineCost, record: Counter[str],
             decode_roofline: Callable[[float, float], float], pair_seconds: float) -> tuple[float, float]:
        """(decode, prefill) attention of every sliding-window layer of a step. Past the measured
        shapes, `decode_roofline(sequences, context)` (the full layers', at the context capped at
        the window) and `pair_seconds` per windowed query-key pair extrapolate."""
        decode = prefill = 0.0
        window = self.window
        if shape.decode_seqs:
            if self.decode is None:
                decode = fallback.sliding_attention(shape, True, False)
            else:
                decode = self.layers * self.decode.at(
                    shape.decode_seqs, shape.decode_context / shape.decode_seqs,
                    lambda b, context: decode_roofline(b, min(context, window)), record)
        if shape.prefill_seqs:
            if self.prefill is None:
                prefill = fallback.sliding_attention(shape, False, True)
            else:
                pairs = min(shape.prefill_pairs, shape.prefill_tokens * window) / shape.prefill_seqs
                prefill = self.layers * self.prefill.at(
                    shape.prefill_seqs, pairs, lambda b, x: b * x * pair_seconds, record)
        return decode, prefill


def windowed_pairs(window: int) -> pl.Expr:
    """A measured prompt's query-key pairs under a window, as `SlidingCurves.time` counts a step's."""
    causal = pl.col("new_tokens") * (pl.col("context") - pl.col("new_tokens") + (pl.col("new_tokens") + 1) / 2)
    return pl.min_horizontal(causal, pl.col("new_tokens") * window)


def sliding_curves(profile: Profile, rank: ModelSpec, kv_suffix: str, notes: list[str]) -> SlidingCurves | None:
    """The sliding layers' measured curves for `rank` (one GPU's shard) from the profile's windowed
    tables over its KV dtype (`kv_suffix`), or None where neither table holds its window (then the
    roofline prices every attention layer, as the caller says)."""
    if not rank.sliding_layers or rank.is_mla:
        return None
    window = rank.sliding_window
    found: dict[str, pl.DataFrame | None] = {}
    for family in ("decode_attention_window", "prefill_attention_window"):
        table = profile.tables.get(family + kv_suffix)
        rows = None if table is None else table.filter(pl.col("window") == window).drop("window")
        found[family] = None
        if rows is not None and rows.height:
            try:
                found[family] = attention_rows(rows, rank, f"{family} ({window} tokens)", notes)
            except InputError:
                pass
        if found[family] is None:
            missing = (f"the profile has no {family}{kv_suffix} table" if table is None else
                       f"no measured kernel with a {window}-token window for {rank.num_heads} / "
                       f"{rank.num_kv_heads} heads of {rank.head_dim}")
            notes.append(f"{family.replace('_', ' ')}: {missing}: sliding layers by roofline")
    decode, prefill = found["decode_attention_window"], found["prefill_attention_window"]
    if decode is None and prefill is None:
        return None
    return SlidingCurves(
        rank.sliding_layers, window,
        None if decode is None else BatchCurves.from_frame("decode attention (window)", decode, "context"),
        None if prefill is None else BatchCurves.from_frame(
            "prefill attention (window)", prefill.with_columns(pairs=windowed_pairs(window)), "pairs"))
