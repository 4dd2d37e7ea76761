"""Async scheduling (vLLM's `--async-scheduling`, SGLang's and TensorRT-LLM's overlap scheduler):
each step is planned while the one before it runs, so a request that arrives after a step started
joins the step after the next. Tiny scenarios computed by hand (1 s per step), and which stack
version plans so by default.

The engine against the oracle under async scheduling, on random workloads of every policy:
tests/test_engines.py::test_random_workloads_async_scheduling.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import run, token_times

from simulator.cli.main import main
from simulator.config import RunConfig
from simulator.deploy.backends import async_by_default
from simulator.run.simulate import simulate


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
