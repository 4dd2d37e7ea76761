"""Priority scheduling (vLLM's `--scheduling-policy priority`): chunked prefill whose waiting queue
is ordered by (priority, arrival), lower first, and whose preemption takes the lowest-priority,
latest-arrived running request (ties by arrival order). Priorities come from a trace's `priority` column or
`--priority-levels N` (uniform over 0..N-1)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.chunked import ChunkedPrefill
from simulator.config import RunConfig
from simulator.engine.step import Scheduling


@dataclass(frozen=True)
class PriorityScheduling(ChunkedPrefill):
    scheduling: Scheduling = "priority"


def build(config: RunConfig) -> PriorityScheduling:
    return PriorityScheduling(config.max_num_seqs, config.max_num_batched_tokens,
                              config.long_prefill_token_threshold)
