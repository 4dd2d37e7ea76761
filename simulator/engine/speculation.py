"""Speculative decoding: each decode step drafts k tokens per decoding request and verifies them in
one pass of the target model, so a request advances by 1 to k + 1 tokens a step (vLLM's
`--speculative-config`: n-gram lookup, EAGLE heads, a draft model, DeepSeek's MTP layers). What the
draft and the verify pass cost is the cost model's (`simulator.cost.speculative`); this module says
how many tokens each verify step emits, and keeps the decoders that verify.

Acceptance. `acceptance[i]` is the probability that draft token i + 1 is accepted given that the
tokens before it were (the conditional form of the EAGLE papers), so a step accepts at least i
draft tokens with probability `reach[i - 1]` = acceptance[0] x ... x acceptance[i - 1], and with a
constant a it emits (1 - a^(k+1)) / (1 - a) tokens on average. Each request draws from a stream of
its own, the child of its id in the seed's seventh stream (`SeedSequence(seed, spawn_key=(6, id))`,
after the workload's six): the j-th uniform u of that stream decides its j-th verify step, which
accepts the i draft tokens whose `reach[i - 1]` > u and emits them and the target's own next token
(the bonus token, or the correction of the first rejected draft), at most what its output has left.
The draws depend on nothing but the seed, the request and its count of verify steps: not on
batching, order or time.

KV. A verify step writes the KV of the k + 1 tokens it computes: before it runs the request holds
blocks for `computed + k + 1` tokens (taken as the decoders' blocks are, preempting when they do not
fit). Rejected tokens' slots are given back (`computed` moves on only by the tokens emitted); their
blocks stay with the request, which writes its next tokens into them, as vLLM's KV manager keeps
the lookahead blocks it allocated when drafts are rejected.

Engine. A verifier advances by a random number of tokens per step, so the decoders cannot be one
aggregate (`simulator.engine.decoders`): `Verifiers` keeps them as a set walked every step
(O(batch)), each request's state always up to date, and the server takes no decode stretches. The
policy sees them as decoders (`num_decoding`; `decode_blocks` for their k + 1 tokens each) and runs
them with `Step.decode`; a decoder a policy names after `view.running()` (1 token) is verified the
same way. A policy's token budget counts a verify row as the one token it plans for it (vLLM
counts the k drafts too). Tokens are logged one by one with the step that emitted them; each verify
step adds one to the step log's histogram `spec_accepted` (indexed by drafts accepted), from which
the metrics vLLM reports are computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.cost import StepShape
from simulator.cost.contract import shape_from_rows
from simulator.engine.decoders import Decoders
from simulator.engine.kv import KVBlocks
from simulator.engine.request import Request
from simulator.engine.steplog import StepLog

SPECULATION_STREAM = 6
"""The seed's stream the acceptance draws come from (0-2 arrivals and lengths, 3 priorities, 4 shared
prefixes, 5 a prompt pool); each request draws from its own child of it."""


class Speculation:
    """`num_tokens` (k) draft tokens per verify step, accepted with the conditional probabilities
    `acceptance` (one per position), drawn from `seed` (module docstring)."""

    def __init__(self, num_tokens: int, acceptance: Sequence[float], seed: int) -> None:
        if len(acceptance) != num_tokens or not all(0.0 <= p <= 1.0 for p in acceptance):
            raise ValueError(f"{num_tokens} draft tokens need as many acceptance probabilities in [0, 1], "
                             f"got {list(acceptance)}")
        self.num_tokens = num_tokens
        self.acceptance = tuple(acceptance)
        self.seed = seed
        reach = []
        product = 1.0
        for p in acceptance:
            product *= p
            reach.append(product)
        self.reach = np.array(reach, dtype=np.float64)
        """P(at least i draft tokens accepted), i = 1..k."""

    def accepted(self, request: Request) -> int:
        """Draft tokens accepted in the request's next verify step (module docstring)."""
        draws = request.accepted_draws
        if draws is None:
            # At most output - 1 verify steps: every one emits a token, and the first token is a prefill's.
            stream = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(SPECULATION_STREAM,
                                                                                        request.id)))
            uniforms = stream.random(request.output_tokens)
            draws = request.accepted_draws = (uniforms[:, None] < self.reach).sum(axis=1).astype(np.uint8).tobytes()
        step = request.verify_steps
        request.verify_steps = step + 1
        return draws[step]

    def verify(self, request: Request, index: int, log: StepLog) -> None:
        """The request's verify step, logged as step `index`: the tokens it emits, one by one."""
        accepted = self.accepted(request)
        log.spec_accepted[accepted] += 1
        emitted = min(accepted + 1, request.output_tokens - request.emitted)
        request.computed += emitted
        request.emitted += emitted
        for _ in range(emitted):
            log.token(request.id, index)


