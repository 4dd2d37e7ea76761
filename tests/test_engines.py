"""The engine against the test oracle (tests/oracle.py): identical tables, to the last bit.

Every comparison is `DataFrame.equals` on the requests, tokens and steps tables (float columns
compared exactly, NaN/null in the same places), plus the summary and the end of the clock. Nothing
in the engine may sum floats in another order than the oracle does, so nothing here has a
tolerance. The random cases are test_properties' (every policy, open and closed loop, squeezed KV
so preemption happens, tight budgets and sequence limits, ties between arrivals and step ends),
with a time limit half of the time and sometimes a unit (1 s) step cost, which puts every step end
on the integers and makes ties with integer arrival times the rule rather than the exception.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from helpers import AZURE, UnitCost, needs_azure
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import run_oracle
from test_properties import SETTINGS, cases

from simulator.config import RunConfig
from simulator.cost import RooflineCost, StepShape
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.engine import stretch
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, describe, summarize
from simulator.metrics.tokens import describe_histogram
from simulator.run.simulate import simulate
from workloads import Workload

# Raise for a deeper search: SERVESIM_ENGINE_EXAMPLES=2000 python -m pytest tests/test_engines.py
ENGINE_EXAMPLES = int(os.environ.get("SERVESIM_ENGINE_EXAMPLES", "120"))
POLICIES = ["static", "continuous", "chunked", "priority"]


def both(config: RunConfig, workload: Workload | None = None, cost: type | None = None) -> list[Any]:
    """(tables, summary, end time) from the oracle and the engine, or the error each raised."""
    outcomes: list[Any] = []
    for engine in (run_oracle, None):
        try:
            result = simulate(config, workload, cost() if cost is not None else None, engine)
        except InputError as error:
            outcomes.append((type(error), str(error)))
            continue
        tables = build_tables(result)
        outcomes.append((tables, summarize(result, tables), result.end_time, result.log.num_tokens_alone))
    return outcomes


def assert_identical(config: RunConfig, workload: Workload | None = None, cost: type | None = None,
                     may_fail: bool = False) -> dict[str, Any]:
    """Both outcomes are the same; a run that errs must err identically, and is only allowed to
    when `may_fail` (random cases)."""
    oracle, engine = both(config, workload, cost)
    if isinstance(oracle[0], type):
        assert engine == oracle  # the same error, word for word
        assert may_fail, f"both raised {oracle}"
        return {}
    for name in ("requests", "tokens", "steps"):
        ours, theirs = getattr(engine[0], name), getattr(oracle[0], name)
        assert ours.equals(theirs), f"{name} differ:\n{ours}\n{theirs}"
    for key, value in oracle[1].items():
        mine = engine[1][key]
        assert mine == value or (isinstance(value, float) and math.isnan(value) and math.isnan(mine)), key
    assert engine[2] == oracle[2]
    # The engine logs one single token per prefill completion, the rest as runs.
    assert engine[3] <= oracle[3]
    return oracle[1]


@pytest.mark.parametrize("run_min", [1, stretch.RUN_MIN], ids=["every-stretch-as-arrays", "default-stretches"])
@pytest.mark.parametrize("policy", POLICIES)
@settings(SETTINGS, max_examples=ENGINE_EXAMPLES)
@given(data=st.data(), limit=st.none() | st.floats(0.05, 0.95), unit_cost=st.booleans(), integer_times=st.booleans())
def test_random_workloads(policy: str, run_min: int, data: st.DataObject, limit: float | None, unit_cost: bool,
                          integer_times: bool) -> None:
    """`run_min` 1 prices every decode stretch, however short, as arrays."""
    default, stretch.RUN_MIN = stretch.RUN_MIN, run_min
    try:
        check_random_case(policy, data, limit, unit_cost, integer_times)
    finally:
        stretch.RUN_MIN = default


def check_random_case(policy: str, data: st.DataObject, limit: float | None, unit_cost: bool,
                      integer_times: bool, extra: dict[str, Any] | None = None) -> None:
    """`extra`: `RunConfig` fields the case runs with beyond its own (under speculative decoding
    a squeezed KV cache is given the blocks its verify steps' draft tokens take beyond the longest
    request)."""
    case = data.draw(cases(policy))
    workload = case.workload
    if unit_cost and integer_times and workload.arrival is not None:
        workload = replace(workload, arrival=np.floor(workload.arrival * 1000 / max(1.0, workload.arrival[-1])))
    if policy == "priority":
        levels = data.draw(st.integers(1, 4))
        workload = replace(workload, priority=np.array(
            data.draw(st.lists(st.integers(0, levels - 1), min_size=workload.num_requests,
                               max_size=workload.num_requests)), dtype=np.int64))
    config = case.config
    if extra is not None:
        config = replace(config, **extra)
        if config.num_gpu_blocks_override is not None and config.num_speculative_tokens:
            extra = -(-config.num_speculative_tokens // config.block_size)  # type: ignore[operator]
            config = replace(config, num_gpu_blocks_override=config.num_gpu_blocks_override + extra)
    cost = UnitCost if unit_cost else None
    if limit is not None:
        try:
            full = simulate(config, workload, cost() if cost else None)
        except InputError:  # refused: both engines must refuse it alike (below)
            full = None
        if full is not None:
            config = replace(config, time_limit=limit * full.end_time if full.end_time > 0 else 1.0)
    assert_identical(config, workload, cost, may_fail=True)


@pytest.mark.parametrize("policy", ["continuous", "chunked", "priority"])
@settings(SETTINGS, max_examples=max(ENGINE_EXAMPLES // 3, 10))
@given(data=st.data(), limit=st.none() | st.floats(0.05, 0.95), unit_cost=st.booleans(),
       method=st.sampled_from(["ngram", "eagle"]), k=st.integers(1, 6),
       acceptance=st.sampled_from(["0", "1", "0.7", "0.9,0.5", "0.3,1,0.6,0.8,0.2,0.9"]))
def test_random_workloads_speculating(policy: str, data: st.DataObject, limit: float | None, unit_cost: bool,
                                      method: str, k: int, acceptance: str) -> None:
    """Speculative decoding on the random cases: verify steps, their draws, KV and preemptions as the
    oracle's literal walk gives them (a list of probabilities is used when it has k of them)."""
    if "," in acceptance and len(acceptance.split(",")) != k:
        acceptance = acceptance.split(",")[0]
    speculation = {"speculative_method": method, "num_speculative_tokens": k, "spec_acceptance": acceptance}
    check_random_case(policy, data, limit, unit_cost, False, speculation)


