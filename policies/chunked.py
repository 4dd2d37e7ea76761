"""Chunked prefill (vLLM V1, Sarathi-Serve): one token budget per step shared by decode and prefill.

Running requests go first, in admission order: a decoder takes 1 token, an unfinished prompt its
next chunk (capped by `long_prefill_token_threshold` when set). Waiting requests then fill what is
left in admission order (`admission_order`: the queue's, unless a subclass says otherwise), the last
one chunked; admission stops at `max_num_seqs` or at the first request that does not fit in free KV.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from policies.settings import RunSettings
from simulator.engine.request import Request
from simulator.engine.step import Scheduling, Step, View

SETTINGS: tuple[str, ...] = ("max_num_batched_tokens", "long_prefill_token_threshold")


@mypyc_attr(allow_interpreted_subclasses=True)  # a policy of your own may extend it (setup.py)
@dataclass(frozen=True)
class ChunkedPrefill:
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0
    scheduling: Scheduling = "fcfs"
    prefix_hits: bool = True
    speculates: bool = True

    def _chunk(self, request: Request, budget: int) -> int:
        n = request.num_pending
        if self.long_prefill_token_threshold:
            n = min(n, self.long_prefill_token_threshold)
        return min(n, budget)

    def __call__(self, view: View) -> Step:
        budget = self.max_num_batched_tokens
        prefilling, num_decoding = view.prefilling, view.num_decoding
        wanted = num_decoding + sum(self._chunk(r, budget) for r in prefilling)
        if wanted > budget and (len(prefilling) > 1 or not view.is_youngest(prefilling[0])):
            # The budget runs out among running requests: who gets it depends on admission order.
            running = view.running()
            return self._fill(view, running, budget, view.kv.num_free, len(running), decode=False)
        # Every decoder fits (the budget covers max_num_seqs); at most the youngest prompt is cut short.
        return self._fill(view, prefilling, budget - num_decoding, view.kv.num_free - view.decode_blocks,
                          view.num_running, decode=num_decoding > 0)

    def _fill(self, view: View, running: Sequence[Request], budget: int, free_blocks: int, num_seqs: int,
              decode: bool) -> Step:
        """Running requests in order take their chunks, then waiting ones what is left."""
        tokens: dict[Request, int] = {}
        for request in running:
            if budget == 0:
                break
            n = self._chunk(request, budget)
            tokens[request] = n
            budget -= n
            free_blocks -= view.kv.extra_blocks(request, request.computed + n)
        self._admit(view, tokens, budget, free_blocks, num_seqs)
        return Step(tokens, decode=decode)

    def max_step_tokens(self, longest_prompt: int) -> int:
        return self.max_num_batched_tokens

    def check_prompts(self, prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> None:
        """Chunks fit any prompt into the budget."""

    def admission_order(self, view: View) -> Iterable[Request]:
        """The waiting requests in the order they are admitted: the waiting queue's (its `scheduling`)."""
        return view.waiting

    def _admit(self, view: View, tokens: dict[Request, int], budget: int, free_blocks: int, num_seqs: int) -> None:
        for request in self.admission_order(view):
            if budget == 0 or num_seqs >= self.max_num_seqs:
                break
            n = self._chunk(request, budget)
            blocks = view.kv.extra_blocks(request, request.computed + n)
            if blocks > free_blocks:
                break
            tokens[request] = n
            budget -= n
            free_blocks -= blocks
            num_seqs += 1


def build(settings: RunSettings) -> ChunkedPrefill:
    return ChunkedPrefill(settings.max_num_seqs, settings.max_num_batched_tokens,
                          settings.long_prefill_token_threshold)
