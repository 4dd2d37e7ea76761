"""Static (request-level) batching, as FasterTransformer and Triton's dynamic batcher do it.

When idle, form a batch of up to `max_batch_size` waiting requests, waiting at most
`max_queue_delay` seconds after the oldest arrived for the batch to fill. The batch is prefilled
padded to its longest prompt and decodes until its longest output is done: nobody joins or leaves,
finished rows stay as padding, still computed and still holding the KV reserved in full at
admission (the engine's `PaddedBatch`). Tokens stream as they are produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.settings import RunSettings
from simulator.engine.request import Request
from simulator.engine.step import PaddedBatch, Scheduling, Step, View
from simulator.errors import InputError

SETTINGS: tuple[str, ...] = ("max_batch_size", "max_queue_delay")


@dataclass(frozen=True)
class StaticBatching:
    max_batch_size: int
    max_queue_delay: float
    scheduling: Scheduling = "fcfs"
    prefix_hits: bool = False  # every row is computed padded to the longest prompt, whole
    speculates: bool = False  # its rows keep the batch's length, a token a step

    def __call__(self, view: View) -> Step:
        if view.num_running:
            return Step(decode=True)  # the batch decodes every live row, finished rows as padding
        waiting = view.waiting
        if not len(waiting):
            return Step()
        deadline = waiting.first().arrival + self.max_queue_delay
        if len(waiting) < self.max_batch_size and view.now < deadline:
            return Step(wake_at=deadline)
        members: list[Request] = []
        longest_prompt = longest_output = 0
        kv = view.kv
        for request in waiting:
            if len(members) == self.max_batch_size:
                break
            prompt = max(longest_prompt, request.prompt_tokens)
            output = max(longest_output, request.output_tokens)
            if (len(members) + 1) * kv.blocks_for(prompt + output) > kv.num_free:
                break
            members.append(request)
            longest_prompt, longest_output = prompt, output
        return Step(tokens={r: r.prompt_tokens for r in members},
                    batch=PaddedBatch(longest_prompt, longest_prompt + longest_output))

    def max_step_tokens(self, longest_prompt: int) -> int:
        return self.max_batch_size * longest_prompt  # a whole batch padded to the longest prompt

    def check_prompts(self, prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> None:
        """A batch of one fits any prompt the KV cache holds."""


def build(settings: RunSettings) -> StaticBatching:
    if settings.prefill_replicas is not None:
        raise InputError("--prefill-replicas: the static policy's padded batches cannot take requests prefilled "
                         "on another server (use --policy continuous, chunked or priority)")
    return StaticBatching(settings.max_batch_size, settings.max_queue_delay)
