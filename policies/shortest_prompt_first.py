"""Shortest prompt first: chunked prefill (`policies.chunked`) whose waiting requests are admitted
shortest prompt first, ties in queue order.

Short prompts get their first token sooner; a long one waits while shorter ones keep arriving.
Each step sorts the whole waiting queue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from policies import chunked
from policies.settings import RunSettings
from simulator.engine.request import Request
from simulator.engine.step import View

SETTINGS: tuple[str, ...] = chunked.SETTINGS


@dataclass(frozen=True)
class ShortestPromptFirst(chunked.ChunkedPrefill):
    def admission_order(self, view: View) -> Iterable[Request]:
        return sorted(view.waiting, key=lambda request: request.prompt_tokens)


def build(settings: RunSettings) -> ShortestPromptFirst:
    return ShortestPromptFirst(settings.max_num_seqs, settings.max_num_batched_tokens,
                               settings.long_prefill_token_threshold)
