"""The running set: the requests a server runs, their KV blocks, and every change made to them.

A running request is an explicit row, which a step names with its tokens (a request with prompt, or
recomputation, left), or one of the decoders (`simulator.engine.decoders`), which need one token per
step and run as one, never walked (under speculative decoding, verifiers walked every step:
`simulator.engine.speculation`). While a padded batch runs (`Step.batch`), each of its members'
rows is computed at the batch's prompt length, finished members' as padding, until the last one
finishes. The server changes the running set only through these methods, a step at a time:

- `take` a general step: check its rows; allocate KV for the running rows and, when they run, the
  decoders, preempting from the back of the running set until it fits (`simulator.engine.queues`:
  the most recently admitted, or the lowest priority; walking the running set in admission order
  while preempting from its back always leaves a prefix, so the victims are the shortest such
  suffix and nobody is walked); then admit the waiting requests it names, each first taking the
  cached prefix of its prompt when there is a prefix cache (`simulator.engine.kv`), after which the
  rows register their full blocks in the cache. `take_decoders` takes a decode-only step;
- `advance`: the step's explicit rows compute their tokens, the decoders' step count goes up, and
  explicit requests that now decode join the decoders; `finish` each request it finished: it
  leaves, its KV is freed (a padded batch's when its last member finishes), `on_finish` is told;
  `log_step`: the step's row;
- `run_decoders`: k decode-only steps waited for as one (a decode stretch,
  `simulator.engine.stretch`), all of the above for them at once;
- `make_explicit`: every decoder back to an explicit row, its state brought up to date.

It is the one writer of the server's step log (`simulator.engine.steplog`): the tokens it emits
(an explicit row's one by one, a decoder's as one run when it leaves), the steps the decoders run
in, and one row per step with the running set's counts after it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sized
from operator import attrgetter
from typing import Any

import numpy as np

from simulator.cost.contract import StepShape, decode_shape, shape_from_rows
from simulator.engine.decoders import Decoders
from simulator.engine.kv import KVBlocks
from simulator.engine.queues import AdmissionOrder, FcfsQueue, PriorityQueue
from simulator.engine.request import Request
from simulator.engine.speculation import Speculation, Verifiers
from simulator.engine.step import PaddedBatch, PolicyError, Step
from simulator.engine.steplog import StepLog

Rows = list[tuple[Request, int]]
"""A step's explicit rows: (request, tokens it computes)."""
_admitted = attrgetter("admitted")


