"""Static (request-level) batching, as FasterTransformer and Triton's dynamic batcher do it.

When idle, form a batch of up to `max_batch_size` waiting requests, waiting at most
`max_queue_delay` seconds after the oldest arrived for the batch to fill. The batch is prefilled
padded to its longest prompt and decodes until its longest output is done: nobody joins or leaves,
finished rows stay as padding, still computed and still holding the KV reserved in full at
admission. Tokens stream as they are produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulator.config import RunConfig
from simulator.request import Request
from simulator.step import EngineView, Step


@dataclass(frozen=True)
class StaticBatching:
    max_batch_size: int
    max_queue_delay: float

    def __call__(self, view: EngineView) -> Step:
        batch = view.running
        if batch:
            return self._continue(batch)
        waiting = view.waiting
        if not waiting:
            return Step()
        deadline = waiting[0].arrival + self.max_queue_delay
        if len(waiting) < self.max_batch_size and view.now < deadline:
            return Step(wake_at=deadline)
        members: list[Request] = []
        longest_prompt = longest_output = 0
        for request in waiting:
            if len(members) == self.max_batch_size:
                break
            prompt = max(longest_prompt, request.prompt_tokens)
            output = max(longest_output, request.output_tokens)
            if (len(members) + 1) * view.kv.blocks_for(prompt + output) > view.kv.num_free:
                break
            members.append(request)
            longest_prompt, longest_output = prompt, output
        padded = longest_prompt + longest_output
        return Step(tokens={r: r.prompt_tokens for r in members},
                    cost_rows=[(longest_prompt, longest_prompt)] * len(members),
                    reserve={r: padded for r in members})

    @staticmethod
    def _continue(batch: Sequence[Request]) -> Step:
        """Decode every live row; finished rows are still computed as padding."""
        live = [r for r in batch if not r.is_finished]
        position = max(r.prompt_tokens for r in batch) + live[0].emitted
        return Step(tokens={r: 1 for r in live}, cost_rows=[(1, position)] * len(batch))


def build(config: RunConfig) -> StaticBatching:
    return StaticBatching(config.max_batch_size, config.max_queue_delay)
