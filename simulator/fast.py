"""The fast engine: the reference engine's results, bit for bit, at O(1) Python work per quiet step.

The reference engine (`simulator.engine`) is one SimPy event per step and touches every sequence
in every step. This engine runs the same state machine in a plain loop over step boundaries, with
per-request state in columns (Python lists: the hot loop reads scalars) and the running set split in
two:

- lazy decoders `D`: requests that emit one token in every step in which `D` runs. Nothing about
  them is touched per step. The engine keeps a step counter `G` (steps in which `D` ran) and, per
  decoder, `key = prompt + emitted - G`, constant while it decodes, from which its emitted tokens
  (`key - prompt + G`), its context (`key + G`) and its finishing step (`output + prompt - key`) follow.
  Aggregates are kept incrementally: the context sum (`K + |D| G`), a heap of finishing steps, and the
  number of decoders in each residue of `key` modulo the block size, which gives the KV blocks the
  step needs (a decoder needs a new block when its context crosses a block boundary).
- explicit requests `E`: prompts being prefilled (in chunks), handled one by one as the reference
  does. With chunked prefill and no `long_prefill_token_threshold` there is at most one, the newest.

Preemption needs no walk over decoders: walking the running set in admission order while preempting
from its back always leaves a prefix, so the victims are the shortest suffix whose blocks cover the
shortfall, taken from an admission-ordered deque. A token budget that runs out among running prompts
(only possible with `long_prefill_token_threshold`) is the one case where the order of the whole
running set matters; for it every decoder is made explicit (O(batch)), the step runs exactly as the
reference's, and decoders go back to `D`.

Stretches of at least `RUN_MIN` quiet steps (every decoder, nothing else: no arrival, no finish, no
KV shortage before them) advance as arrays when the cost model prices many decode steps at once
(`RooflineCost.decode_step_times`, the scalar formula elementwise): durations, step ends (a
sequential cumulative sum, the same additions as step by step), KV blocks and the step log in a
few numpy calls. A static batch's decode steps are one such stretch. Tokens are logged as one run
per stretch of lazy decoding (request, first `G`, count) plus single (request, step) tokens, never
per token. Arrivals follow the reference's clock: a request is seen at the first step boundary at
or after the instant its arrival is processed (`arrival_instants`).

Results are identical to the reference engine's (tests/test_engines.py checks every table, to the
bit); a policy this engine does not know runs on the reference engine.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np

from policies.chunked import ChunkedPrefill
from policies.continuous import ContinuousBatching
from policies.static import StaticBatching
from simulator.cost import CostModel, StepShape
from simulator.engine import PolicyStalledError, StepLog
from simulator.request import RequestColumns
from simulator.step import Policy
from workloads import Workload

NAN = math.nan
RUN_MIN, RUN_MAX = 32, 4096
"""Quiet runs at least this long are advanced as arrays, at most this many steps at a time."""


def supports(policy: Policy) -> bool:
    return type(policy) in (ChunkedPrefill, ContinuousBatching, StaticBatching)


def arrival_instants(arrival: np.ndarray) -> list[float]:
    """When each arrival is processed on the simulated clock: the arrival process sleeps `t - now`
    after the previous one, and `now + (t - now)` need not round to `t`."""
    instants = []
    now = 0.0
    for t in arrival.tolist():
        if t > now:
            now = now + (t - now)
        instants.append(now)
    return instants


def step_ends(now: float, durations: np.ndarray) -> np.ndarray:
    """Ends of consecutive steps from `now`: a sequential cumulative sum, the same additions as
    `now = now + duration` step by step (so the same bits)."""
    return np.cumsum(np.concatenate(([now], durations)))[1:]  # type: ignore[no-any-return]


def run_fast(policy: Policy, cost: CostModel, num_blocks: int, block_size: int, workload: Workload,
             time_limit: float | None) -> tuple[RequestColumns, StepLog, float]:
    engine: _Engine
    if isinstance(policy, StaticBatching):
        engine = _StaticEngine(policy, cost, num_blocks, block_size, workload, time_limit)
    else:
        assert isinstance(policy, (ChunkedPrefill, ContinuousBatching))
        engine = _IterationEngine(policy, cost, num_blocks, block_size, workload, time_limit)
    return engine.run()


class _Engine:
    """Request columns, the waiting queue, arrivals and the step log, shared by both engines."""

    def __init__(self, cost: CostModel, num_blocks: int, block_size: int, workload: Workload,
                 time_limit: float | None) -> None:
        self.step_time = cost.step_time
        # Runs of quiet steps go through numpy when the cost model prices many decode steps at once.
        self.decode_step_times: Callable[[int, np.ndarray], np.ndarray] | None = getattr(
            cost, "decode_step_times", None)
        self.num_blocks = self.num_free = num_blocks
        self.bs = block_size
        n = self.n = workload.num_requests
        self.prompt: list[int] = workload.prompt_tokens.tolist()
        self.output: list[int] = workload.output_tokens.tolist()
        self.arrival = [NAN] * n
        self.computed = [0] * n
        self.emitted = [0] * n
        self.scheduled = [NAN] * n
        self.first = [NAN] * n
        self.finish = [NAN] * n
        self.preempted = [0] * n
        self.owned = [0] * n
        self.created = 0
        self.waiting: deque[int] = deque()
        self.limit = math.inf if time_limit is None else time_limit
        self.last_event = 0.0  # the end of the last step
        self.last_wake = 0.0  # the latest sleep timeout set; it fires even after an arrival woke the server
        self.log = StepLog()
        self.closed = workload.arrival is None
        if self.closed:
            assert workload.concurrency is not None
            self.times: list[float] = []
            self.instants: list[float] = []
            for _ in range(min(workload.concurrency, n)):
                self._create(0.0)
        else:
            assert workload.arrival is not None
            self.times = workload.arrival.tolist()
            self.instants = arrival_instants(workload.arrival)
        self.instants_array = np.asarray(self.instants)
        self.next_arrival = n if self.closed else 0  # open-loop arrivals not yet queued

    def _create(self, t: float) -> None:
        i = self.created
        self.arrival[i] = t
        self.waiting.append(i)
        self.created = i + 1

    def _arrive(self, now: float) -> None:
        """Queue every open-loop arrival processed by `now` (an arrival at a step's end comes first)."""
        instants, i = self.instants, self.next_arrival
        while i < self.n and instants[i] <= now:
            self._create(self.times[i])
            i += 1
        self.next_arrival = i

    def _client_returns(self, now: float) -> None:
        """Closed loop: a finished request's client sends its next one at once."""
        if self.closed and self.created < self.n:
            self._create(now)

    def _next_instant(self) -> float:
        return self.instants[self.next_arrival] if self.next_arrival < self.n and not self.closed else math.inf

    def _idle(self) -> float | None:
        """Nothing to do: sleep until the next arrival; None when there is none before the time limit."""
        wake = self._next_instant()
        if wake >= self.limit:
            return None
        return wake

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def _stall(self, now: float, num_running: int) -> PolicyStalledError:
        return PolicyStalledError(
            f"the policy scheduled nothing at t={now:.6f} s while {len(self.waiting)} requests waited and "
            f"{num_running} ran")

    def _log_step(self, start: float, duration: float, num_seqs: int, prefill: int, decode: int, padded: int,
                  num_running: int, num_preempted: int) -> None:
        log = self.log
        log.start.append(start)
        log.duration.append(duration)
        log.num_seqs.append(num_seqs)
        log.prefill_tokens.append(prefill)
        log.decode_tokens.append(decode)
        log.padded_tokens.append(padded)
        log.kv_blocks_used.append(self.num_blocks - self.num_free)
        log.num_waiting.append(len(self.waiting))
        log.num_running.append(num_running)
        log.num_preempted.append(num_preempted)

    def _log_steps(self, start: float, ends: np.ndarray, durations: np.ndarray, num_seqs: np.ndarray | int,
                   decode: np.ndarray | int, padded: np.ndarray | int, kv_used: np.ndarray | int,
                   num_waiting: np.ndarray | int, num_running: np.ndarray | int) -> None:
        """`_log_step` for a run of decode-only steps given as arrays or constants (no prefill, no
        preemption)."""
        log = self.log
        k = len(ends)
        log.lazy_step.frombytes(np.arange(len(log.start), len(log.start) + k, dtype=np.int64).tobytes())
        log.start.frombytes(np.concatenate(([start], ends[:-1])).tobytes())
        log.duration.frombytes(durations.tobytes())
        zeros = np.zeros(k, dtype=np.int64).tobytes()
        for column, values in ((log.num_seqs, num_seqs), (log.prefill_tokens, None), (log.decode_tokens, decode),
                               (log.padded_tokens, padded), (log.kv_blocks_used, kv_used),
                               (log.num_waiting, num_waiting), (log.num_running, num_running),
                               (log.num_preempted, None)):
            column.frombytes(zeros if values is None else np.broadcast_to(values, k).astype(np.int64).tobytes())

    def _single_token(self, i: int, step: int, end: float) -> None:
        self.log.token_request.append(i)
        self.log.token_step.append(step)
        self.emitted[i] += 1
        if self.emitted[i] == 1:
            self.first[i] = end

    def _run_of_tokens(self, i: int, first: int, count: int) -> None:
        if count:
            log = self.log
            log.run_request.append(i)
            log.run_first.append(first)
            log.run_count.append(count)

    def run(self) -> tuple[RequestColumns, StepLog, float]:
        self._loop()
        self._materialise()
        # Every arrival processed before the clock stopped: all of them without a time limit, those
        # strictly before it with one (the limit ends the run before events at that instant).
        self._arrive(math.nextafter(self.limit, -math.inf))
        if self.limit < math.inf:
            end_time = self.limit
        else:
            end_time = max(self.last_event, self.last_wake, self.instants[-1] if self.instants else 0.0)
        c = self.created
        columns = RequestColumns(
            np.array(self.arrival[:c], dtype=np.float64), np.array(self.prompt[:c], dtype=np.int64),
            np.array(self.output[:c], dtype=np.int64), np.array(self.emitted[:c], dtype=np.int64),
            np.array(self.scheduled[:c], dtype=np.float64), np.array(self.first[:c], dtype=np.float64),
            np.array(self.finish[:c], dtype=np.float64), np.array(self.preempted[:c], dtype=np.int64))
        return columns, self.log, end_time

    def _loop(self) -> None:
        raise NotImplementedError

    def _materialise(self) -> None:
        """Write back the state kept implicitly for requests still running when the clock stopped."""


class _IterationEngine(_Engine):
    """Continuous batching and chunked prefill (iteration-level scheduling)."""

    def __init__(self, policy: ChunkedPrefill | ContinuousBatching, cost: CostModel, num_blocks: int,
                 block_size: int, workload: Workload, time_limit: float | None) -> None:
        super().__init__(cost, num_blocks, block_size, workload, time_limit)
        self.chunked = isinstance(policy, ChunkedPrefill)
        self.max_seqs = policy.max_num_seqs
        self.budget = policy.max_num_batched_tokens
        self.threshold = policy.long_prefill_token_threshold if isinstance(policy, ChunkedPrefill) else 0
        n = self.n
        self.adm = [0] * n  # admission order: the running set's order
        self.next_adm = 0
        self.key = [0] * n
        self.epoch = [0] * n
        self.seg_start = [0] * n
        self.explicit: list[int] = []  # E, in admission order
        self.order: deque[int] = deque()  # the running set in admission order, finished ones not yet dropped
        self.is_running = bytearray(n)
        self.lazy: set[int] = set()  # D
        self.num_lazy = 0
        self.key_sum = 0
        self.residues = [0] * block_size
        self.finishing: list[tuple[int, int, int, int]] = []  # (G at finish, adm, request, epoch)
        self.g = 0
        self.no_run_before_g, self.no_run_before_t = 0, 0.0  # a numpy run was refused until these

    # -- lazy decoders ---------------------------------------------------------------------------
    def _join(self, i: int) -> None:
        key = self.prompt[i] + self.emitted[i] - self.g
        self.key[i] = key
        self.lazy.add(i)
        self.num_lazy += 1
        self.key_sum += key
        self.residues[key % self.bs] += 1
        self.seg_start[i] = self.g
        self.epoch[i] += 1
        heapq.heappush(self.finishing, (self.output[i] + self.prompt[i] - key, self.adm[i], i, self.epoch[i]))

    def _leave(self, i: int) -> None:
        """Make decoder `i` explicit again at the current `G`."""
        key, g = self.key[i], self.g
        self.lazy.remove(i)
        self.num_lazy -= 1
        self.key_sum -= key
        self.residues[key % self.bs] -= 1
        self.epoch[i] += 1
        self._run_of_tokens(i, self.seg_start[i], g - self.seg_start[i])
        emitted = key - self.prompt[i] + g
        self.emitted[i] = emitted
        self.computed[i] = self.prompt[i] + emitted - 1
        self.owned[i] = self._blocks(key + g - 1)

    def _crossings(self) -> int:
        """KV blocks the decoders need for the next lazy step."""
        return self.residues[(1 - self.g) % self.bs]

    def _materialise(self) -> None:
        for i in sorted(self.lazy):
            self._leave(i)

    # -- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        now = 0.0
        while True:
            self._arrive(now)
            if not self.waiting and not self.num_lazy and not self.explicit:
                wake = self._idle()
                if wake is None:
                    return
                now = wake
                continue
            if not self.explicit and self.num_lazy and self._quiet():
                end = self._decode_steps(now)
            else:
                end = self._general_step(now)
            if end is None:
                return
            now = end

    def _quiet(self) -> bool:
        """Is the next step every decoder and nothing else (no admission, no preemption)?"""
        crossings = self._crossings()
        if crossings > self.num_free:
            return False
        if not self.waiting or self.num_lazy >= self.max_seqs:
            return True
        w = self.waiting[0]
        pending = self.prompt[w] + self.emitted[w] - self.computed[w]
        if self.chunked:
            room = self.budget - self.num_lazy
            if room == 0:
                return True
            n = min(pending, room)
            if self.threshold:
                n = min(n, self.threshold)
            return self._blocks(self.computed[w] + n) - self.owned[w] > self.num_free - crossings
        return pending > self.budget or self._blocks(self.computed[w] + pending) - self.owned[w] > self.num_free

    def _decode_steps(self, now: float) -> float | None:
        """Steps of every decoder and nothing else, for as long as nothing else would be scheduled."""
        step_time, log, limit, finishing = self.step_time, self.log, self.limit, self.finishing
        lazy_step = log.lazy_step
        while True:
            if (self.decode_step_times is not None and not self.waiting and self.g >= self.no_run_before_g
                    and now >= self.no_run_before_t):
                end = self._decode_run(now)
                if end is not None:
                    now = end
                    if not self._quiet():  # the run stopped short of a KV shortage
                        return now
                    continue
            num_lazy = self.num_lazy
            self.num_free -= self._crossings()
            duration = step_time(StepShape(num_lazy, num_lazy, self.key_sum + num_lazy * self.g))
            end = now + duration
            if end >= limit:
                return None
            step = len(log.start)
            self.g += 1
            lazy_step.append(step)
            if finishing and finishing[0][0] <= self.g:
                self._finish_lazy(end, self._pop_finished())
            self._arrive(end)
            self._log_step(now, duration, num_lazy, 0, num_lazy, 0, self.num_lazy + len(self.explicit), 0)
            self.last_event = now = end
            if not self.num_lazy or not self._quiet():
                return now

    def _decode_run(self, now: float) -> float | None:
        """Up to `RUN_MAX` quiet steps at once: those before the next finish, the next arrival, the
        time limit and the first step short of KV blocks; None when fewer than `RUN_MIN` are left."""
        assert self.decode_step_times is not None
        finishing, g, epoch = self.finishing, self.g, self.epoch
        while finishing[0][3] != epoch[finishing[0][2]]:  # left D since: stale
            heapq.heappop(finishing)
        k = min(finishing[0][0] - g - 1, RUN_MAX)
        if k < RUN_MIN:
            self.no_run_before_g = finishing[0][0]  # not worth trying again before that finish
            return None
        # Steps only lengthen as contexts grow, so the first one bounds how many fit before the next
        # arrival or the time limit (a bound only: the run's length is settled exactly below).
        num_lazy = self.num_lazy
        first = self.step_time(StepShape(num_lazy, num_lazy, self.key_sum + num_lazy * g))
        stop = min(self._next_instant(), self.limit)
        if stop - now < RUN_MIN * first:
            self.no_run_before_t = stop  # nor before that arrival
            return None
        if stop - now < k * first:
            k = int((stop - now) / first) + 1
        offsets = np.arange(k, dtype=np.int64)
        used = np.cumsum(np.asarray(self.residues, dtype=np.int64)[(1 - g - offsets) % self.bs])
        k = min(k, int(np.searchsorted(used, self.num_free, side="right")))
        if k < RUN_MIN:
            self.no_run_before_g = finishing[0][0]  # KV blocks come back only when someone finishes
            return None
        durations = self.decode_step_times(num_lazy, self.key_sum + num_lazy * (g + offsets[:k]))
        ends = step_ends(now, durations)
        k = min(k, int(np.searchsorted(ends, stop, side="left")))
        if k < RUN_MIN:
            self.no_run_before_t = stop
            return None
        ends, used = ends[:k], used[:k]
        self._log_steps(now, ends, durations[:k], num_lazy, num_lazy, 0, self.num_blocks - self.num_free + used, 0,
                        num_lazy)
        self.num_free -= int(used[-1])
        self.g += k
        self.last_event = float(ends[-1])
        return self.last_event

    def _pop_finished(self) -> list[tuple[int, int]]:
        """Decoders that emitted their last token in lazy step `G`, as (admission, request)."""
        done = []
        finishing, g, epoch = self.finishing, self.g, self.epoch
        while finishing and finishing[0][0] <= g:
            at, adm, i, e = heapq.heappop(finishing)
            if e == epoch[i]:  # else it left D since (every join and leave bumps the epoch)
                assert at == g
                done.append((adm, i))
        return done

    def _finish_lazy(self, end: float, done: list[tuple[int, int]]) -> None:
        for _, i in done:
            self._leave(i)
            self._release(i, end)

    def _release(self, i: int, end: float) -> None:
        self.finish[i] = end
        self.is_running[i] = 0
        self.num_free += self.owned[i]
        self.owned[i] = 0
        self._client_returns(end)

    def _general_step(self, now: float) -> float | None:
        """One step of any kind (admissions, prefill chunks, preemption), as the reference runs it;
        the lazy decoders take part as totals. Returns the step's end, or None at the time limit."""
        plan = self._plan(exact=False)
        if plan is None:
            evicted = sorted(self.lazy)
            for i in evicted:
                self._leave(i)
            self.explicit = sorted(self.explicit + evicted, key=self.adm.__getitem__)
            plan = self._plan(exact=True)
            assert plan is not None
        lazy_runs, rows, admits = plan
        if not lazy_runs and not rows and not admits:
            raise self._stall(now, self.num_lazy + len(self.explicit))
        num_preempted = self._allocate(now, lazy_runs, rows, admits)
        explicit_rows = rows + admits
        num_lazy = self.num_lazy if lazy_runs else 0
        prompt, emitted, computed = self.prompt, self.emitted, self.computed
        shape = StepShape.from_rows([(n, computed[i] + n) for i, n in explicit_rows], num_lazy,
                                    self.key_sum + num_lazy * self.g if num_lazy else 0)
        real = num_lazy + sum(n for _, n in explicit_rows)
        decode = num_lazy + sum(1 for i, _ in explicit_rows
                                if emitted[i] > 0 and prompt[i] + emitted[i] - computed[i] == 1)
        duration = self.step_time(shape)
        end = now + duration
        if end >= self.limit:
            return None
        step = len(self.log.start)
        done: list[tuple[int, int]] = []
        if num_lazy:
            self.g += 1
            self.log.lazy_step.append(step)
            if self.finishing and self.finishing[0][0] <= self.g:
                done = self._pop_finished()
        explicit_done = []
        for i, n in explicit_rows:
            computed[i] += n
            if computed[i] == prompt[i] + emitted[i]:
                self._single_token(i, step, end)
                if emitted[i] == self.output[i]:
                    explicit_done.append((self.adm[i], i))
        if explicit_done:
            for _, i in explicit_done:
                self.explicit.remove(i)
            if done:
                # Finishing order is step order, i.e. admission order (closed-loop ids follow it).
                order = sorted([(adm, i, True) for adm, i in done] + [(adm, i, False) for adm, i in explicit_done])
                for _, i, was_lazy in order:
                    if was_lazy:
                        self._leave(i)
                    self._release(i, end)
            else:
                for _, i in explicit_done:
                    self._release(i, end)
        elif done:
            self._finish_lazy(end, done)
        still = []
        for i in self.explicit:
            if emitted[i] > 0 and prompt[i] + emitted[i] - computed[i] == 1:
                self._join(i)
            else:
                still.append(i)
        self.explicit = still
        self._arrive(end)
        self._log_step(now, duration, num_lazy + len(explicit_rows), real - decode, decode,
                       shape.num_tokens - real, self.num_lazy + len(self.explicit), num_preempted)
        self.last_event = end
        return end

    def _plan(self, exact: bool) -> tuple[bool, list[tuple[int, int]], list[tuple[int, int]]] | None:
        """The policy's step: (do the lazy decoders run, explicit running rows, admitted rows), or None
        when the lazy split cannot reproduce the step (the caller then makes every decoder explicit)."""
        prompt, emitted, computed, owned = self.prompt, self.emitted, self.computed, self.owned
        blocks, threshold = self._blocks, self.threshold
        budget = self.budget
        num_lazy = self.num_lazy
        rows: list[tuple[int, int]] = []
        admits: list[tuple[int, int]] = []
        num_seqs = num_lazy + len(self.explicit)
        if self.chunked:
            if not exact and self.explicit:
                demand = num_lazy
                for i in self.explicit:
                    pending = prompt[i] + emitted[i] - computed[i]
                    demand += min(pending, threshold) if threshold else pending
                # Budget running out among running requests: only the newest may be cut short.
                if demand > budget and (threshold or len(self.explicit) > 1):
                    return None
            need = 0
            if num_lazy:
                budget -= num_lazy
                need = self._crossings()
            for i in self.explicit:
                if budget == 0:
                    break
                n = prompt[i] + emitted[i] - computed[i]
                if threshold:
                    n = min(n, threshold)
                n = min(n, budget)
                rows.append((i, n))
                budget -= n
                need += max(0, blocks(computed[i] + n) - owned[i])
            free = self.num_free - need
            for w in self.waiting:
                if budget == 0 or num_seqs >= self.max_seqs:
                    break
                n = prompt[w] + emitted[w] - computed[w]
                if threshold:
                    n = min(n, threshold)
                n = min(n, budget)
                extra = max(0, blocks(computed[w] + n) - owned[w])
                if extra > free:
                    break
                admits.append((w, n))
                budget -= n
                free -= extra
                num_seqs += 1
            return num_lazy > 0, rows, admits
        free = self.num_free
        for w in self.waiting:
            n = prompt[w] + emitted[w] - computed[w]
            extra = max(0, blocks(computed[w] + n) - owned[w])
            if n > budget or num_seqs >= self.max_seqs or extra > free:
                break
            admits.append((w, n))
            budget -= n
            free -= extra
            num_seqs += 1
        if admits:
            return False, [], admits
        return num_lazy > 0, [(i, 1) for i in self.explicit], admits

    def _allocate(self, now: float, lazy_runs: bool, rows: list[tuple[int, int]],
                  admits: list[tuple[int, int]]) -> int:
        """KV for the step, as the reference's `Server._allocate`: running requests grow in admission
        order and, when one cannot, the most recently admitted running request is preempted (possibly
        itself). Walking forward while preempting from the back always leaves a prefix of the running
        set: the shortest suffix whose blocks (and whose own needs) cover the shortfall. So the
        victims are found from the back, without walking the decoders."""
        blocks, owned, computed = self._blocks, self.owned, self.computed
        needs = {i: max(0, blocks(computed[i] + n) - owned[i]) for i, n in rows}
        need = (self._crossings() if lazy_runs else 0) + sum(needs.values())
        num_preempted = 0
        if need > self.num_free:
            dropped = set()
            crossing = (1 - self.g) % self.bs
            while need > self.num_free:
                victim = self._youngest()
                if self.explicit and self.explicit[-1] == victim:
                    self.explicit.pop()
                    need -= needs.get(victim, 0)
                else:
                    need -= int(self.key[victim] % self.bs == crossing)
                    self._leave(victim)
                self._preempt(victim)
                dropped.add(victim)
                num_preempted += 1
            rows[:] = [(i, n) for i, n in rows if i not in dropped]
        if lazy_runs:
            self.num_free -= self._crossings()
        for i, _ in rows:
            self.num_free -= needs[i]
            owned[i] += needs[i]
        for w, n in admits:
            if self.waiting and self.waiting[0] == w:
                self.waiting.popleft()
            else:
                self.waiting.remove(w)
            extra = max(0, blocks(computed[w] + n) - owned[w])
            assert extra <= self.num_free
            self.num_free -= extra
            owned[w] += extra
            if math.isnan(self.scheduled[w]):
                self.scheduled[w] = now
            self.adm[w] = self.next_adm
            self.next_adm += 1
            self.explicit.append(w)
            self.order.append(w)
            self.is_running[w] = 1
        assert self.num_free >= 0
        if len(self.order) > 2 * (self.num_lazy + len(self.explicit)) + 64:
            self.order = deque(i for i in self.order if self.is_running[i])
        return num_preempted

    def _youngest(self) -> int:
        """The most recently admitted running request (dropping finished ones off the back)."""
        order, running = self.order, self.is_running
        while not running[order[-1]]:
            order.pop()
        return order.pop()

    def _preempt(self, i: int) -> None:
        """Recompute preemption: drop its KV; tokens already emitted stay emitted."""
        self.is_running[i] = 0
        self.num_free += self.owned[i]
        self.owned[i] = 0
        self.computed[i] = 0
        self.preempted[i] += 1
        self.waiting.appendleft(i)


class _StaticEngine(_Engine):
    """Static batching: a batch is prefilled padded, then decodes until its longest output is done."""

    def __init__(self, policy: StaticBatching, cost: CostModel, num_blocks: int, block_size: int,
                 workload: Workload, time_limit: float | None) -> None:
        super().__init__(cost, num_blocks, block_size, workload, time_limit)
        self.max_batch = policy.max_batch_size
        self.max_delay = policy.max_queue_delay
        self.g = 0
        self.batch: list[int] = []  # the batch being decoded, its tokens not yet written back
        self.batch_since = 0  # the lazy step its decoding began at

    def _loop(self) -> None:
        now = 0.0
        while True:
            self._arrive(now)
            if not self.waiting:
                wake = self._idle()
                if wake is None:
                    return
                now = wake
                continue
            deadline = self.arrival[self.waiting[0]] + self.max_delay
            if len(self.waiting) < self.max_batch and now < deadline:
                wake = now + (deadline - now)
                self.last_wake = max(self.last_wake, wake)
                now = min(wake, self._next_instant())
                if now >= self.limit:
                    return
                continue
            end = self._batch(now)
            if end is None:
                return
            now = end

    def _batch(self, now: float) -> float | None:
        """Form, prefill and decode one batch; the time it ends, or None when the clock stops first."""
        prompt, output = self.prompt, self.output
        members: list[int] = []
        longest_prompt = longest_output = 0
        for i in self.waiting:
            if len(members) == self.max_batch:
                break
            p = max(longest_prompt, prompt[i])
            o = max(longest_output, output[i])
            if (len(members) + 1) * self._blocks(p + o) > self.num_free:
                break
            members.append(i)
            longest_prompt, longest_output = p, o
        if not members:
            raise self._stall(now, 0)
        m = len(members)
        reserved = self._blocks(longest_prompt + longest_output)
        for i in members:
            self.waiting.popleft()
            self.num_free -= reserved
            self.owned[i] = reserved
            if math.isnan(self.scheduled[i]):
                self.scheduled[i] = now
        lp = longest_prompt
        if lp == 1:
            shape = StepShape(m, m, m)
        else:
            pairs = 0.0
            for _ in range(m):
                pairs += lp * (lp - lp + (lp + 1) / 2)
            shape = StepShape(m, 0, 0, m, m * lp, m * lp, pairs)
        duration = self.step_time(shape)
        end = now + duration
        if end >= self.limit:
            return None
        step = len(self.log.start)
        real = 0
        for i in members:
            self.computed[i] = prompt[i]
            real += prompt[i]
            self._single_token(i, step, end)
        # Members leave in step order as their outputs complete; KV is freed when the last one does.
        by_finish = sorted(range(m), key=lambda j: (output[members[j]], j))
        longest = output[members[by_finish[-1]]]
        position = 0
        while position < m and output[members[by_finish[position]]] == 1:
            self._member_done(members[by_finish[position]], end)
            position += 1
        if position == m:
            self._release_batch(members, end)
        self._arrive(end)
        self._log_step(now, duration, m, real, 0, shape.num_tokens - real, 0 if position == m else m, 0)
        self.last_event = now = end
        # Decode steps: every live member emits; finished rows stay as padding.
        self.batch, self.batch_since = members, self.g
        lazy_step, log = self.log.lazy_step, self.log
        if self.decode_step_times is not None and longest - 1 >= RUN_MIN:
            return self._decode_batch(now, members, by_finish, position, lp)
        for emitted in range(1, longest):
            live = m - position
            duration = self.step_time(StepShape(m, m, m * (lp + emitted)))
            end = now + duration
            if end >= self.limit:
                return None
            lazy_step.append(len(log.start))
            self.g += 1
            while position < m and output[members[by_finish[position]]] == emitted + 1:
                self._member_done(members[by_finish[position]], end)
                position += 1
            if position == m:
                self._release_batch(members, end)
            self._arrive(end)
            self._log_step(now, duration, live, 0, live, m - live, 0 if position == m else m, 0)
            self.last_event = now = end
        self._materialise()
        return now

    def _decode_batch(self, now: float, members: list[int], by_finish: list[int], position: int, lp: int
                      ) -> float | None:
        """The batch's decode steps as arrays: nothing can join a static batch, so every step until its
        longest output is done (or the time limit) is known in advance."""
        assert self.decode_step_times is not None
        m, output = len(members), self.output
        outputs = np.array([output[members[j]] for j in by_finish], dtype=np.int64)  # ascending
        emitted = np.arange(1, int(outputs[-1]), dtype=np.int64)  # each step's tokens so far, per live row
        durations = self.decode_step_times(m, m * (lp + emitted))
        ends = step_ends(now, durations)
        k = int(np.searchsorted(ends, self.limit, side="left"))
        done = k == len(emitted)
        ends, durations, emitted = ends[:k], durations[:k], emitted[:k]
        live = m - np.searchsorted(outputs, emitted, side="right")
        finished_after = np.searchsorted(outputs, emitted + 1, side="right")
        kv_used = np.full(k, self.num_blocks - self.num_free, dtype=np.int64)
        num_running = np.full(k, m, dtype=np.int64)
        if done and k:
            kv_used[-1] -= sum(self.owned[i] for i in members)
            num_running[-1] = 0
        waiting = np.full(k, len(self.waiting), dtype=np.int64)
        if self.closed:
            waiting += np.minimum(finished_after - position, self.n - self.created)
        else:
            waiting += np.searchsorted(self.instants_array, ends, side="right") - self.next_arrival
        if k:
            self._log_steps(now, ends, durations, live, live, m - live, kv_used, waiting, num_running)
            self.g += k
            self.last_event = now = float(ends[-1])
        while position < m and outputs[position] - 2 < k:
            self._member_done(members[by_finish[position]], float(ends[outputs[position] - 2]))
            position += 1
        if k:
            self._arrive(now)
        if not done:
            return None
        self._release_batch(members, now)
        self._materialise()
        return now

    def _member_done(self, i: int, end: float) -> None:
        self.finish[i] = end
        self._client_returns(end)

    def _release_batch(self, members: list[int], end: float) -> None:
        for i in members:
            self.num_free += self.owned[i]
            self.owned[i] = 0

    def _materialise(self) -> None:
        """The batch's decode tokens, as runs: each member emitted one token per decode step until
        its output was done (or the clock stopped)."""
        steps = self.g - self.batch_since
        for i in self.batch:
            count = min(self.output[i] - 1, steps)
            self._run_of_tokens(i, self.batch_since, count)
            self.emitted[i] = 1 + count
            self.computed[i] = self.prompt[i] + count
        self.batch = []
