"""SGLang's default scheduling: chunked prefill, but a step is a prefill batch or a decode batch,
never both (`enable_mixed_chunk` False), and prefill goes first.

Before each step SGLang's scheduler (python/sglang/srt/managers/scheduler.py, `get_next_batch_to_run`,
0.5.x) forms a prefill batch from the unfinished chunked prompt and the waiting queue, within its
chunk size (`chunked_prefill_size`, here `max_num_batched_tokens`) and free KV; if it forms one it
runs it alone, the decoders waiting; only when no prompt can start does it run one decode step of
every running request. Admission in queue order, as `policies.chunked`'s, the last prompt cut to
what is left of the chunk; but a prompt starts only when the whole of it fits in free KV.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.chunked import ChunkedPrefill
from policies.continuous import ContinuousBatching
from policies.settings import RunSettings
from simulator.engine.request import Request
from simulator.engine.step import Step, View

SETTINGS = ("max_num_batched_tokens", "long_prefill_token_threshold")


@dataclass(frozen=True)
class PrefillFirst(ChunkedPrefill):
    def __call__(self, view: View) -> Step:
        budget, free, tokens = self.max_num_batched_tokens, view.kv.num_free, dict[Request, int]()
        for request in view.prefilling:
            if budget == 0:
                break
            if not request.is_decoding:
                tokens[request] = n = self._chunk(request, budget)
                budget -= n
                free -= view.kv.extra_blocks(request, request.computed + request.num_pending)
        num_seqs = view.num_running
        for request in self.admission_order(view):
            # A prompt starts only when all of it fits in free KV (SGLang's PrefillAdder checks the
            # whole input against the free tokens), so a started prompt is never cut short.
            whole = view.kv.extra_blocks(request, request.computed + request.num_pending)
            if request.is_decoding or budget == 0 or num_seqs >= self.max_num_seqs or whole > free:
                break
            tokens[request] = n = self._chunk(request, budget)
            budget -= n
            free -= whole
            num_seqs += 1
        if tokens:
            return Step(tokens)
        # Requests prefilled elsewhere join the decode step, as continuous batching's.
        return Step(ContinuousBatching(self.max_num_seqs, self.max_num_batched_tokens)._joining(view), decode=True)


def build(settings: RunSettings) -> PrefillFirst:
    return PrefillFirst(settings.max_num_seqs, settings.max_num_batched_tokens, settings.long_prefill_token_threshold)
