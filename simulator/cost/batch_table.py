"""The chapter's batch-size sweep: decode step time against batch at a fixed context length.

Each row is one decode step of `batch` sequences that each attend to `context` tokens: bytes moved
on one GPU (weights once, a mixture of experts' only for the experts the batch is routed to; KV per
sequence), step time from the cost model and the part of it spent in all-reduces, and the two
"tokens per second"
(each request's rate, and the aggregate). The knee is the batch whose KV reads equal the weight
reads (all of them, every expert included); the ceiling is the batch whose KV fills the card.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from simulator.cost import CostModel, StepShape
from simulator.cost.operators import weight_bytes_read
from simulator.deploy.model import ModelSpec


@dataclass(frozen=True)
class BatchTable:
    rows: pl.DataFrame
    context: int
    knee_batch: float
    """Batch at which KV bytes read per step equal the weight bytes read."""
    max_batch: int
    """Sequences of `context` tokens the KV cache holds."""


def batch_table(model: ModelSpec, cost: CostModel, context: int, batches: list[int],
                kv_capacity_tokens: int, data_parallel_size: int = 1) -> BatchTable:
    """The table for one GPU: `model` is what that GPU holds (`ModelSpec.shard`), `cost` its cost
    model, `kv_capacity_tokens` the tokens its KV cache holds. Under data-parallel attention a row's
    batch is each rank's, every rank decoding as many (its experts see all ranks' tokens)."""
    weight_bytes = model.weight_bytes_per_step
    kv_per_seq = model.kv_bytes_for_context(context)
    records = []
    for batch in batches:
        shape = StepShape.from_rows([(1, context)] * batch)
        step = cost.step_time(shape)
        kv_bytes = batch * kv_per_seq
        weights_read = weight_bytes_read(model, batch * data_parallel_size)
        records.append({
            "batch": batch,
            "context": context,
            "step_time": step,
            "all_reduce_time": cost.breakdown(shape)["collectives"],
            "weight_bytes": weights_read,
            "kv_bytes": kv_bytes,
            "total_bytes": weights_read + kv_bytes,
            "achieved_bandwidth": (weights_read + kv_bytes) / step,
            "per_request_tokens_per_s": 1.0 / step,
            "aggregate_tokens_per_s": batch / step,
        })
    return BatchTable(pl.DataFrame(records), context, weight_bytes / kv_per_seq, kv_capacity_tokens // context)
