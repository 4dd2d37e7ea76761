"""One engine: SimPy drives every run, every policy runs through the same contract, the priority
policy behaves as vLLM's, and the tokens table streams in bounded chunks."""

from __future__ import annotations

import copy
import dataclasses
import gc
import importlib.util
import math
import pickle
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from helpers import UnitCost
from hypothesis import given
from hypothesis import strategies as st

import policies
from simulator.config import RunConfig
from simulator.cost.contract import StepShape, causal_pairs, decode_shape
from simulator.engine.clock import Clock
from simulator.engine.request import Request, RequestColumns
from simulator.engine.step import Policy, Step
from simulator.metrics.summary import build_tables
from simulator.metrics.tokens import TokensTable, token_chunks, tokens_table
from simulator.run.simulate import simulate
from workloads import Workload

ROOT = Path(__file__).resolve().parents[1]


def load_copy(module: str, name: str) -> object:
    """A fresh copy of a built-in policy module, imported under another name."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "policies" / f"{module}.py")
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    sys.modules[name] = copy
    spec.loader.exec_module(copy)
    return copy


@pytest.mark.parametrize("module", ["chunked", "continuous", "static", "priority"])
def test_a_copied_policy_module_gives_identical_tables(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = load_copy(module, f"copied_{module}")
    monkeypatch.setitem(policies.POLICIES, "copy", copy)  # type: ignore[arg-type]
    config = RunConfig(policy=module, rate=14.0, num_requests=300, input_len_dist="uniform", priority_levels=3)
    built_in = build_tables(simulate(config))
    copied = build_tables(simulate(RunConfig(**{**config.__dict__, "policy": "copy"})))
    for name in ("requests", "tokens", "steps"):
        assert getattr(copied, name).equals(getattr(built_in, name)), name


class Broken:
    """A built-in policy that raises when asked for a step (everything else as the policy's own). A
    wrapper, not a patched class: the compiled build's classes cannot be patched."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.scheduling = policy.scheduling
        self.prefix_hits = policy.prefix_hits

    def __call__(self, view: object) -> Step:
        raise RuntimeError("policy called")

    def max_step_tokens(self, longest_prompt: int) -> int:
        return self.policy.max_step_tokens(longest_prompt)

    def check_prompts(self, prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> None:
        self.policy.check_prompts(prompt_tokens, output_tokens)


def test_policies_decide_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that raises makes the run fail: nothing schedules behind the policy's back."""
    for name in ("chunked", "continuous", "static", "priority"):
        module = policies.POLICIES[name]
        broken = SimpleNamespace(SETTINGS=module.SETTINGS, build=lambda settings, module=module: Broken(
            module.build(settings)))
        monkeypatch.setitem(policies.POLICIES, "broken", broken)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="policy called"):
            simulate(RunConfig(policy="broken", rate=12.0, num_requests=20))
        monkeypatch.undo()


def test_a_default_run_is_driven_by_simpy(monkeypatch: pytest.MonkeyPatch) -> None:
    processed = 0
    step = Clock.step

    def counting(self: Clock) -> None:
        nonlocal processed
        processed += 1
        step(self)

    monkeypatch.setattr(Clock, "step", counting)
    result = simulate(RunConfig(rate=12.0))
    # Every instant a request finishes at is a step end the environment processes (a finish can
    # be seen there). A lone server takes its open loop's arrivals as its clock passes them
    # (`Server.feed`), so arrivals during a step are not events of their own.
    finishes = set(result.requests.finish.tolist())
    assert processed >= len(finishes) > 100
    assert processed < 2 * result.num_requests


@pytest.mark.parametrize("settings", [dict(policy="static"), dict(policy="continuous"), dict(policy="chunked"),
                                      dict(policy="priority", priority_levels=3),
                                      dict(policy="chunked", time_limit=60.0)])
def test_a_run_makes_no_cyclic_garbage_per_request(settings: dict[str, object]) -> None:
    """The clock pauses the cycle collector while it runs (simulator.engine.clock): that is safe only while
    a run's garbage is freed by reference counting, so the cycles a run leaves must not grow with it."""
    left = []
    for n in (1200, 4800):  # with the time limit, both are cut short with requests unfinished
        gc.collect()
        gc.disable()  # all the run, so that no automatic collection after the clock stops hides its cycles
        try:
            simulate(RunConfig(rate=12.0, num_requests=n, **settings))  # type: ignore[arg-type]
        finally:
            gc.enable()
        left.append(gc.collect())
    assert left[0] == left[1] < 100


def test_the_clock_gives_the_collector_back_as_it_found_it() -> None:
    def fails() -> object:
        assert not gc.isenabled()  # paused while the clock runs
        raise RuntimeError("a process failed")
        yield

    assert gc.isenabled()
    env = Clock()
    env.process(fails())
    with pytest.raises(RuntimeError, match="a process failed"):
        env.run()
    assert gc.isenabled()
    gc.disable()
    try:
        Clock().run()
        assert not gc.isenabled()  # a caller that had paused it finds it paused
    finally:
        gc.enable()


def test_a_new_request_starts_at_each_declared_default() -> None:
    # Request, Step and the stretch write their __init__ out (setup.py's compiled build would call
    # the one dataclass generates as Python): a field added later must start at its declared default.
    request = Request(7, 1.5, 100, 20, 2, content=((1, 100),))
    given = {"id": 7, "arrival": 1.5, "prompt_tokens": 100, "output_tokens": 20, "priority": 2,
             "content": ((1, 100),)}
    for f in dataclasses.fields(Request):
        value = getattr(request, f.name)
        expected = given.get(f.name, f.default)
        assert value == expected or (math.isnan(expected) and math.isnan(value)), f.name
    # Copied and pickled whole (a compiled class makes the object through its __init__ first).
    request.block_keys = [1, 2]
    for copied in (copy.deepcopy(request), pickle.loads(pickle.dumps(request))):
        assert all(getattr(copied, f.name) == getattr(request, f.name) or f.name in ("scheduled", "first_token",
                   "finish") for f in dataclasses.fields(Request))
        assert copied.block_keys == [1, 2] and copied.block_keys is not request.block_keys
    first, second = Step(), Step()
    assert first.tokens == {} and first.tokens is not second.tokens
    assert (first.decode, first.batch, first.wake_at) == (False, None, None)


@given(st.integers(0, 4096), st.integers(0, 10**7),
       st.lists(st.tuples(st.integers(1, 8192), st.integers(1, 10**6)), max_size=8), st.integers(0, 8))
def test_the_shapes_built_from_their_fields_are_the_named_tuples(rows: int, context: int,
                                                                  chunks: list[tuple[int, int]], spec: int) -> None:
    # decode_shape and from_rows build the tuple from all its fields (contract.py): the same values,
    # type and defaults as the keyword-built named tuple.
    assert decode_shape(rows, context) == StepShape(num_seqs=rows, decode_seqs=rows, decode_context=context)
    assert type(decode_shape(rows, context)) is StepShape
    shape = StepShape.from_rows(chunks, rows, context, spec)
    prefill = [(n, c) for n, c in chunks if n != 1]
    single = [c for n, c in chunks if n == 1]
    assert type(shape) is StepShape and shape == StepShape(
        num_seqs=rows + len(chunks), decode_seqs=rows + len(single), decode_context=context + sum(single),
        prefill_seqs=len(prefill), prefill_tokens=sum(n for n, _ in prefill),
        prefill_context=sum(c for _, c in prefill), prefill_pairs=sum(causal_pairs(n, c) for n, c in prefill),
        spec_tokens=spec)


def test_request_columns_are_each_requests_fields() -> None:
    rng = np.random.default_rng(3)
    requests = [Request(i, float(rng.random()), int(rng.integers(1, 9)), int(rng.integers(1, 9)),
                        int(rng.integers(0, 3))) for i in range(50)]
    for request in requests:
        request.emitted, request.preemptions = int(rng.integers(0, 9)), int(rng.integers(0, 3))
        request.scheduled, request.first_token, request.finish = (float(x) for x in rng.random(3))
        request.cached_tokens, request.cached_tokens_host = int(rng.integers(0, 9)), int(rng.integers(0, 3))
    columns = RequestColumns.from_requests(requests)
    for f in dataclasses.fields(RequestColumns):
        array = getattr(columns, f.name)
        values = [getattr(r, f.name) for r in requests]
        assert array.dtype == (np.float64 if isinstance(values[0], float) else np.int64), f.name
        assert array.tolist() == values, f.name
    assert len(RequestColumns.from_requests([])) == 0


def test_the_engine_names_no_policy() -> None:
    """Nothing under simulator/ imports a concrete policy or branches on a policy's name."""
    for path in [*(ROOT / "simulator").glob("*.py"), *(ROOT / "simulator" / "cost").glob("*.py")]:
        text = path.read_text()
        assert not re.search(r"from policies\.\w+ import|import policies\.", text), path.name
        assert not re.search(r"ChunkedPrefill|ContinuousBatching|StaticBatching|PriorityScheduling", text), path.name
        if path.name not in ("config.py", "cli.py", "run_command.py"):  # settings and flags, not the engine
            assert not re.search(r"policy\s*[!=]=\s*[\"']|[\"']\s*[!=]=\s*\w*\.?policy\b", text), path.name


def workload(prompts: list[int], outputs: list[int], arrivals: list[float], priority: list[int]) -> Workload:
    return Workload(prompt_tokens=np.array(prompts, dtype=np.int64), output_tokens=np.array(outputs, dtype=np.int64),
                    arrival=np.array(arrivals, dtype=np.float64), concurrency=None,
                    priority=np.array(priority, dtype=np.int64))


def test_priority_serves_the_waiting_queue_by_priority_then_arrival() -> None:
    """One request at a time (max_num_seqs 1), unit-cost steps: a request that came later but ranks
    higher (lower value) goes first; equal priorities go by arrival."""
    w = workload([4] * 4, [2] * 4, [0.0, 0.0, 0.5, 0.5], [2, 1, 0, 1])
    result = simulate(RunConfig(policy="priority", max_num_seqs=1, max_num_batched_tokens=8), w, UnitCost())
    scheduled = result.requests.scheduled.tolist()
    # t=0: 0 (p2) and 1 (p1) wait: 1 runs (steps 0-1, prefill then decode), then 2 (p0, arrived 0.5),
    # then 3 (p1), then 0 (p2).
    assert scheduled == [6.0, 0.0, 2.0, 4.0]
    fcfs = simulate(RunConfig(policy="chunked", max_num_seqs=1, max_num_batched_tokens=8), w, UnitCost())
    assert fcfs.requests.scheduled.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_priority_preempts_the_lowest_priority_latest_arrival() -> None:
    """KV for two requests' prompts but not their outputs: when the running pair cannot grow, the
    victim is the lowest-priority one (here the earlier arrival), not the most recently admitted."""
    w = workload([16, 16], [40, 40], [0.0, 0.0], [1, 0])
    config = RunConfig(policy="priority", block_size=16, num_gpu_blocks_override=4)
    result = simulate(config, w, UnitCost())
    assert result.requests.preemptions.tolist()[0] > 0
    assert result.requests.preemptions.tolist()[1] == 0
    fcfs = simulate(RunConfig(policy="chunked", block_size=16, num_gpu_blocks_override=4), w, UnitCost())
    assert fcfs.requests.preemptions.tolist()[1] > 0  # FCFS takes the most recently admitted


def test_priority_levels_are_uniform_and_leave_the_lengths_alone() -> None:
    with_levels = simulate(RunConfig(policy="priority", rate=50.0, num_requests=3000, input_len_dist="uniform",
                                     input_len=200, output_len=5, priority_levels=4))
    without = simulate(RunConfig(policy="chunked", rate=50.0, num_requests=3000, input_len_dist="uniform",
                                 input_len=200, output_len=5))
    counts = np.bincount(with_levels.requests.priority, minlength=4)
    assert counts.min() > 3000 / 4 * 0.85 and counts.max() < 3000 / 4 * 1.15
    assert np.array_equal(with_levels.requests.prompt_tokens, without.requests.prompt_tokens)
    assert np.array_equal(with_levels.requests.arrival, without.requests.arrival)


def test_streamed_tokens_table_equals_the_whole_table(tmp_path: Path) -> None:
    result = simulate(RunConfig(policy="chunked", rate=20.0, num_requests=400, input_len_dist="uniform",
                                output_len_dist="uniform", num_gpu_blocks_override=3000))
    assert result.requests.preemptions.sum() > 0  # a request's tokens come in several runs
    whole = tokens_table(result.log)
    assert whole.height == int(result.requests.emitted.sum())
    small = pl.concat([chunk.frame() for chunk in token_chunks(result.log, rows_per_chunk=1000)])
    assert small.equals(whole)
    assert len(list(token_chunks(result.log, rows_per_chunk=1000))) > 10
    written: list[int] = []
    TokensTable(result.log).write(tmp_path / "t.parquet", {b"k": b"v"}, written.append)
    assert written[-1] == whole.height == TokensTable(result.log).height
    assert pl.read_parquet(tmp_path / "t.parquet").equals(whole)
    # Per request, the indices count 0, 1, 2, ... and times never go back.
    assert whole.group_by("request_id").agg((pl.col("index").diff().drop_nulls() == 1).all()).get_column(
        "index").all()
    assert (whole.group_by("request_id").agg(pl.col("time").diff().drop_nulls().min())
            .get_column("time").drop_nulls().min() or 0) > 0
