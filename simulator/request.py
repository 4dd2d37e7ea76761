"""A request's lengths, progress and timestamps (seconds of simulated time)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(eq=False, slots=True)
class Request:
    """There are no phases: `computed` catches up with `prompt_tokens + emitted`, and the step that
    closes the gap emits one token. A decoding request is one whose gap is a single token."""

    id: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    computed: int = 0
    emitted: int = 0
    scheduled: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    preemptions: int = 0
    reserved_tokens: int = 0
    """KV reserved in full at admission (static batching); 0 = grow block by block."""
    group: int | None = None
    """Static batch this request was admitted with; its KV is held until the whole batch is done."""

    @property
    def num_pending(self) -> int:
        """Tokens to compute before the next output token appears."""
        return self.prompt_tokens + self.emitted - self.computed

    @property
    def is_finished(self) -> bool:
        return self.emitted == self.output_tokens

    @property
    def is_decoding(self) -> bool:
        return self.emitted > 0 and self.num_pending == 1
