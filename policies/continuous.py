"""Continuous batching without chunking (vLLM V0's default, Orca without mixing).

Every step is either a prefill step that admits waiting requests first-come first-served while
they fit the token budget, the sequence limit and free KV, or, when none can be admitted, a decode
step for every running request. Prefill comes first, so decoders stall while a prompt runs.
A waiting request that is already decoding (its prompt's KV computed on a prefill server, its first
token emitted there) is no prefill: it joins a decode step, FCFS, while it fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.settings import RunSettings
from simulator.engine.request import Request
from simulator.engine.step import Scheduling, Step, View
from simulator.errors import InputError

SETTINGS: tuple[str, ...] = ("max_num_batched_tokens",)


@dataclass(frozen=True)
class ContinuousBatching:
    max_num_seqs: int
    max_num_batched_tokens: int
    scheduling: Scheduling = "fcfs"
    prefix_hits: bool = True
    speculates: bool = True

    def __call__(self, view: View) -> Step:
        prefill: dict[Request, int] = {}
        budget = self.max_num_batched_tokens
        for request in view.prefilling:
            # A prompt admitted whole can be left unfinished only by prefix caching: part of the cached
            # prefix it was admitted with was evicted by the blocks the same step took first. Its rest
            # runs before anything else.
            if not request.is_decoding and request.num_pending <= budget:
                prefill[request] = request.num_pending
                budget -= request.num_pending
        if prefill:
            return Step(prefill)
        free_blocks = view.kv.num_free
        num_seqs = view.num_running
        joins = False
        for request in view.waiting:
            n = request.num_pending
            blocks = view.kv.extra_blocks(request, request.computed + n)
            if n > budget or num_seqs >= self.max_num_seqs or blocks > free_blocks:
                break
            if request.is_decoding:
                joins = not prefill
                break
            prefill[request] = n
            budget -= n
            free_blocks -= blocks
            num_seqs += 1
        if prefill:
            return Step(prefill)
        # Without chunking every running prompt was computed whole when it was admitted.
        return Step(self._joining(view) if joins else {}, decode=True)

    def _joining(self, view: View) -> dict[Request, int]:
        """Waiting decoders (prefilled elsewhere) that fit beside the running ones' decode step."""
        joining: dict[Request, int] = {}
        budget = self.max_num_batched_tokens - view.num_decoding
        free_blocks = view.kv.num_free - view.decode_blocks
        num_seqs = view.num_running
        for request in view.waiting:
            blocks = view.kv.extra_blocks(request, request.computed + 1)
            if not request.is_decoding or budget < 1 or num_seqs >= self.max_num_seqs or blocks > free_blocks:
                break
            joining[request] = 1
            budget -= 1
            free_blocks -= blocks
            num_seqs += 1
        return joining

    def max_step_tokens(self, longest_prompt: int) -> int:
        return self.max_num_batched_tokens

    def check_prompts(self, prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> None:
        """A prompt is computed whole, and so is a preempted request's recomputation: its prompt and
        every token it emitted, up to all but its last. vLLM refuses such a budget below
        --max-model-len when chunking is off; here, below the longest request of the workload."""
        recomputed = [prompt + max(output - 1, 0) for prompt, output in zip(prompt_tokens, output_tokens, strict=True)]
        longest = max(range(len(recomputed)), key=recomputed.__getitem__)
        if recomputed[longest] <= self.max_num_batched_tokens:
            return
        prompt, output = prompt_tokens[longest], output_tokens[longest]
        if prompt > self.max_num_batched_tokens:
            raise InputError(f"request {longest} has a {prompt}-token prompt, larger than "
                             f"--max-num-batched-tokens {self.max_num_batched_tokens}: without chunking it can "
                             "never be scheduled (use --policy chunked, or raise --max-num-batched-tokens)")
        raise InputError(f"request {longest} may have to recompute {recomputed[longest]} tokens after a preemption "
                         f"({prompt} prompt + {output - 1} emitted), more than --max-num-batched-tokens "
                         f"{self.max_num_batched_tokens}: without chunking it could never be rescheduled (use "
                         f"--policy chunked, or raise --max-num-batched-tokens to {recomputed[longest]})")

def build(settings: RunSettings) -> ContinuousBatching:
    return ContinuousBatching(settings.max_num_seqs, settings.max_num_batched_tokens)
