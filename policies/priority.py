"""Priority scheduling (vLLM's `--scheduling-policy priority`): chunked prefill whose waiting queue
is ordered by (priority, arrival), lower first, and whose preemption takes the lowest-priority,
latest-arrived running request (ties by arrival order). Priorities come from a trace's `priority` column or
`--priority-levels N` (uniform over 0..N-1)."""

from __future__ import annotations

from dataclasses import dataclass

from policies import chunked
from policies.settings import RunSettings
from simulator.engine.step import Scheduling

SETTINGS: tuple[str, ...] = (*chunked.SETTINGS, "priority_levels")
"""`priority_levels` too: the workload is drawn with that many priorities, which only this policy orders by."""


@dataclass(frozen=True)
class PriorityScheduling(chunked.ChunkedPrefill):
    scheduling: Scheduling = "priority"


def build(settings: RunSettings) -> PriorityScheduling:
    return PriorityScheduling(settings.max_num_seqs, settings.max_num_batched_tokens,
                              settings.long_prefill_token_threshold)
