"""Property tests: invariants every policy must keep on any small workload and any settings.

Hypothesis draws explicit workloads (1-40 requests, prompts 1-3000 tokens, outputs 1-200, open
loop with arbitrary non-decreasing arrivals or a closed loop of 1-8 clients) and random settings
for each policy, sometimes with a KV cache just large enough for the longest request (sized by
`num_gpu_blocks_override` or by inverting the memory formula through `gpu_memory_utilization`),
so preemption by recompute happens. Every run is then checked against the same invariants.

Lengths are drawn on several scales (prompts up to 4, 64 or 3000 tokens) and budgets and
`max_num_seqs` are biased toward their lower bounds, so decode-heavy batches and tight limits are
common. To keep the file fast (~15 s), settings that would make thousands of steps per request are
bounded by the workload: chunked's token budget and long-prefill threshold are at least 1 but no
smaller than total prompt tokens / 400 (so a 1-token budget is only drawn for small workloads).
`continuous` needs a budget of at least the longest prompt + output - 1 (else InputError, tested
separately): a request preempted by recompute must fit prompt + emitted tokens in one unchunked step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.config import RunConfig
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, summarize
from simulator.metrics.tables import Tables
from simulator.run.result import RunResult
from simulator.run.simulate import simulate
from simulator.run.sizing import step_activation_bytes
from workloads import Workload

POLICIES = ("static", "continuous", "chunked")
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class Case:
    config: RunConfig
    workload: Workload
    small_kv_blocks: int | None
    """The KV blocks the case asked for when it squeezed memory (None: the default 0.9 of the GPU)."""


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n = draw(st.integers(1, 40))
    # Lengths on a few scales, so that tiny prompts (decode-heavy batches) are common too.
    longest_prompt = draw(st.sampled_from([4, 64, 3000]))
    longest_output = draw(st.sampled_from([4, 200]))
    prompts = np.array(draw(st.lists(st.integers(1, longest_prompt), min_size=n, max_size=n)), dtype=np.int64)
    outputs = np.array(draw(st.lists(st.integers(1, longest_output), min_size=n, max_size=n)), dtype=np.int64)
    if draw(st.booleans()):
        return Workload(prompt_tokens=prompts, output_tokens=outputs, arrival=None,
                        concurrency=draw(st.integers(1, 8)))
    # Steps last ~10 us (tiny model) to ~100 ms (Llama prefill): gaps on several scales, many ties.
    scale = draw(st.sampled_from([1e-4, 1e-2, 0.3]))
    gaps = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.0, 1.0)), min_size=n, max_size=n))
    arrival = np.cumsum(np.array(gaps) * scale)
    return Workload(prompt_tokens=prompts, output_tokens=outputs, arrival=arrival, concurrency=None)


@st.composite
def cases(draw: st.DrawFn, policy: str) -> Case:
    workload = draw(workloads())
    prompts, outputs = workload.prompt_tokens, workload.output_tokens
    longest = int((prompts + outputs).max())
    floor = max(1, int(prompts.sum()) // 400)
    model = draw(st.sampled_from(["llama-3.1-8b", "tiny"]))
    block_size = draw(st.sampled_from([1, 16, 32]))
    kv = draw(st.sampled_from(["ample", "override", "utilisation"]))
    settings_: dict[str, object] = {"policy": policy, "model": model, "block_size": block_size,
                                    "max_num_seqs": draw(st.integers(1, 64) | st.integers(1, 4))}
    if policy == "static":
        settings_["max_batch_size"] = draw(st.integers(1, 16))
        settings_["max_queue_delay"] = draw(st.one_of(st.just(0.0), st.floats(0.0, 0.2)))
    elif policy == "continuous":
        # Without chunking a recomputed request needs prompt + emitted tokens in one step, up to
        # prompt + output - 1: a run refuses a smaller budget at the start (else a preemption stalls it).
        low = max(longest - 1, 1)
        settings_["max_num_batched_tokens"] = draw(st.integers(low, low + 4096) | st.integers(low, low + 8))
    else:
        settings_["max_num_batched_tokens"] = draw(st.integers(floor, max(floor, 4096)) | st.integers(floor, floor + 8))
        settings_["long_prefill_token_threshold"] = draw(st.just(0) | st.integers(floor, 4096)
                                                         | st.integers(floor, floor + 8))
    if policy != "static":  # vLLM's rule: the budget must cover a decode step of every sequence
        settings_["max_num_seqs"] = min(settings_["max_num_seqs"], settings_["max_num_batched_tokens"])  # type: ignore[type-var]
    config = RunConfig(**settings_)  # type: ignore[arg-type]
    small: int | None = None
    if kv != "ample":
        # Just enough for the longest request, and sometimes a few blocks more.
        small = blocks_for(longest, block_size) + draw(st.integers(0, 3) | st.integers(0, 200))
        if kv == "override":
            config = replace(config, num_gpu_blocks_override=small)
        else:
            config = replace(config, gpu_memory_utilization=utilisation_for(config, workload, small))
    return Case(config, workload, small)


def utilisation_for(config: RunConfig, workload: Workload, blocks: int) -> float:
    """The gpu_memory_utilization that leaves exactly `blocks` KV blocks (half a block of slack)."""
    model, gpu = load_model(config.model), load_gpu(config.gpu)
    activations = step_activation_bytes(config, model, int(workload.prompt_tokens.max()))
    block_bytes = model.kv_bytes_per_token * config.block_size
    return (model.weight_bytes + activations + (blocks + 0.5) * block_bytes) / gpu.memory_bytes


def run(case: Case) -> tuple[RunResult, Tables, dict[str, Any]]:
    result = simulate(case.config, case.workload)
    tables = build_tables(result)
    summary = summarize(result, tables)
    event(f"{case.config.policy}: {'preempted' if summary['preemptions'] else 'no preemption'}")
    event(f"{case.config.policy}: {'closed' if case.workload.arrival is None else 'open'} loop, "
          f"{'small' if case.small_kv_blocks else 'ample'} KV")
    if tables.steps.height:
        event(f"max running {int(tables.steps['num_running'].max())}")  # type: ignore[arg-type]
    return result, tables, summary


def check_invariants(case: Case, result: RunResult, tables: Tables, summary: dict[str, Any]) -> None:
    config, workload = case.config, case.workload
    n = workload.num_requests
    requests, tokens, steps = tables.requests, tables.tokens, tables.steps
    if case.small_kv_blocks is not None:
        assert result.kv_blocks == case.small_kv_blocks

    # Everyone arrives, is served and finishes with all its tokens (no time limit).
    assert len(result.requests) == n == requests.height
    assert summary["completed"] == n and summary["unfinished"] == 0
    assert requests["finished"].all()
    np.testing.assert_array_equal(requests["request_id"].to_numpy(), np.arange(n))
    np.testing.assert_array_equal(requests["prompt_tokens"].to_numpy(), workload.prompt_tokens)
    np.testing.assert_array_equal(requests["output_tokens"].to_numpy(), workload.output_tokens)
    np.testing.assert_array_equal(requests["emitted_tokens"].to_numpy(), workload.output_tokens)
    assert all(r.emitted == r.output_tokens for r in result.requests)

    # Arrivals: as given (open loop), or each new client request at an earlier one's finish.
    arrival = requests["arrival"].to_numpy()
    finish = requests["finish"].to_numpy()
    if workload.arrival is not None:
        np.testing.assert_array_equal(arrival, workload.arrival)
    else:
        c = min(workload.concurrency or 0, n)
        assert (arrival[:c] == 0.0).all()
        np.testing.assert_array_equal(arrival[c:], np.sort(finish)[: n - c])

    # Timestamps in order; first scheduling is first-come first-served.
    scheduled = requests["scheduled"].to_numpy()
    first_token = requests["first_token"].to_numpy()
    assert (arrival <= scheduled).all() and (scheduled < first_token).all() and (first_token <= finish).all()
    assert (np.diff(scheduled) >= 0).all(), "requests were first scheduled out of arrival order"

    # The token trace: output_tokens rows per request, indexed 0..n-1, strictly later each time;
    # first_token and finish are its first and last times.
    counts = tokens.group_by("request_id").len().sort("request_id")
    np.testing.assert_array_equal(counts["request_id"].to_numpy(), np.arange(n))
    np.testing.assert_array_equal(counts["len"].to_numpy(), workload.output_tokens)
    token_request = tokens["request_id"].to_numpy()
    token_index = tokens["index"].to_numpy()
    token_time = tokens["time"].to_numpy()
    assert (np.diff(token_request) >= 0).all()
    bounds = np.r_[0, np.cumsum(workload.output_tokens)]
    for i in range(n):
        index = token_index[bounds[i]:bounds[i + 1]]
        times = token_time[bounds[i]:bounds[i + 1]]
        np.testing.assert_array_equal(index, np.arange(workload.output_tokens[i]))
        assert (np.diff(times) > 0).all(), f"request {i}: two tokens in one step or out of order"
        assert times[0] == first_token[i] and times[-1] == finish[i], i
    itl = summary["mean_itl"]
    assert itl is None or itl > 0

    # Steps: back to back at most, never overlapping, none empty; within KV and batch limits.
    start = steps["start"].to_numpy()
    duration = steps["duration"].to_numpy()
    assert (duration > 0).all() and (steps["num_seqs"].to_numpy() >= 1).all()
    assert (start[1:] >= start[:-1] + duration[:-1] - 1e-12).all()
    assert steps["kv_blocks_used"].max() <= result.kv_blocks  # type: ignore[operator]
    assert (steps["kv_blocks_used"].to_numpy() >= 0).all()
    real = steps["prefill_tokens"].to_numpy() + steps["decode_tokens"].to_numpy()
    num_seqs = steps["num_seqs"].to_numpy()
    if config.policy == "static":
        assert (num_seqs <= config.max_batch_size).all()
        assert (steps["padded_tokens"].to_numpy() >= 0).all()
    else:
        assert (steps["padded_tokens"].to_numpy() == 0).all()
        assert (num_seqs <= config.max_num_seqs).all()
        assert (real <= config.max_num_batched_tokens).all(), (
            f"a step computed {real.max()} tokens with --max-num-batched-tokens {config.max_num_batched_tokens}")
    if config.policy == "chunked" and config.long_prefill_token_threshold:
        # No single row computes more than the threshold (prefill rows have >= 2 tokens).
        assert (steps["prefill_tokens"].to_numpy()
                <= config.long_prefill_token_threshold * np.maximum(num_seqs, 1)).all()

    # Work conservation: each token of prompt and output (but the last) is computed once, plus
    # whatever preemption threw away.
    needed = int((workload.prompt_tokens + workload.output_tokens - 1).sum())
    preemptions = int(requests["preemptions"].sum())
    assert steps["num_preempted"].sum() == preemptions == summary["preemptions"]
    if preemptions == 0:
        assert int(real.sum()) == needed
    else:
        assert int(real.sum()) > needed
    # Static reserves in full and never preempts; nobody preempts when every request fits at once.
    if config.policy == "static" or result.kv_blocks >= sum(
            blocks_for(int(p + o), config.block_size)
            for p, o in zip(workload.prompt_tokens, workload.output_tokens, strict=True)):
        assert preemptions == 0


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(data=st.data())
def test_invariants(policy: str, data: st.DataObject) -> None:
    case = data.draw(cases(policy))
    check_invariants(case, *run(case))


@pytest.mark.parametrize("policy", POLICIES)
@settings(SETTINGS, max_examples=30)
@given(data=st.data())
def test_same_config_same_tables(policy: str, data: st.DataObject) -> None:
    case = data.draw(cases(policy))
    first = build_tables(simulate(case.config, case.workload))
    second = build_tables(simulate(case.config, case.workload))
    for name in ("requests", "tokens", "steps"):
        assert getattr(first, name).equals(getattr(second, name)), name


@pytest.mark.parametrize("policy", POLICIES)
@settings(SETTINGS, max_examples=50)
@given(data=st.data(), fraction=st.floats(0.01, 0.99))
def test_time_limit_truncates_the_same_run(policy: str, data: st.DataObject, fraction: float) -> None:
    """Stopping the clock at T reports exactly the full run's past: arrived = completed +
    unfinished, unfinished requests have no finish, and nothing before T changes."""
    case = data.draw(cases(policy))
    full, full_tables, _ = run(case)
    limit = fraction * full.end_time
    cut = replace(case, config=replace(case.config, time_limit=limit))
    result, tables, summary = run(cut)
    assert result.end_time == limit
    reqs = tables.requests
    assert summary["arrived"] == len(result.requests) == summary["completed"] + summary["unfinished"]  # type: ignore[operator]
    assert summary["completed"] == reqs["finished"].sum()
    unfinished = reqs.filter(~pl.col("finished"))
    assert unfinished["finish"].null_count() == unfinished.height
    assert (unfinished["emitted_tokens"] < unfinished["output_tokens"]).all()
    finished = reqs.filter(pl.col("finished"))
    assert (finished["finish"] <= limit).all()
    assert (reqs["arrival"] <= limit).all()

    # Causality: the cut run is the full run's prefix.
    full_arrival = full_tables.requests["arrival"].to_numpy()
    assert len(result.requests) >= int((full_arrival < limit).sum())
    for r in result.requests:
        f = full.requests[r.id]
        assert r.arrival == f.arrival
        for name in ("scheduled", "first_token", "finish"):
            mine, theirs = getattr(r, name), getattr(f, name)
            assert mine == theirs if not math.isnan(mine) else theirs >= limit, (r.id, name, mine, theirs)
        assert r.emitted <= f.emitted
    end = (full_tables.steps["start"] + full_tables.steps["duration"]).to_numpy()
    assert tables.steps.height in (int((end < limit).sum()), int((end <= limit).sum()))
    assert tables.steps.equals(full_tables.steps.head(tables.steps.height))
    assert tables.tokens.height == int((full_tables.tokens["time"] <= limit).sum()) or \
        tables.tokens.height == int((full_tables.tokens["time"] < limit).sum())


def test_a_budget_below_max_num_seqs_is_rejected() -> None:
    # Found by test_invariants[continuous]: with 2 sequences and a 1-token budget, a decode step of
    # both running requests computes 2 tokens. vLLM refuses such settings; so does servesim.
    with pytest.raises(InputError, match="--max-num-batched-tokens 1 must be >= --max-num-seqs 2"):
        RunConfig(policy="continuous", max_num_seqs=2, max_num_batched_tokens=1)
    assert RunConfig(policy="static", max_num_seqs=2, max_num_batched_tokens=1).max_num_seqs == 2


@SETTINGS
@given(workload=workloads(), data=st.data())
def test_continuous_rejects_a_prompt_over_the_token_budget(workload: Workload, data: st.DataObject) -> None:
    longest_prompt = int(workload.prompt_tokens.max())
    if longest_prompt == 1:
        return
    budget = data.draw(st.integers(1, longest_prompt - 1))
    with pytest.raises(InputError, match="max-num-batched-tokens"):
        simulate(RunConfig(policy="continuous", max_num_batched_tokens=budget, max_num_seqs=budget), workload)
    # Chunking the same prompt under the same budget is fine.
    floor = max(16, int(workload.prompt_tokens.sum()) // 400)
    chunk_budget = max(budget, floor)
    assert simulate(RunConfig(policy="chunked", max_num_batched_tokens=chunk_budget,
                              max_num_seqs=min(1024, chunk_budget)), workload).requests
