"""The policy registry: a policy is one module and one registry line, and what it reads (its
`SETTINGS`) is all the config needs to refuse a setting it would ignore. Shortest prompt first,
written that way over chunked prefill's admission-order hook, against the oracle and by hand."""

from __future__ import annotations

import ast
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import run, token_times
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import simulate_cli
from test_engines import ENGINE_EXAMPLES, assert_identical, check_random_case
from test_fleet import assert_same_fleet
from test_prefix_cache import check_caching_case
from test_properties import SETTINGS, cases

import policies
from policies.continuous import ContinuousBatching
from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.fleet.routers import ROUTERS
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
SPF = "shortest-prompt-first"


def test_every_policy_reads_only_run_settings() -> None:
    for name, module in policies.POLICIES.items():
        assert module.SETTINGS, name
        assert set(module.SETTINGS) <= set(RunConfig.field_names()), name


def test_no_policy_imports_the_config() -> None:
    """The config asks the registry which settings each policy reads, so the policies sit below it."""
    for path in (ROOT / "policies").glob("*.py"):
        imported = {node.module for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom)}
        assert "simulator.config" not in imported, path.name


def test_a_policy_registered_in_one_line_gets_the_unused_settings_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module reading only the token budget: its registry line alone makes the config refuse the
    settings it ignores, and hold it to vLLM's budget rule."""
    module = types.SimpleNamespace(SETTINGS=("max_num_batched_tokens",),
                                   build=lambda s: ContinuousBatching(s.max_num_seqs, s.max_num_batched_tokens))
    monkeypatch.setitem(policies.POLICIES, "budget-only", module)  # type: ignore[arg-type]
    assert RunConfig(policy="budget-only", max_num_batched_tokens=4096).unused_settings() == []
    config = RunConfig(policy="budget-only", max_batch_size=8, long_prefill_token_threshold=64, priority_levels=2)
    assert config.unused_settings() == ["long_prefill_token_threshold", "max_batch_size", "priority_levels"]
    with pytest.raises(InputError, match="--max-num-batched-tokens 8 must be >= --max-num-seqs 16"):
        RunConfig(policy="budget-only", max_num_batched_tokens=8, max_num_seqs=16)


def test_an_unknown_policy_is_refused_with_the_registered_names() -> None:
    names = ", ".join(policies.POLICIES)
    with pytest.raises(InputError, match=f"^unknown policy 'fifo' \\(choose from {names}\\)$"):
        RunConfig(policy="fifo")
    assert names.endswith(SPF)


def test_shortest_prompt_first_reads_what_chunked_prefill_reads() -> None:
    assert RunConfig(policy=SPF, max_num_batched_tokens=4096, long_prefill_token_threshold=64).unused_settings() == []
    assert RunConfig(policy=SPF, max_queue_delay=0.5, priority_levels=3).unused_settings() == [
        "max_queue_delay", "priority_levels"]
    with pytest.raises(InputError, match="--max-num-batched-tokens 1 must be >= --max-num-seqs 2"):
        RunConfig(policy=SPF, max_num_seqs=2, max_num_batched_tokens=1)


@pytest.mark.parametrize(("args", "named"), [
    (["--max-batch-size", "8"], "--max-batch-size"),
    (["--priority-levels", "3"], "--priority-levels"),
])
def test_the_command_line_refuses_what_shortest_prompt_first_ignores(args: list[str], named: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, _, err = simulate_cli(["--policy", SPF, *args, "--num-requests", "5", "--out", str(out)], capsys)
    assert code == 2 and err.strip() == f"error: --policy {SPF} does not use {named}", err
    assert not out.exists()


def test_shortest_prompt_first_admits_the_shortest_waiting_prompt_first() -> None:
    """Three requests wait at t=0 with prompts of 300, 100 and 200 tokens, 2 output tokens each; one
    sequence at a time and 1 s steps. Each runs a prefill step (its first token) and a decode step,
    so the first tokens come at 1, 3 and 5 s: 100 first, then 200, then 300. Chunked prefill, same
    settings, serves them as they queued."""
    result, cost = run(SPF, [0.0, 0.0, 0.0], [300, 100, 200], [2, 2, 2], max_num_seqs=1)
    assert [token_times(result, i) for i in range(3)] == [[5.0, 6.0], [1.0, 2.0], [3.0, 4.0]]
    assert [shape.prefill_tokens for shape in cost.shapes] == [100, 0, 200, 0, 300, 0]
    result, _ = run("chunked", [0.0, 0.0, 0.0], [300, 100, 200], [2, 2, 2], max_num_seqs=1)
    assert [token_times(result, i)[0] for i in range(3)] == [1.0, 3.0, 5.0]


def test_shortest_prompt_first_breaks_ties_in_queue_order_and_chunks_the_last_admission() -> None:
    """Budget 150, 1 output token each, three prompts at t=0: 300, then two of 100 (ids 1 and 2).
    Step 1 admits id 1 whole (its token at 1 s) and the first 50 tokens of id 2 (tie: queue order);
    step 2 finishes id 2 (2 s) and starts the 300 with the 100 tokens left, which then takes 150
    and 50 (4 s)."""
    result, cost = run(SPF, [0.0, 0.0, 0.0], [300, 100, 100], [1, 1, 1], max_num_batched_tokens=150,
                       max_num_seqs=4)
    assert [token_times(result, i) for i in range(3)] == [[4.0], [1.0], [2.0]]
    assert [shape.prefill_tokens for shape in cost.shapes] == [150, 150, 150, 50]


@settings(SETTINGS, max_examples=ENGINE_EXAMPLES)
@given(data=st.data(), limit=st.none() | st.floats(0.05, 0.95), unit_cost=st.booleans(), integer_times=st.booleans())
def test_shortest_prompt_first_matches_the_oracle(data: st.DataObject, limit: float | None, unit_cost: bool,
                                                  integer_times: bool) -> None:
    """test_engines' random cases (squeezed KV, tight budgets, time limits, ties) for this policy."""
    check_random_case(SPF, data, limit, unit_cost, integer_times)


@settings(SETTINGS, max_examples=ENGINE_EXAMPLES // 2)
@given(data=st.data())
def test_shortest_prompt_first_matches_the_oracle_with_prefix_caching(data: st.DataObject) -> None:
    """Sorting reads every waiting request, so every one is looked up in the prefix cache first."""
    check_caching_case(SPF, data)


@settings(SETTINGS, max_examples=20)
@given(data=st.data(), num_replicas=st.integers(2, 3), router=st.sampled_from(ROUTERS))
def test_a_shortest_prompt_first_fleet_matches_the_oracle(data: st.DataObject, num_replicas: int,
                                                          router: str) -> None:
    case = data.draw(cases(SPF))
    assert_same_fleet(replace(case.config, num_replicas=num_replicas, router=router), case.workload)


def test_shortest_prompt_first_on_a_loaded_server_matches_the_oracle() -> None:
    """A queue builds up: short prompts overtake, so the median TTFT falls below chunked prefill's
    FCFS one and the tail rises above it."""
    config = RunConfig(policy=SPF, rate=14.0, num_requests=600, input_len_dist="lognormal", output_len_dist="uniform")
    summary = assert_identical(config)
    fcfs = summarize_run(replace(config, policy="chunked"))
    assert summary["completed"] == 600
    assert summary["median_ttft"] < fcfs["median_ttft"] and summary["p99_ttft"] > fcfs["p99_ttft"]


def summarize_run(config: RunConfig) -> dict[str, Any]:
    result = simulate(config)
    return summarize(result, build_tables(result))
