"""When a step's tokens reach their clients: at the step's end, or, under output lag, when the next
step ends if that one computes prompt tokens.

An overlap scheduler processes a step's outputs (streams its tokens, tells the client a request is
done) only after it has launched the next step: SGLang's `event_loop_overlap` runs
`run_batch(batch)` before `process_batch_result(last_batch)`, TensorRT-LLM's
`_executor_loop_overlap` runs `_forward_step` before `_process_previous_batch`. SGLang's scheduler
says what that costs when the next step is a prefill: "For two consecutive prefill batches, we
disable overlap to improve the TTFT of the first batch" (`is_disable_overlap_for_batch`, behind
`SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP`, off by default): the first batch's tokens wait for
the second. Output lag models that: the tokens of step k reach their clients at the end of step
k + 1 when step k + 1 computes prompt tokens (a prefill or a mixed step), and at the end of step k
otherwise (the next step decodes only, or the server has nothing to run). A request's first token
and finish are stamped with that time, its client's next request is sent then, and the tokens
table times its tokens so (`StepLog.held`); its KV is freed at the end of its last step, as
without lag. Under async scheduling only (`simulator.engine.server`). It is a hypothesis about
how the stacks stream, tested on measured rows (docs/validation/stack-fidelity.md): TensorRT-LLM's
rows support it and run with it by default (`simulator.deploy.backends`); SGLang's do not.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.engine.request import Request
from simulator.engine.steplog import StepLog

Held = tuple[list[Request], list[Request], int]
"""A step's held outputs: the requests whose first token it computed, those it finished, and its
index in the step log."""


class Delivery:
    """The outputs of the last step a server took, held until the step after it is known."""

    def __init__(self, log: StepLog, notify: Callable[[Request, float], None] | None) -> None:
        self.log = log
        self.notify = notify
        """The clients' `on_finish`, told (request, time) when a finish reaches them."""
        self.first: list[Request] = []
        """Requests whose first token the last step computed (the running set appends to it)."""
        self.finished: list[Request] = []
        """Requests that finished (`Request.finish`: the end of their last step, until delivered)."""
        self.decided = -1
        """The last step whose outputs are delivered or carried (the steps after it are not)."""

    def hold(self, request: Request, _at: float) -> None:
        """`request` finished in the step ending at `_at`, its `finish` (a running set's `on_finish`)."""
        self.finished.append(request)

    def pending(self) -> bool:
        """Has the last step logged outputs that wait for the next step to be known?"""
        return self.decided < len(self.log) - 1

    def take(self) -> Held:
        """The last step's outputs, carried to the end of the step about to run."""
        step = self.decided = len(self.log) - 1
        held = (self.first[:], self.finished, step)
        self.first.clear()  # in place: the running set appends to this list
        self.finished = []
        return held

    def deliver(self, held: Held, at: float) -> None:
        """`held` reaches its clients at `at`, the end of the step after its own."""
        first, finished, step = held
        self.log.held.append(step)
        for request in first:
            request.first_token = at
        for request in finished:
            request.finish = at
        self._tell(finished)

    def deliver_now(self) -> None:
        """The last step's outputs reach their clients at its end (the next step computes no
        prompt tokens, or there is none)."""
        self.decided = len(self.log) - 1
        if self.first:
            self.first.clear()
        if self.finished:
            finished, self.finished = self.finished, []
            self._tell(finished)

    def _tell(self, finished: list[Request]) -> None:
        notify = self.notify
        if notify is not None:
            for request in finished:
                notify(request, request.finish)
