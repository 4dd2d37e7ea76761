"""SGLang's default scheduling: chunked prefill, but a step is a prefill batch or a decode batch,
never both (`enable_mixed_chunk` False), and prefill goes first.

Before each step SGLang's scheduler (python/sglang/srt/managers/scheduler.py, `get_next_batch_to_run`,
0.5.x) forms a prefill batch from the unfinished chunked prompt and the waiting queue, within its
chunk size (`chunked_prefill_size`, here `max_num_batched_tokens`) and free KV; if it forms one it
runs it alone, the decoders waiting; only when no prompt can start does it run one decode step of
every running request. Same admission order and KV check as `policies.chunked`, the last prompt cut
to what is left of the chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.chunked import ChunkedPrefill
from policies.settings import RunSettings
from simulator.engine.step import Step, View

SETTINGS = ("max_num_batched_tokens", "long_prefill_token_threshold")


@dataclass(frozen=True)
class PrefillFirst(ChunkedPrefill):
    def __call__(self, view: View) -> Step:
        prompts = [r for r in view.prefilling if not r.is_decoding]
        step = self._fill(view, prompts, self.max_num_batched_tokens, view.kv.num_free, view.num_running,
                          decode=False)
        return step if step.tokens else Step(decode=True)


def build(settings: RunSettings) -> PrefillFirst:
    return PrefillFirst(settings.max_num_seqs, settings.max_num_batched_tokens, settings.long_prefill_token_threshold)
