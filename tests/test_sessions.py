"""Multi-turn sessions (workloads.sessions, simulator.run.sessions): prompts that grow by the
conversation, turns sent a think time after the last answer, cached tokens equal to the context
before, and the engine against the oracle."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_engines import ENGINE_EXAMPLES, assert_identical
from test_properties import SETTINGS, cases

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.run.simulate import build_workload, simulate
from workloads.sessions import conversations

CONFIG = RunConfig(policy="chunked", concurrency=1, num_requests=20, num_turns=5, think_time=3.0, input_len=200,
                   output_len=60, input_len_dist="uniform:0.5", output_len_dist="uniform:0.5", seed=3)


def test_turn_k_finds_the_previous_turns_context() -> None:
    """One client, sessions of 5 turns: turn k's prompt is every earlier question and answer plus
    its own question (the lengths drawn for the same seed without sessions), and the cache holds
    all of the conversation before it but the last answer token (which has no KV), in whole
    16-token blocks."""
    questions = build_workload(replace(CONFIG, num_turns=1, think_time=0.0))
    asked, answered = questions.prompt_tokens.tolist(), questions.output_tokens.tolist()
    result = simulate(CONFIG)
    requests = result.requests
    assert requests.finish.size == 20 and not np.isnan(requests.finish).any()
    for i in range(20):
        turn, first = i % 5, i - i % 5
        context = sum(asked[j] + answered[j] for j in range(first, i))
        assert requests.prompt_tokens[i] == context + asked[i]
        assert requests.cached_tokens[i] == ((context - 1) // 16 * 16 if turn else 0)
        if turn:
            assert requests.arrival[i] == requests.finish[i - 1] + 3.0
        elif i:
            assert requests.arrival[i] == requests.finish[i - 1]  # the client's next session at once


def test_caching_shortens_later_turns() -> None:
    on, off = simulate(CONFIG), simulate(replace(CONFIG, enable_prefix_caching=False))
    later = np.arange(20) % 5 > 0
    ttft_on = (on.requests.first_token - on.requests.arrival)[later]
    ttft_off = (off.requests.first_token - off.requests.arrival)[later]
    assert (ttft_on < ttft_off).all()
    assert not off.requests.cached_tokens.any()


def test_open_loop_sessions_start_at_the_rate() -> None:
    """--rate counts sessions: the four sessions start at the plain workload's first four arrivals;
    every other request is a later turn, sent after some answer."""
    config = replace(CONFIG, concurrency=None, rate=2.0, num_requests=12, num_turns=3, think_time=0.5)
    plain = build_workload(replace(config, num_turns=1, think_time=0.0))
    assert plain.arrival is not None
    result = simulate(config)
    arrival, finish = result.requests.arrival, result.requests.finish
    starts = set(plain.arrival[:4].tolist())
    assert starts <= set(arrival.tolist())
    later = [a for a in arrival.tolist() if a not in starts]
    assert len(later) == 8 and all(any(a == f + 0.5 for f in finish.tolist()) for a in later)


@pytest.mark.parametrize(("settings_", "named"), [
    ({"think_time": 2.0}, "--think-time 2 needs --num-turns above 1"),
    ({"num_turns": 0}, r"--num-turns must be an integer in \[1, 2147483647\] turns, got 0"),
    ({"num_turns": 2, "think_time": -1.0}, r"--think-time must be a number in \[0, 1e\+07\] seconds, got -1.0"),
    ({"num_turns": 2, "rate": 1.0, "duration": 10.0}, "--num-turns counts --num-requests requests"),
])
def test_bad_session_settings(settings_: dict[str, object], named: str) -> None:
    with pytest.raises(InputError, match=named):
        RunConfig(**settings_)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
@settings(SETTINGS, max_examples=max(ENGINE_EXAMPLES // 2, 10))
@given(data=st.data(), turns=st.integers(2, 3), think=st.just(0.0) | st.floats(0.0, 2.0))
def test_engine_matches_oracle_in_sessions(policy: str, data: st.DataObject, turns: int, think: float) -> None:
    case = data.draw(cases(policy))
    workload = case.workload
    if workload.arrival is not None:
        workload = replace(workload, arrival=np.sort(workload.arrival))
    workload = conversations(workload, turns, think)
    summary = assert_identical(case.config, workload, may_fail=True)
    if summary:
        event(f"hit rate {'> 0' if summary['prefix_cache_hit_rate'] else '0'}")
