"""The run settings a policy is built from, typed as the policies read them.

`simulator.config.RunConfig` has every one of them. The policies name this protocol instead of
importing the config, because the config asks the policy registry which settings each policy reads.
"""

from __future__ import annotations

from typing import Protocol


class RunSettings(Protocol):
    @property
    def policy(self) -> str: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def long_prefill_token_threshold(self) -> int: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def max_queue_delay(self) -> float: ...
    @property
    def prefill_replicas(self) -> int | None: ...
