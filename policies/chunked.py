"""Chunked prefill (vLLM V1, Sarathi-Serve): one token budget per step shared by decode and prefill.

Running requests go first, in admission order: a decoder takes 1 token, an unfinished prompt its
next chunk (capped by `long_prefill_token_threshold` when set). Waiting requests then fill what is
left first-come first-served, the last one chunked; admission stops at `max_num_seqs` or at the
first request that does not fit in free KV.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.config import RunConfig
from simulator.request import Request
from simulator.step import EngineView, Step


@dataclass(frozen=True)
class ChunkedPrefill:
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0

    def _chunk(self, request: Request, budget: int) -> int:
        n = request.num_pending
        if self.long_prefill_token_threshold:
            n = min(n, self.long_prefill_token_threshold)
        return min(n, budget)

    def __call__(self, view: EngineView) -> Step:
        tokens: dict[Request, int] = {}
        budget = self.max_num_batched_tokens
        free_blocks = view.kv.num_free
        for request in view.running:
            if budget == 0:
                break
            n = self._chunk(request, budget)
            tokens[request] = n
            budget -= n
            free_blocks -= view.kv.extra_blocks(request.id, request.computed + n)
        num_seqs = len(view.running)
        for request in view.waiting:
            if budget == 0 or num_seqs >= self.max_num_seqs:
                break
            n = self._chunk(request, budget)
            blocks = view.kv.extra_blocks(request.id, request.computed + n)
            if blocks > free_blocks:
                break
            tokens[request] = n
            budget -= n
            free_blocks -= blocks
            num_seqs += 1
        return Step(tokens)


def build(config: RunConfig) -> ChunkedPrefill:
    return ChunkedPrefill(config.max_num_seqs, config.max_num_batched_tokens,
                          config.long_prefill_token_threshold)
