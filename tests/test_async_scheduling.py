"""Async scheduling (vLLM's `--async-scheduling`, SGLang's and TensorRT-LLM's overlap scheduler):
each step is planned while the one before it runs, so a request that arrives after a step started
joins the step after the next; with output lag (TensorRT-LLM's loop) a step's tokens
reach their clients when the next step ends if that one computes prompt tokens. Tiny scenarios
computed by hand (1 s per step), and which stack version plans so by default.

The engine against the oracle under async scheduling, with and without output lag, on random
workloads of every policy: tests/test_engines.py::test_random_workloads_async_scheduling.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import UnitCost, run, token_times

from simulator.cli.main import main
from simulator.config import RunConfig
from simulator.deploy.backends import async_by_default
from simulator.errors import InputError
from simulator.run.simulate import simulate
from workloads import Workload


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_arrival_mid_step_waits_one_step_longer(async_scheduling: bool) -> None:
    # A (4 prompt, 6 out) arrives at 0 and runs alone: its prefill is [0, 1), its decodes [1, 2), ...
    # B (4, 2) arrives at 1.5, while [1, 2) runs. In step: the step from 2 is planned at 2 and takes
    # B, whose first token comes at 3. Planned ahead: the step from 2 was planned at 1, before B
    # arrived; B's prefill is the step from 3, its first token at 4.
    result, _ = run("chunked", [0.0, 1.5], [4, 4], [6, 2], async_scheduling=async_scheduling)
    b = result.requests[1]
    assert token_times(result, 0) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    first = 4.0 if async_scheduling else 3.0
    assert b.scheduled == first - 1.0
    assert token_times(result, 1) == [first, first + 1.0]
    assert b.first_token - b.arrival == pytest.approx(first - 1.5)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_arrival_as_a_step_starts_is_not_in_the_step_planned_then(async_scheduling: bool) -> None:
    # B arrives at 1, the instant the step [1, 2) starts. In step, that step is planned at 1 and
    # B's arrival, processed before the step boundary, is in it. Planned ahead: [1, 2) was planned
    # at 0, and [2, 3) at 1, as B arrived, without it (a client's next request, sent when the
    # reply that a step's start releases reaches it, cannot be in the plan made at that start).
    result, _ = run("chunked", [0.0, 1.0], [4, 4], [6, 1], async_scheduling=async_scheduling)
    b = result.requests[1]
    assert b.first_token == (4.0 if async_scheduling else 2.0)


def test_an_idle_server_plans_at_the_arrival() -> None:
    # Nothing in flight: the scheduler is idle and plans the arrival's step at once, as in step.
    for async_scheduling in (False, True):
        result, _ = run("chunked", [0.0, 10.5], [4, 4], [2, 2], async_scheduling=async_scheduling)
        b = result.requests[1]
        assert (b.scheduled, b.first_token) == (10.5, 11.5)


def test_every_request_still_finishes_with_its_tokens() -> None:
    # A closed loop of 3 clients and an open loop: tokens emitted = tokens asked for, nobody lost.
    for kwargs in ({"concurrency": 3}, {"rate": 5.0}):
        result = simulate(RunConfig(policy="chunked", num_requests=40, input_len=300, output_len=40,
                                    async_scheduling=True, **kwargs))  # type: ignore[arg-type]
        requests = result.requests
        assert len(requests) == 40
        assert all(r.emitted == r.output_tokens for r in requests)


@pytest.mark.parametrize("output_lag", [False, True])
def test_tokens_wait_for_the_prefill_launched_after_their_step(output_lag: bool) -> None:
    # A (4 prompt, 5 out) arrives at 0, B (4, 2) at 0.5, C (4, 2) at 1.5. Steps, planned ahead:
    # [0, 1) A's prefill; [1, 2) A's decode (planned at 0, before B); [2, 3) B's prefill and A;
    # [3, 4) C's prefill, A and B; [4, 5) A and C decode. With lag, the tokens of [1, 2) wait for
    # the end of [2, 3) and those of [2, 3) (B's first among them) for the end of [3, 4), the
    # steps after them computing prompt tokens; those of [0, 1), [3, 4) and [4, 5) are followed by
    # a decode-only step or none, and arrive at their own step's end.
    result, _ = run("chunked", [0.0, 0.5, 1.5], [4, 4, 4], [5, 2, 2], async_scheduling=True, output_lag=output_lag)
    a, b, c = result.requests
    if output_lag:
        assert token_times(result, 0) == [1.0, 3.0, 4.0, 4.0, 5.0]
        assert token_times(result, 1) == [4.0, 4.0]
    else:
        assert token_times(result, 0) == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert token_times(result, 1) == [3.0, 4.0]
    assert token_times(result, 2) == [4.0, 5.0]
    assert b.first_token - b.arrival == (3.5 if output_lag else 2.5)
    assert (a.finish, b.finish, c.finish) == (5.0, 4.0, 5.0)


def test_a_finish_waits_for_the_prefill_launched_after_it() -> None:
    # A (4, 1) arrives at 0, B (4, 1) at 0.5. [0, 1) computes A's only token; A is done, so the
    # scheduler, idle at 1, plans B's prefill [1, 2) at once. With lag A's token and finish reach
    # its client when that prefill ends, at 2; B's, with nothing after them, at their own end.
    for output_lag, done in ((False, 1.0), (True, 2.0)):
        result, _ = run("chunked", [0.0, 0.5], [4, 4], [1, 1], async_scheduling=True, output_lag=output_lag)
        a, b = result.requests
        assert (a.first_token, a.finish) == (done, done)
        assert (b.first_token, b.finish) == (2.0, 2.0)


def test_a_closed_loop_client_sends_when_the_finish_reaches_it() -> None:
    # Three clients, at most two running: A (4 prompt, 1 out), B (4, 3), C (4, 2), then D (4, 1)
    # when a reply comes. [0, 1) prefills A and B (A done); [1, 2) prefills C beside B's decode.
    # Without lag A's reply comes at 1 and D, sent then, misses the plans made at 1 and 2: [2, 3)
    # decodes B and C (both done), [3, 4) prefills D. With lag the outputs of [0, 1) (A's finish,
    # B's first token) wait for the end of the prefill [1, 2): D is sent at 2; [2, 3) decodes
    # only, so C's first token comes at 2; B's and C's finishes wait for D's prefill [3, 4).
    workload = Workload(np.array([4, 4, 4, 4]), np.array([1, 3, 2, 1]), None, 3)
    expected = {False: [(0.0, 1.0, 1.0), (0.0, 1.0, 3.0), (0.0, 2.0, 3.0), (1.0, 4.0, 4.0)],
                True: [(0.0, 2.0, 2.0), (0.0, 2.0, 4.0), (0.0, 2.0, 4.0), (2.0, 4.0, 4.0)]}
    for output_lag, times in expected.items():
        result = simulate(RunConfig(policy="chunked", max_num_seqs=2, async_scheduling=True, output_lag=output_lag),
                          workload, UnitCost())
        assert [(r.arrival, r.first_token, r.finish) for r in result.requests] == times


def test_output_lag_needs_async_scheduling() -> None:
    with pytest.raises(InputError, match="--output-lag needs --async-scheduling"):
        RunConfig(output_lag=True)


@pytest.mark.parametrize(("backend", "version", "expected"), [
    ("vllm", "0.12.0", False), ("vllm", "0.11.2", False), ("vllm", "0.13.0", False),
    ("vllm", "0.14.0", True), ("vllm", "0.16.0", True), ("vllm", "0.18.0", True), ("vllm", None, True),
    ("sglang", "0.5.1.post1", True), ("sglang", "0.5.9", True), ("trtllm", "1.0.0rc3", True),
    ("trtllm", "1.2.0rc6.post1", True),
])
def test_which_versions_plan_ahead_by_default(backend: str, version: str | None, expected: bool) -> None:
    """vLLM from 0.14.0 (its release notes), SGLang 0.5 and TensorRT-LLM 1.x throughout; a row with no
    version is taken as the stock one's (vLLM 0.19)."""
    assert async_by_default(backend, version) is expected