@pytest.mark.parametrize(("policy", "like"), [("inflight", "continuous"), ("prefill-first", "chunked")])
@settings(SETTINGS, max_examples=max(ENGINE_EXAMPLES // 2, 10))
@given(data=st.data(), unit_cost=st.booleans())
def test_stack_policies_on_random_workloads(policy: str, like: str, data: st.DataObject, unit_cost: bool) -> None:
    """TensorRT-LLM's in-flight and SGLang's prefill-first policies, on the random cases of the
    policies whose settings fit them (`tests/test_stack_policies.py`): the oracle's tables."""
    case = data.draw(cases(like))
    assert_identical(replace(case.config, policy=policy), case.workload, UnitCost if unit_cost else None,
                     may_fail=True)


@pytest.mark.parametrize("case", [
    dict(policy="chunked", rate=20.0, input_len=300, output_len=60, output_len_dist="uniform",
         num_gpu_blocks_override=300, speculative_method="eagle", num_speculative_tokens=4, spec_acceptance="0.7"),
    dict(policy="continuous", rate=20.0, input_len=300, output_len=60, output_len_dist="uniform",
         num_gpu_blocks_override=300, speculative_method="ngram", num_speculative_tokens=3, spec_acceptance="0"),
    dict(policy="priority", rate=20.0, input_len=300, output_len=60, priority_levels=3, num_gpu_blocks_override=250,
         speculative_method="eagle", num_speculative_tokens=3, spec_acceptance="0.9,0.5,0.3"),
    dict(policy="chunked", rate=20.0, input_len=300, output_len=60, prefix_len=200, num_prefixes=3,
         num_gpu_blocks_override=300, speculative_method="eagle", num_speculative_tokens=5, spec_acceptance="0.8"),
    dict(policy="chunked", rate=3.0, input_len=300, output_len=60, num_turns=3, think_time=0.1,
         num_gpu_blocks_override=200, speculative_method="ngram", num_speculative_tokens=2, spec_acceptance="1"),
    dict(policy="chunked", concurrency=16, input_len=300, output_len=60, output_len_dist="uniform",
         num_gpu_blocks_override=300, speculative_method="eagle", num_speculative_tokens=4, spec_acceptance="0.6"),
    dict(policy="chunked", rate=20.0, input_len=300, output_len=60, cost="measured",
         speculative_method="eagle", num_speculative_tokens=3, spec_acceptance="0.7"),
    dict(policy="chunked", rate=20.0, input_len=300, output_len=60, prefix_len=200, num_prefixes=12,
         num_gpu_blocks_override=120, kv_offload_gb=0.05, speculative_method="eagle", num_speculative_tokens=3,
         spec_acceptance="0.8"),
], ids=["eagle-preempting", "ngram-none-accepted", "priority-per-position", "prefix-cache", "sessions",
        "closed-loop", "measured-cost", "with-a-host-tier"])
def test_speculative_decoding(case: dict[str, Any]) -> None:
    """Speculative decoding with preemption, priorities, a prefix cache, sessions and the measured
    costs: the same tables, and the same acceptance metrics, as the oracle's."""
    summary = assert_identical(RunConfig(num_requests=150, **case))
    assert summary["completed"] == 150 and summary["spec_num_drafts"] > 0
    if "kv_offload_gb" in case:  # both features at once: hits come back from the host tier too
        assert summary["prefix_cache_host_hit_tokens"] > 0
    if case.get("num_gpu_blocks_override") == 300 and case["policy"] != "chunked":
        assert summary["preemptions"] > 0


# The benchmark's workloads (benchmarks/engine_speed.py), 2,000 requests each.
BENCHMARK = {
    "a-chunked-c64": dict(policy="chunked", concurrency=64),
    "b-static-r12": dict(policy="static", rate=12.0),
    "b-continuous-r12": dict(policy="continuous", rate=12.0),
    "b-chunked-r12": dict(policy="chunked", rate=12.0),
    "b-priority-r12": dict(policy="priority", rate=12.0, priority_levels=3),
}


@pytest.mark.parametrize("case", list(BENCHMARK))
def test_benchmark_workloads(case: str) -> None:
    summary = assert_identical(RunConfig(num_requests=2000, **BENCHMARK[case]))
    assert summary["completed"] == 2000
    if case == "b-continuous-r12":
        assert summary["preemptions"] > 0  # overloaded: the exact (order-walking) path is exercised


@needs_azure
def test_azure_trace() -> None:
    summary = assert_identical(RunConfig(policy="chunked", trace=str(AZURE), num_requests=3000))
    assert summary["completed"] == 3000


def test_measured_cost_model() -> None:
    """The measured-kernel model records where it extrapolated; both engines ask it the same steps."""
    summary = assert_identical(RunConfig(policy="chunked", cost="measured", rate=14.0, num_requests=600,
                                         input_len_dist="uniform", output_len_dist="uniform"))
    assert summary["cost_extrapolations"] > 0


def test_engine_keeps_runs_not_tokens() -> None:
    """Memory grows with requests, not tokens: one single token (the first) per request, one run for
    the rest, in workload (a)."""
    result = simulate(RunConfig(policy="chunked", concurrency=64, num_requests=2000))
    log = result.log
    assert log.num_tokens_alone == 2000
    assert log.num_runs == 2000
    assert int(log.column("run_count").sum()) + log.num_tokens_alone == 2000 * 300


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "tiny"]), gpu=st.sampled_from(["h100_sxm", "h200_sxm"]),
       num_seqs=st.integers(1, 2048), contexts=st.lists(st.integers(1, 2**31), min_size=1, max_size=50))
