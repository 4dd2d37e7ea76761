"""TensorRT-LLM's in-flight batching without chunked prefill (its default, `enable_chunked_prefill`
False): every step runs one token of each decoder and, beside them, whole prompts of waiting
requests while the step's token budget (`max_num_tokens`, here `max_num_batched_tokens`, decoders
included) holds them (tensorrt_llm/_torch/pyexecutor/scheduler.py, the micro-batch scheduler of
1.x: a context request that does not fit the budget whole waits). Admission in queue order stops at
the first prompt that does not fit whole, at `max_num_seqs` (`max_batch_size`) or at free KV.
A prompt (or a preempted request's recomputation) longer than the budget can never run, and is refused
as `policies.continuous` refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.chunked import ChunkedPrefill
from policies.continuous import ContinuousBatching
from policies.settings import RunSettings
from simulator.engine.request import Request
from simulator.engine.step import View

SETTINGS = ("max_num_batched_tokens",)


@dataclass(frozen=True)
class InflightBatching(ChunkedPrefill):
    def _chunk(self, request: Request, budget: int) -> int:
        return request.num_pending if request.num_pending <= budget else 0

    def _admit(self, view: View, tokens: dict[Request, int], budget: int, free_blocks: int, num_seqs: int) -> None:
        for request in self.admission_order(view):
            n = self._chunk(request, budget)
            blocks = view.kv.extra_blocks(request, request.computed + n) if n else 0
            if n == 0 or num_seqs >= self.max_num_seqs or blocks > free_blocks:
                break
            tokens[request] = n
            budget -= n
            free_blocks -= blocks
            num_seqs += 1

    def check_prompts(self, prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> None:
        """A preempted request's recomputation runs whole too, so the longest one must fit the budget."""
        ContinuousBatching(self.max_num_seqs, self.max_num_batched_tokens).check_prompts(prompt_tokens, output_tokens)


def build(settings: RunSettings) -> InflightBatching:
    return InflightBatching(settings.max_num_seqs, settings.max_num_batched_tokens)
