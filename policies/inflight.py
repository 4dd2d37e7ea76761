"""TensorRT-LLM's in-flight batching without chunked prefill (its default, `enable_chunked_prefill`
False): every step runs one token of each decoder and, beside them, whole prompts of waiting
requests while the step's token budget (`max_num_tokens`, here `max_num_batched_tokens`, decoders
included) holds them (tensorrt_llm/_torch/pyexecutor/scheduler.py, the micro-batch scheduler of
1.x: a context request that does not fit the budget whole waits). Admission in queue order stops at
the first prompt that does not fit whole, at `max_num_seqs` (`max_batch_size`) or where the KV cache
cannot hold the request to its last token beside the running requests' (GUARANTEED_NO_EVICT).
Nothing is ever preempted; a prompt longer than the budget can never run, and is refused as
`policies.continuous` refuses it.
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
        """TensorRT-LLM's default capacity policy, GUARANTEED_NO_EVICT: a request starts only when the
        KV cache can hold it to its last token beside what every running request still needs to reach
        its own, so no request is ever preempted (`CapacitySchedulerPolicy`, tensorrt_llm/llmapi/llm_args.py)."""
        if not len(view.waiting) or num_seqs >= self.max_num_seqs:
            return
        free = view.kv.num_free - view.blocks_to_finish()
        for request in self.admission_order(view):
            n = self._chunk(request, budget)
            blocks = view.kv.extra_blocks(request, full_length(request)) if n else 0
            if n == 0 or num_seqs >= self.max_num_seqs or blocks > free:
                break
            tokens[request] = n
            budget -= n
            free -= blocks
            num_seqs += 1

    def check_prompts(self, prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> None:
        """Nothing is preempted, so nothing is recomputed: the longest prompt must fit the budget whole."""
        ContinuousBatching(self.max_num_seqs, self.max_num_batched_tokens).check_prompts(
            prompt_tokens, [1] * len(prompt_tokens))


def full_length(request: Request) -> int:
    """The tokens a request holds in KV when it finishes, as TensorRT-LLM reserves them: prompt and
    every output token (its max_new_tokens)."""
    return request.prompt_tokens + request.output_tokens


def build(settings: RunSettings) -> InflightBatching:
    return InflightBatching(settings.max_num_seqs, settings.max_num_batched_tokens)