def test_decode_step_times_are_step_time_bit_for_bit(model: str, gpu: str, num_seqs: int,
                                                     contexts: list[int]) -> None:
    """The array path prices quiet stretches with `decode_step_times`; it must be `step_time` exactly."""
    cost = RooflineCost(load_model(model), load_gpu(gpu))
    at_once = cost.decode_step_times(num_seqs, np.array(contexts, dtype=np.int64))
    one_by_one = [cost.step_time(StepShape(num_seqs, num_seqs, c)) for c in contexts]
    assert at_once.tolist() == one_by_one


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=30),
       counts=st.lists(st.integers(1, 50), min_size=30, max_size=30),
       qs=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=4))
def test_histogram_statistics_match_the_expanded_sample(values: list[float], counts: list[int],
                                                        qs: list[float]) -> None:
    distinct = np.unique(np.array(values))
    weights = np.array(counts[: len(distinct)], dtype=np.int64)
    expanded = np.repeat(distinct, weights)
    mine = describe_histogram(distinct, weights, tuple(qs))
    numpy = describe(expanded, tuple(qs))
    for key, value in numpy.items():
        assert mine[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_cost_type_is_respected() -> None:
    """A cost model the test owns is the one both engines call, step by step (its array form is
    UnitCost's, which prices through `step_time`)."""
    counted: list[int] = []

    class Counting(UnitCost):
        def step_time(self, shape: Any) -> float:  # type: ignore[override]
            counted.append(shape.num_tokens)
            return 0.5

    config = RunConfig(policy="chunked", rate=20.0, num_requests=50, input_len=100, output_len=20)
    oracle, engine = both(config, None, Counting)
    assert oracle[0].steps["duration"].unique().to_list() == [0.5]
    assert engine[0].steps.equals(oracle[0].steps)
    # Not a pure model (it counts): both ask about exactly the steps they run.
    assert len(counted) == 2 * oracle[0].steps.height


@pytest.mark.parametrize("policy", [*POLICIES, "inflight", "prefill-first"])
@settings(SETTINGS, max_examples=max(ENGINE_EXAMPLES // 2, 10))
@given(data=st.data(), limit=st.none() | st.floats(0.05, 0.95), unit_cost=st.booleans(), integer_times=st.booleans(),
       output_lag=st.booleans())
def test_random_workloads_async_scheduling(policy: str, data: st.DataObject, limit: float | None, unit_cost: bool,
                                           integer_times: bool, output_lag: bool) -> None:
    """Async scheduling (each step planned while the one before it runs), with or without output
    lag, on the random cases, the stack policies' on the cases of the policies whose settings fit
    them: the oracle's tables, whose server holds every request that arrived after the last step
    started out of the waiting queue one step longer, holds each step's first tokens and finishes
    until it knows the next step, and takes every step alone."""
    like = {"inflight": "continuous", "prefill-first": "chunked"}.get(policy, policy)
    check_random_case(like, data, limit, unit_cost, integer_times,
                      {"async_scheduling": True, "output_lag": output_lag, "policy": policy})
