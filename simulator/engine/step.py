"""The contract between the engine and a scheduling policy.

Before a forward pass the engine hands the policy a read-only `View` and the policy returns a `Step`
saying which requests advance by how many tokens. The engine alone mutates state: it admits, allocates
KV blocks (preempting when a running request cannot grow), charges the step's cost and advances the
requests. A policy never enumerates the decoders (the running requests that need one token per
step) one by one: it sees how many there are and the KV blocks their next step needs
(`num_decoding`, `decode_blocks`) and runs them all at once (`Step.decode`), which is what keeps a
step O(1) however large the batch.

Writing a policy (a callable `policy(view) -> Step`, one module under `policies/` plus one line in
its registry):

- `view.waiting` iterates the waiting queue in the order the policy's `scheduling` names ("fcfs":
  arrival order, preempted requests first; "priority": by (priority, arrival)). Naming a waiting
  request in `Step.tokens` admits it. Admissions must fit the free KV blocks the policy can see:
  `view.kv.num_free`, less `view.decode_blocks` when the decoders run, less what running prompts'
  chunks need (`view.kv.extra_blocks(request, request.computed + n)`).
- With prefix caching (`simulator.engine.kv`), each request `view.waiting` hands over has been looked up:
  its `computed` is its cached prefix (block-aligned, the last prompt token always left to compute)
  and `view.kv.extra_blocks` does not charge the cached blocks other requests hold. At admission
  the engine takes what is still cached of it.
- `view.prefilling` lists the running requests with prompt (or recomputation) left, in admission
  order; each may be given up to `request.num_pending` tokens.
- `Step(decode=True)` runs every decoder for one token (under speculative decoding, one verify step
  of 1 to k + 1 tokens, `simulator.engine.speculation`). When the order of the running set matters
  (a token budget that runs out among running requests), `view.running()` hands over the whole
  running set in admission order (O(batch)); the policy then names every request that computes,
  decoders with 1 token, and leaves `decode` False.
- `Step(batch=PaddedBatch(...))` makes the admitted requests one padded batch: each row computed as
  `prompt_len` long, KV reserved for `reserve_tokens` per row at admission, and every row (finished
  ones as padding) kept until the last member finishes. While it runs, `Step(decode=True)` prices
  all its rows.
- An empty step sleeps until the next arrival or `wake_at`.

A decode-only step (only `decode`, nothing admitted) may be repeated by the engine without asking
the policy again until something changes: an arrival, a finish, a KV block shortfall, the time
limit. A policy must therefore decide from the state the view shows, and return the same decode-only
step when only the decoders' contexts have grown and free blocks have shrunk; time-dependent policies
say when to look again through `wake_at`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from mypy_extensions import mypyc_attr

from simulator.engine.kv import KVBlocks
from simulator.engine.request import Request

Scheduling = Literal["fcfs", "priority"]


@mypyc_attr(native_class=False)  # a compiled class cannot subclass a builtin exception (setup.py)
class PolicyError(RuntimeError):
    """A policy returned a step the engine cannot carry out."""


@dataclass(frozen=True)
class PaddedBatch:
    """The step's admissions form one batch padded to `prompt_len`, with `reserve_tokens` of KV each
    (the policy's request: while the batch runs, the running set keeps its state)."""

    prompt_len: int
    reserve_tokens: int


@dataclass(slots=True, init=False)
class Step:
    """One forward pass as a policy plans it (see the module docstring); the engine only reads it.
    Not frozen: a policy builds one or two every step, and a frozen dataclass costs twice as much
    to build. (Its `__init__` is written out, as `Request`'s is.)"""

    tokens: dict[Request, int]
    decode: bool
    batch: PaddedBatch | None
    wake_at: float | None

    def __init__(self, tokens: dict[Request, int] | None = None, decode: bool = False,
                 batch: PaddedBatch | None = None, wake_at: float | None = None) -> None:
        self.tokens = {} if tokens is None else tokens
        self.decode, self.batch, self.wake_at = decode, batch, wake_at


class WaitingQueue(Protocol):
    def __iter__(self) -> Iterator[Request]: ...
    def __len__(self) -> int: ...
    def first(self) -> Request: ...


class View(Protocol):
    """What a policy may read before a step."""

    @property
    def now(self) -> float: ...
    @property
    def waiting(self) -> WaitingQueue: ...
    @property
    def prefilling(self) -> Sequence[Request]: ...
    @property
    def num_decoding(self) -> int: ...
    @property
    def decode_blocks(self) -> int:
        """KV blocks the decoders need to run one more step."""
    @property
    def num_running(self) -> int:
        """Running requests, a padded batch's finished rows included."""
    @property
    def kv(self) -> KVBlocks: ...
    def is_youngest(self, request: Request) -> bool:
        """Is this running request the most recently admitted one?"""
    def running(self) -> Sequence[Request]:
        """The whole running set in admission order, every decoder included (O(batch))."""
    def blocks_to_finish(self) -> int:
        """KV blocks the running requests still need to hold all their tokens, prompt and every
        output token (`kv.extra_blocks` of each at that length), without making the decoders
        explicit rows as `running` does."""


class Policy(Protocol):
    """A scheduling policy; besides deciding steps it tells the run how to size and check itself."""

    @property
    def scheduling(self) -> Scheduling:
        """Which waiting-queue and preemption order the engine keeps for it (simulator.engine.queues)."""

    @property
    def prefix_hits(self) -> bool:
        """May its admissions start after a cached prefix (`simulator.engine.kv`)? A policy that computes
        every prompt whole (a padded batch, each row as long as the longest) says no, and the run
        then keeps no prefix cache."""

    @property
    def speculates(self) -> bool:
        """May its decoders verify draft tokens, advancing by several tokens a step (speculative
        decoding, `simulator.engine.speculation`)? A padded batch, whose rows keep the batch's length,
        says no, and a run refuses speculative decoding with it."""

    def __call__(self, view: View) -> Step: ...

    def max_step_tokens(self, longest_prompt: int) -> int:
        """The most tokens one of its steps can compute (activation memory is reserved for it)."""

    def check_prompts(self, prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> None:
        """Refuse (InputError) a workload whose requests it could never schedule, or never schedule
        again after a preemption (which recomputes the prompt and every token emitted so far)."""