class RunningSet:
    """A server's running requests and their KV, the waiting queue they are admitted from and
    preempted back to, and the step log it writes (see the module docstring)."""

    def __init__(self, kv: KVBlocks, waiting: FcfsQueue | PriorityQueue, order: AdmissionOrder, log: StepLog,
                 on_finish: Callable[[Request, float], None] | None = None,
                 speculation: Speculation | None = None) -> None:
        self.kv, self.waiting = kv, waiting
        self.unplanned: Sized = ()
        """Requests that arrived but wait for a step's plan (the server's, under async scheduling)."""
        self.order = order  # the preemption order
        self.log = log
        self.on_finish = on_finish
        """Told (request, time) as each request finishes."""
        self.explicit: list[Request] = []
        """The running requests a step names one by one, in admission order (changed in place, never
        replaced: the server's view hands this list out as it is)."""
        self.speculation = speculation  # or None; with it, the decoders are verifiers
        self.verifiers = None if speculation is None else Verifiers(kv.block_size, speculation, kv)
        self.decoders: Decoders = Decoders(kv.block_size) if self.verifiers is None else self.verifiers
        if speculation is not None:
            log.spec_accepted.extend([0] * (speculation.num_tokens + 1))
        self.num_running = 0
        """Running requests, a padded batch's finished rows included (kept as they come and go)."""
        self.num_finished = 0
        self.batch: PaddedBatch | None = None
        """The padded batch that runs (as the policy asked for it), or None; while one runs:"""
        self.batch_rows: list[Request] = []
        """its members, one row each until the last finishes;"""
        self.batch_live = 0  # how many of them have not finished;
        self.batch_since = 0  # the decoders' step count when it began to decode;
        self.batch_last_step = 0  # their step count after its last decode step.
        self._admissions = 0
        self.first_tokens: list[Request] | None = None
        """Under output lag, the requests whose first token the step computed (`simulator.engine.delivery`)."""
        # The step being carried out, from `take` (or `take_decoders`) to `log_step`:
        self._rows: Rows = []  # its explicit rows;
        self._decode = False  # do the decoders run in it?
        self._counts = (0, 0, 0, 0, 0)
        """its log row's num_seqs, prefill_tokens, decode_tokens, padded_tokens and num_preempted."""
        self._num_logged = len(log)
        """Rows in the step log (its `len`, kept here: the log's one writer)."""
        self._cache_counts = (kv.queried_tokens, kv.hit_tokens, kv.host_hit_tokens)  # as of the last row logged

    def decode_shape(self) -> StepShape:
        """A step of the decoders alone: one row each, or every row of a padded batch at its length."""
        if self.batch is None:
            decoders = self.decoders
            return decode_shape(decoders.count, decoders.decode_context)
        rows = len(self.batch_rows)
        return decode_shape(rows, rows * (self.batch.prompt_len + 1 + self.decoders.steps - self.batch_since))

    def blocks_to_finish(self) -> int:
        """KV blocks the running requests still need to hold all their tokens, prompt and every
        output token (a padded batch's finished rows none), no decoder brought up to date."""
        kv = self.kv
        return self.decoders.blocks_to_hold(kv) + sum(
            kv.extra_blocks(r, r.prompt_tokens + r.output_tokens) for r in self.explicit)

    # -- a general step ------------------------------------------------------------------------------
    def take(self, step: Step, now: float) -> StepShape:
        """Take a general step: its rows, checked, with their KV (see the module docstring), its
        admissions at `now`. Returns what it computes."""
        rows, admits = self._split(step)
        batch = step.batch
        verifiers = self.verifiers
        if verifiers is not None:
            if batch is not None or self.batch is not None:
                raise PolicyError("a padded batch cannot speculate: its rows keep the batch's length")
            rows = verifiers.with_drafts(rows)
        num_preempted = self.allocate(rows, step.decode and self.decoders.count > 0)
        for request, n in admits:
            self._admit(request, n, batch, now)
        num_decoders = self.decoders.count if step.decode else 0
        rows += admits
        kv = self.kv
        if kv.caching:
            for request, n in rows:
                if not (request.emitted and request.num_pending == 1):  # decode rows register at release
                    kv.register(request, request.computed + n)
        computed = decode = num_decoders
        if verifiers is None:
            for request, n in rows:
                computed += n
                if n == 1 and request.emitted and request.num_pending == 1:
                    decode += 1
        if verifiers is not None:
            shape, computed, decode = verifiers.step_shape(rows, num_decoders)
        elif batch is not None:
            shape = shape_from_rows([(batch.prompt_len, batch.prompt_len)] * len(admits))
            self._start_batch(batch, [request for request, _ in admits])
        elif self.batch is not None and num_decoders:
            shape = self.decode_shape()
        else:
            shape = shape_from_rows([(n, r.computed + n) for r, n in rows], num_decoders,
                                        self.decoders.decode_context if num_decoders else 0)
        self._rows, self._decode = rows, num_decoders > 0
        self._counts = (num_decoders + len(rows), computed - decode, decode, shape.num_tokens - computed, num_preempted)
        return shape

    def _split(self, step: Step) -> tuple[Rows, Rows]:
        """The step's running rows and admissions, checked."""
        rows: Rows = []
        admits: Rows = []
        members = self.decoders.members
        for request, n in step.tokens.items():
            if not 1 <= n <= request.num_pending or request in members:
                raise PolicyError(f"request {request.id} was given {n} tokens with {request.num_pending} pending"
                                  if request not in members else
                                  f"decoder {request.id} was named in a step: decoders run through Step.decode, "
                                  "or one by one after view.running()")
            if request.admitted >= 0:
                if admits:
                    raise PolicyError(f"running request {request.id} comes after a waiting one in the step")
                rows.append((request, n))
            else:
                admits.append((request, n))
        if admits and self.batch is not None:
            raise PolicyError("requests were admitted while a padded batch runs")
        return rows, admits

    def take_decoders(self) -> None:
        """Take a decode-only step, priced already (`decode_shape`): the KV blocks the decoders'
        boundary crossings need (the caller saw they fit; a padded batch's rows need none)."""
        decoders = self.decoders
        if self.batch is None:
            self.kv.take(decoders.blocks_needed())
        self._rows, self._decode = [], True
        num_live = decoders.count
        padded = len(self.batch_rows) - num_live if self.batch is not None else 0
        self._counts = (num_live, 0, num_live, padded, 0)

    def allocate(self, rows: Rows, decode: bool) -> int:
        """KV for the running rows and, with `decode`, the decoders' next step; preempt from the
        back of the running set until it fits (see the module docstring). Returns how many were
        preempted."""
        kv, decoders = self.kv, self.decoders
        if not rows:  # a prefill step's admissions are allocated apart; only the decoders grow here
            need = decoders.blocks_needed() if decode else 0
            if need <= kv.num_free:
                decoders.take_blocks(kv, need)  # from the free queue's head, evicting cached blocks there
                return 0
        needs = {r: kv.extra_blocks(r, r.computed + n) for r, n in rows}
        need = (decoders.blocks_needed() if decode else 0) + sum(needs.values())
        num_preempted = 0
        if need > kv.num_free:
            dropped = set()
            while need > kv.num_free:
                victim = self.order.victim()
                if victim in decoders.members:
                    need -= decoders.blocks_needed_by(victim) if decode else 0
                    self._leave(victim)
                else:
                    self.explicit.remove(victim)
                    need -= needs.pop(victim, 0)
                self._preempt(victim)
                dropped.add(victim)
                num_preempted += 1
            rows[:] = [(r, n) for r, n in rows if r not in dropped]
        if decode:
            decoders.take_blocks(kv, decoders.blocks_needed())
        for request, n in rows:
            kv.grow(request, request.computed + n)
        return num_preempted

    def _admit(self, request: Request, n: int, batch: PaddedBatch | None, now: float) -> None:
        try:
            self.waiting.remove(request)
        except (ValueError, KeyError, IndexError, AssertionError):
            raise PolicyError(f"request {request.id} is neither waiting nor running") from None
        kv = self.kv
        if kv.caching:
            kv.take_hit(request)  # part of the hit the policy saw may have been evicted since
        needed = request.computed + n
        if batch is not None:
            request.reserved_tokens = batch.reserve_tokens
            needed = max(needed, batch.reserve_tokens)
        extra = kv.extra_blocks(request, needed)
        if extra > kv.num_free:
            raise PolicyError(f"request {request.id} was admitted needing {extra} KV blocks with {kv.num_free} free")
        kv.take(extra)
        request.blocks += extra
        if request.scheduled != request.scheduled:  # NaN: never scheduled before
            request.scheduled = now
        request.admitted = self._admissions
        self._admissions += 1
        self.explicit.append(request)
        self.num_running += 1
        self.order.add(request)

    def _start_batch(self, batch: PaddedBatch, members: list[Request]) -> None:
        steps = self.decoders.steps
        self.batch, self.batch_rows, self.batch_live = batch, members, len(members)
        self.batch_since, self.batch_last_step = steps, steps + max(r.output_tokens for r in members) - 1

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop its KV; tokens already emitted stay emitted."""
        self.kv.release(request)
        request.admitted = -1
        request.computed = 0
        request.preemptions += 1
        self.num_running -= 1
        self.waiting.requeue(request)

    # -- the requests advance and finish -------------------------------------------------------------
    def advance(self, end: float) -> list[Request]:
        """The step taken, ending at `end`, computes its rows' tokens and the decoders' when they
        run; explicit requests that now decode join the decoders. Returns the requests it finished,
        in admission order (they leave at `finish`)."""
        index = self._num_logged
        log, decoders = self.log, self.decoders
        finished: list[Request] = []
        speculation, verifiers = self.speculation, self.verifiers
        if self._decode and verifiers is not None:
            finished = verifiers.run(index, log)
        elif self._decode:
            decoders.steps += 1
            log.decode_step.append(index)
            finishing = decoders.pop_finished()
            if finishing:
                finished = [request for _, request in finishing]
        for request, n in self._rows:
            if speculation is not None and request.emitted and request.num_pending == 1:
                speculation.verify(request, index, log)
                if request.emitted == request.output_tokens:
                    finished.append(request)
                continue
            request.computed += n
            if request.computed == request.prompt_tokens + request.emitted:
                request.emitted += 1
                log.token(request.id, index)
                if request.emitted == 1:
                    request.first_token = end
                    if self.first_tokens is not None:  # the server delivers it (output lag)
                        self.first_tokens.append(request)
                if request.emitted == request.output_tokens:
                    finished.append(request)
        if self.explicit:
            still = []
            for request in self.explicit:
                # Those that finished leave at `finish`.
                if request.emitted and request.num_pending == 1 and request.emitted < request.output_tokens:
                    decoders.join(request)
                else:
                    still.append(request)
            self.explicit[:] = still
        if finished:
            finished.sort(key=_admitted)
        return finished

    def run_decoders(self, start: float, durations: Any, ends: Any, used: Any, submitted: list[float]) -> None:
        """The decoders' next k steps, from `start`, waited for as one (a decode stretch): their
        step count, the KV blocks they took by each step's end (`used`, cumulative), their finishes,
        and the steps' rows, the waiting queue grown by the requests `submitted` meanwhile (by
        time). Numpy arrays for many steps, logged at once; lists for a few, one by one."""
        decoders, log = self.decoders, self.log
        k, index, steps0, live0 = len(ends), self._num_logged, decoders.steps, decoders.count
        rows = len(self.batch_rows) if self.batch is not None else live0
        kv_used0, running0 = self.kv.num_used, self.num_running
        waiting0 = len(self.waiting) + len(self.unplanned) - len(submitted)
        decoders.steps += k
        if used[-1]:
            self.kv.take(int(used[-1]))
        finishing = decoders.pop_finished()
        for step, request in finishing:
            self.finish(request, float(ends[step - steps0 - 1]), step)
        self._num_logged += k
        if isinstance(ends, np.ndarray):
            log.decode_step.frombytes(np.arange(index, index + k, dtype=np.int32).tobytes())
            finish_steps = np.array([s for s, _ in finishing], dtype=np.int64)
            live = live0 - np.searchsorted(finish_steps, steps0 + np.arange(k, dtype=np.int64), side="right")
            num_waiting = waiting0 + np.searchsorted(np.sort(np.array(submitted)), ends, side="right")
            kv_used = kv_used0 + used
            num_running = np.full(k, running0, dtype=np.int64)
            kv_used[-1], num_running[-1] = self.kv.num_used, self.num_running
            log.extend(np.concatenate(([start], ends[:-1])), durations,
                       {"num_seqs": live, "decode_tokens": live, "padded_tokens": rows - live,
                        "kv_blocks_used": kv_used, "num_waiting": num_waiting, "num_running": num_running})
            return
        submitted = sorted(submitted)
        done = [s for s, _ in finishing] if finishing else []
        for j in range(k):
            log.decode_step.append(index + j)
            num_live = live0 - bisect_right(done, steps0 + j)
            last_row = j == k - 1
            log.append(start, durations[j], num_live, 0, num_live, rows - num_live,
                       self.kv.num_used if last_row else kv_used0 + used[j],
                       waiting0 + bisect_right(submitted, ends[j]), self.num_running if last_row else running0, 0)
            start = ends[j]

    def finish(self, request: Request, at: float, steps: int | None = None) -> None:
        """`request` emitted its last token in the step ending at `at` (a decoder: the decoders'
        `steps`-th, by default the last): it leaves, its KV is freed (a padded batch's when its
        last member finishes), and `on_finish` is told."""
        decoders = self.decoders
        if request in decoders.members:
            count = decoders.leave(request, steps)
            if count:
                self.log.run(request.id, request.decode_since, count)
        else:
            self.explicit.remove(request)
        request.finish = at
        request.accepted_draws = None
        self.num_finished += 1
        if self.batch is None:
            self.kv.release(request)
            request.admitted = -1
            self.num_running -= 1
        else:
            self.batch_live -= 1
            if self.batch_live == 0:
                for member in self.batch_rows:
                    self.kv.release(member)
                    member.admitted = -1
                self.num_running -= len(self.batch_rows)
                self.batch, self.batch_rows = None, []
        if self.on_finish is not None:
            self.on_finish(request, at)

    def make_explicit(self) -> None:
        """Every decoder leaves the decoders for an explicit row, its state brought up to date (O(batch))."""
        if self.decoders.count:
            evicted = sorted(self.decoders.members, key=_admitted)
            for request in evicted:
                self._leave(request)
            self.explicit[:] = sorted(self.explicit + evicted, key=_admitted)

    def _leave(self, request: Request) -> None:
        """A decoder leaves the decoders, its tokens logged as one run (`finish` does the same inline)."""
        count = self.decoders.leave(request)
        if count:
            self.log.run(request.id, request.decode_since, count)

    # -- the step log -------------------------------------------------------------------------------
    def log_step(self, start: float, duration: float) -> None:
        """The row of the step taken, from `start` for `duration`, with the running set's counts
        after it, and the prefix-cache queries its admissions made."""
        log, kv = self.log, self.kv
        num_seqs, prefill_tokens, decode_tokens, padded_tokens, num_preempted = self._counts
        log.append(start, duration, num_seqs, prefill_tokens, decode_tokens, padded_tokens, kv.num_used,
                   len(self.waiting) + len(self.unplanned), self.num_running, num_preempted)
        self._num_logged += 1
        queried, hit, host_hit = self._cache_counts
        if kv.queried_tokens != queried:
            log.cache_queries(self._num_logged - 1, kv.queried_tokens - queried, kv.hit_tokens - hit,
                              kv.host_hit_tokens - host_hit)
            self._cache_counts = (kv.queried_tokens, kv.hit_tokens, kv.host_hit_tokens)
