"""The contract between the engine and a scheduling policy.

Before every forward pass the engine hands the policy a read-only `EngineView`; the policy returns
a `Step` saying which requests advance by how many tokens. The engine alone mutates state,
allocates KV (preempting when a running request cannot grow) and checks invariants.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from simulator.kv import BlockManager
from simulator.request import Request


@dataclass(frozen=True)
class Step:
    """One forward pass as a policy plans it.

    `tokens` maps each request to the tokens it computes, running requests first; a waiting
    request named here is admitted (FCFS is the policy's business). `cost_rows` (new tokens,
    context after the step) replaces the rows the cost model sees, for policies that pad.
    `reserve` reserves KV in full at admission and ties the admitted requests into one group
    whose KV is held until all of them finish. An empty step with `wake_at` sleeps until that
    time or the next arrival.
    """

    tokens: Mapping[Request, int] = field(default_factory=dict)
    cost_rows: Sequence[tuple[int, int]] | None = None
    reserve: Mapping[Request, int] | None = None
    wake_at: float | None = None


class EngineView(Protocol):
    @property
    def now(self) -> float: ...
    @property
    def waiting(self) -> Sequence[Request]: ...
    @property
    def running(self) -> Sequence[Request]: ...
    @property
    def kv(self) -> BlockManager: ...


Policy = Callable[[EngineView], Step]