def test_backend_turns_it_on_and_the_flag_turns_it_off(tmp_path: object) -> None:
    def planned_ahead(*args: str) -> bool:
        out = tmp_path / "-".join(args or ("plain",))  # type: ignore[operator]
        result = CliRunner().invoke(main, ["--rate", "5", "--num-requests", "20", "--out", str(out), *args])
        assert result.exit_code == 0, result.output
        return bool(json.loads((out / "summary.json").read_text())["settings"]["async_scheduling"])

    assert not planned_ahead()
    assert planned_ahead("--backend", "trtllm")
    assert not planned_ahead("--backend", "trtllm", "--no-async-scheduling")
    assert planned_ahead("--async-scheduling")


def test_trtllm_lags_its_outputs_by_default(tmp_path: object) -> None:
    def lagged(*args: str) -> bool:
        out = tmp_path / "-".join(args)  # type: ignore[operator]
        result = CliRunner().invoke(main, ["--rate", "5", "--num-requests", "20", "--out", str(out), *args])
        assert result.exit_code == 0, result.output
        return bool(json.loads((out / "summary.json").read_text())["settings"]["output_lag"])

    assert lagged("--backend", "trtllm")
    assert not lagged("--backend", "vllm") and not lagged("--backend", "sglang")
    assert not lagged("--backend", "trtllm", "--no-output-lag")
    assert not lagged("--backend", "trtllm", "--no-async-scheduling")
    assert lagged("--backend", "sglang", "--output-lag") and lagged("--async-scheduling", "--output-lag")