class Verifiers(Decoders):
    """The decoders under speculative decoding: a set walked every step, each member's state up to
    date (module docstring). `steps` counts the verify steps they ran in; no decoder finishes
    through the finishing heap, and none leaves with a run of tokens to log."""

    def __init__(self, block_size: int, speculation: Speculation, kv: KVBlocks) -> None:
        super().__init__(block_size)
        self.speculation = speculation
        self.kv = kv
        self.lookahead = speculation.num_tokens + 1
        """Tokens a verify step computes per request."""

    @property
    def decode_context(self) -> int:
        """Sum of the verifiers' contexts after their k + 1 tokens."""
        total = 0
        for request in self.members:
            total += request.computed
        return total + self.count * self.lookahead

    def join(self, request: Request) -> None:
        self.members.add(request)
        self.count += 1

    def leave(self, request: Request, steps: int | None = None) -> int:
        self.members.remove(request)
        self.count -= 1
        return 0  # its tokens were logged as they came

    def blocks_to_hold(self, kv: KVBlocks) -> int:
        """As the decoders' (each verifier's `blocks` is up to date)."""
        total = 0
        for request in self.members:
            total += kv.extra_blocks(request, request.prompt_tokens + request.output_tokens)
        return total

    def blocks_needed(self, ahead: int = 0) -> int:
        assert ahead == 0, "verifiers are priced a step at a time"
        total = 0
        kv, lookahead = self.kv, self.lookahead
        for request in self.members:
            total += kv.extra_blocks(request, request.computed + lookahead)
        return total

    def blocks_needed_by(self, request: Request) -> int:
        return self.kv.extra_blocks(request, request.computed + self.lookahead)

    def take_blocks(self, kv: KVBlocks, need: int) -> None:
        """Every verifier takes the blocks its next step's k + 1 tokens need (`need` in all), as its
        own (`request.blocks`), and keeps them after the step."""
        if need:
            lookahead = self.lookahead
            for request in self.members:
                kv.grow(request, request.computed + lookahead)

    def with_drafts(self, rows: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """A step's explicit rows, each decoding row (a decoder a policy named after
        `view.running()`) given its k draft tokens beside its own: KV for all k + 1."""
        k = self.speculation.num_tokens
        return [(r, n + k if r.emitted and r.num_pending == 1 else n) for r, n in rows]

    def step_shape(self, rows: list[tuple[Request, int]], num_decoders: int) -> tuple[StepShape, int, int]:
        """A speculative step's shape, tokens computed and decode tokens, from its explicit rows
        (`with_drafts`) and, with `num_decoders`, the verifiers: each decoding row verifies k draft
        tokens beside its own (`StepShape.spec_tokens`)."""
        k = self.speculation.num_tokens
        verify_seqs, verify_context = num_decoders, self.decode_context if num_decoders else 0
        others = []
        computed = num_decoders * (k + 1)
        for request, n in rows:
            computed += n
            if request.emitted and request.num_pending == 1:
                verify_seqs += 1
                verify_context += request.computed + n
            else:
                others.append((n, request.computed + n))
        shape = shape_from_rows(others, verify_seqs, verify_context, k * verify_seqs)
        return shape, computed, verify_seqs * (k + 1)

    def run(self, index: int, log: StepLog) -> list[Request]:
        """Every verifier's verify step, logged as step `index`; returns those it finished."""
        self.steps += 1
        verify = self.speculation.verify
        finished = []
        for request in self.members:
            verify(request, index, log)
            if request.emitted == request.output_tokens:
                finished.append(request)
        return finished
