"""Colocated replicas behind a router: against a fleet of oracle servers bit for bit, a hand-checked
routing instant, and queueing theory (Poisson thinning, join-the-shortest-queue)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
import pytest
from helpers import AZURE, UnitCost, needs_azure
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import run_oracle_fleet
from test_properties import SETTINGS, cases

from simulator.config import RunConfig
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.errors import InputError
from simulator.fleet.routers import ROUTERS
from simulator.metrics.summary import build_tables, summarize
from simulator.run.driver import FleetEngine, run_fleet
from simulator.run.pools import simulate_fleet
from simulator.run.simulate import build_workload, simulate
from workloads import Workload

POLICIES = ["static", "continuous", "chunked", "priority"]


def fleet_outcome(config: RunConfig, workload: Workload, engine: FleetEngine, unit_cost: bool = False) -> Any:
    model, gpu = load_model(config.model), load_gpu(config.gpu)
    try:
        result = simulate_fleet(config, model, gpu, workload, engine=engine,
                                cost=UnitCost() if unit_cost else None)  # type: ignore[arg-type]
    except InputError as error:
        return type(error), str(error)
    tables = build_tables(result)
    return tables, summarize(result, tables), result.end_time


def assert_same_fleet(config: RunConfig, workload: Workload, unit_cost: bool = False) -> Any:
    oracle = fleet_outcome(config, workload, run_oracle_fleet, unit_cost)
    engine = fleet_outcome(config, workload, run_fleet, unit_cost)
    if isinstance(oracle[0], type):
        assert engine == oracle
        return None
    for name in ("requests", "tokens", "steps"):
        ours, theirs = getattr(engine[0], name), getattr(oracle[0], name)
        assert ours.equals(theirs), f"{name} differ:\n{ours}\n{theirs}"
    assert engine[2] == oracle[2]
    return engine


@pytest.mark.parametrize("policy", POLICIES)
@settings(SETTINGS, max_examples=40)
@given(data=st.data(), num_replicas=st.integers(2, 3), router=st.sampled_from(ROUTERS),
       limit=st.none() | st.floats(0.05, 0.95), unit_cost=st.booleans())
def test_fleet_matches_oracle(policy: str, data: st.DataObject, num_replicas: int, router: str,
                              limit: float | None, unit_cost: bool) -> None:
    """Every policy and router, open and closed loop, squeezed KV: the fleet engine (servers running
    ahead of the clock between arrivals, stretches read mid-flight) gives the oracle fleet's tables."""
    case = data.draw(cases(policy))
    config = replace(case.config, num_replicas=num_replicas, router=router, seed=data.draw(st.integers(0, 3)))
    if limit is not None and case.workload.arrival is not None and len(case.workload.arrival):
        config = replace(config, time_limit=max(float(case.workload.arrival[-1]) * limit, 1e-3))
    assert_same_fleet(config, case.workload, unit_cost)


@pytest.mark.parametrize("policy", POLICIES)
@settings(SETTINGS, max_examples=15)
@given(data=st.data(), num_replicas=st.integers(2, 3), router=st.sampled_from(ROUTERS), unit_cost=st.booleans(),
       output_lag=st.booleans())
def test_async_fleet_matches_oracle(policy: str, data: st.DataObject, num_replicas: int, router: str,
                                    unit_cost: bool, output_lag: bool) -> None:
    """Async scheduling, with and without output lag, on replicas: a router reads the requests
    that wait unplanned, and a closed loop's next request is routed when a held finish reaches its
    client; the fleet engine gives the oracle fleet's tables."""
    case = data.draw(cases(policy))
    config = replace(case.config, num_replicas=num_replicas, router=router, seed=data.draw(st.integers(0, 3)),
                     async_scheduling=True, output_lag=output_lag)
    assert_same_fleet(config, case.workload, unit_cost)


@pytest.mark.parametrize("policy", ["continuous", "chunked", "priority"])
@settings(SETTINGS, max_examples=20)
@given(data=st.data(), num_replicas=st.integers(2, 3), router=st.sampled_from(ROUTERS),
       limit=st.none() | st.floats(0.05, 0.95), unit_cost=st.booleans(),
       method=st.sampled_from(["ngram", "eagle"]), k=st.integers(1, 4),
       acceptance=st.sampled_from(["0", "1", "0.7", "0.9,0.5"]))
def test_speculating_fleet_matches_oracle(policy: str, data: st.DataObject, num_replicas: int, router: str,
                                          limit: float | None, unit_cost: bool, method: str, k: int,
                                          acceptance: str) -> None:
    """Every replica speculating with the same settings, each request drawing from its own stream:
    the fleet engine gives the oracle fleet's tables (a squeezed KV cache given the blocks a verify
    step's draft tokens take beyond the longest request)."""
    if "," in acceptance and len(acceptance.split(",")) != k:
        acceptance = acceptance.split(",")[0]
    case = data.draw(cases(policy))
    config = replace(case.config, num_replicas=num_replicas, router=router, seed=data.draw(st.integers(0, 3)),
                     speculative_method=method, num_speculative_tokens=k, spec_acceptance=acceptance)
    if config.num_gpu_blocks_override is not None:
        config = replace(config, num_gpu_blocks_override=config.num_gpu_blocks_override + -(-k // config.block_size))
    if limit is not None and case.workload.arrival is not None and len(case.workload.arrival):
        config = replace(config, time_limit=max(float(case.workload.arrival[-1]) * limit, 1e-3))
    assert_same_fleet(config, case.workload, unit_cost)


def tokens_per_step(tables: Any) -> dict[int, list[int]]:
    """Each request's tokens counted per distinct time, in time order."""
    counts = tables.tokens.group_by("request_id", "time").len().sort("request_id", "time")
    return {r: group["len"].to_list() for (r,), group in counts.group_by("request_id", maintain_order=True)}


def test_a_finish_told_as_a_decode_step_is_launched_is_routed_with_that_steps_kv_taken() -> None:
    """Output lag tells a step's finishes once the step after it is launched: a closed-loop client's
    next request is then routed by `least-kv` with the KV that decode step took counted (here the
    finish of request 22 on replica 0, whose other request grows to two blocks; the next request
    goes to replica 1, as the oracle fleet routes it). Found by hypothesis in
    `test_async_fleet_matches_oracle`: the fleet engine told before taking the step's KV."""
    config = RunConfig(policy="priority", model="llama-3.1-8b", gpu="h100_sxm", cost="roofline", max_num_seqs=2,
                       max_num_batched_tokens=2, long_prefill_token_threshold=0, block_size=1, input_len=2000,
                       output_len=300, num_replicas=2, router="least-kv", seed=0, async_scheduling=True,
                       output_lag=True)
    outputs = np.ones(28, dtype=np.int64)
    outputs[23] = 2
    workload = Workload(prompt_tokens=np.array([1, 1, 1, 3] + [1] * 24), output_tokens=outputs, arrival=None,
                        concurrency=3)
    tables = assert_same_fleet(config, workload)[0]
    assert tables.requests.filter(pl.col("request_id") == 25)["replica"].item() == 1


def test_replicas_at_acceptance_one_emit_k_plus_one_tokens_a_step() -> None:
    """1 s steps, two replicas behind round robin, n-gram drafts of k = 3 always accepted. Each
    replica prefills its two requests in [0, 1] (first tokens at 1), then every verify step emits
    k + 1 = 4 tokens per request: 9-token outputs take 1 + 4 + 4 (finished at 3), 7-token ones
    1 + 4 + 2 (the output's end cuts the second step short). Four requests, two verify steps each:
    8 drafts of 3 tokens, all accepted as drawn."""
    workload = Workload(prompt_tokens=np.array([20, 20, 20, 20]), output_tokens=np.array([9, 9, 7, 7]),
                        arrival=np.zeros(4), concurrency=None)
    config = RunConfig(policy="continuous", num_replicas=2, speculative_method="ngram", num_speculative_tokens=3,
                       spec_acceptance="1")
    tables, summary, end_time = assert_same_fleet(config, workload, unit_cost=True)
    assert tables.requests["replica"].to_list() == [0, 1, 0, 1]
    assert tokens_per_step(tables) == {0: [1, 4, 4], 1: [1, 4, 4], 2: [1, 4, 2], 3: [1, 4, 2]}
    assert tables.requests["finish"].to_list() == [3.0] * 4 and end_time == 3.0
    assert (summary["spec_num_drafts"], summary["spec_num_accepted_tokens"]) == (8, 24)
    assert summary["spec_mean_acceptance_length"] == 4.0


def test_disaggregated_pools_verify_on_the_decode_side_only() -> None:
    """1 s steps, one prefill server and two decode servers, n-gram drafts of k = 2 always accepted.
    The prefill server emits each request's first token and never verifies (two steps: request 0 in
    [0, 1], requests 1 and 2, sent at 0.5 and 1, together in [1, 2]); on a decode server the
    request's first step computes that token's KV with 2 drafts and emits 3 tokens, as every one
    after: a 10-token output comes as 1 + 3 + 3 + 3, in 3 verify steps per request."""
    workload = Workload(prompt_tokens=np.array([50, 50, 50]), output_tokens=np.array([10, 10, 10]),
                        arrival=np.array([0.0, 0.5, 1.0]), concurrency=None)
    config = RunConfig(policy="continuous", prefill_replicas=1, decode_replicas=2, speculative_method="ngram",
                       num_speculative_tokens=2, spec_acceptance="1")
    result = simulate_fleet(config, load_model(config.model), load_gpu(config.gpu), workload,
                            cost=UnitCost())  # type: ignore[arg-type]
    tables = build_tables(result)
    summary = summarize(result, tables)
    assert tokens_per_step(tables) == {r: [1, 3, 3, 3] for r in range(3)}
    prefill_steps = tables.steps.filter(pl.col("server") == 0)
    assert prefill_steps["decode_tokens"].sum() == 0 and prefill_steps.height == 2
    assert (summary["spec_num_drafts"], summary["spec_num_accepted_tokens"]) == (9, 18)
    assert tables.requests["decode_server"].to_list() == [1, 2, 1]


def test_least_kv_reads_a_stretch_in_flight() -> None:
    """1 s steps, one KV block per token. Two 5-token prompts reach replica 0 at t=0 (ties go to the
    lowest index; waiting requests hold no KV) and prefill in [0, 1] (10 blocks); a 12-token prompt
    at t=0.5 sees replica 0 at 10 blocks and goes to replica 1 (prefill [0.5, 1.5], 12 blocks).
    At t=5.2 replica 0 has started decode steps at 1, 2, 3, 4, 5 (two blocks each: 20 blocks) and
    replica 1 at 1.5, 2.5, 3.5, 4.5 (one each: 16), so the fourth request goes to replica 1; both
    replicas are then inside one priced decode stretch whose blocks are taken only when it ends."""
    workload = Workload(prompt_tokens=np.array([5, 5, 12, 4]), output_tokens=np.array([50, 50, 50, 5]),
                        arrival=np.array([0.0, 0.0, 0.5, 5.2]), concurrency=None)
    config = RunConfig(policy="continuous", num_replicas=2, router="least-kv", block_size=1,
                       num_gpu_blocks_override=1000)
    tables, _, _ = assert_same_fleet(config, workload, unit_cost=True)
    assert tables.requests["replica"].to_list() == [0, 0, 1, 1]


def test_requests_routed_during_a_stretchs_last_step() -> None:
    """1 s steps, round robin over two replicas. Replica 0 prefills a 6-token request in [0, 1] and
    prices its decode steps to its finish at t=6 as one stretch; two requests are routed to it
    during that last step (t=5.2 and 5.8, one to replica 1 between): both wait for the step's end
    and are admitted together then, not the first alone at 5.2."""
    workload = Workload(prompt_tokens=np.array([4, 4, 4, 4, 4]), output_tokens=np.array([6, 6, 3, 3, 3]),
                        arrival=np.array([0.0, 0.1, 5.2, 5.5, 5.8]), concurrency=None)
    config = RunConfig(policy="continuous", num_replicas=2)
    tables, _, _ = assert_same_fleet(config, workload, unit_cost=True)
    assert tables.requests["replica"].to_list() == [0, 1, 0, 1, 0]
    assert tables.requests["scheduled"].to_list()[2::2] == [6.0, 6.0]


@needs_azure
@pytest.mark.parametrize("router", ["least-kv", "random"])
def test_trace_replay_matches_oracle(router: str) -> None:
    """The Azure trace's first 400 requests replayed over three replicas, as the oracle fleet does."""
    config = RunConfig(policy="chunked", trace=str(AZURE), num_requests=400, num_replicas=3, router=router)
    tables, _, _ = assert_same_fleet(config, build_workload(config))
    assert sorted(tables.requests["replica"].unique().to_list()) == [0, 1, 2]


def chapter_stats(**settings: Any) -> dict[str, Any]:
    result = simulate(RunConfig(policy="continuous", **settings))
    return summarize(result, build_tables(result, tokens=False))


BULK = ("mean_tpot", "median_tpot", "median_itl")
TAILS = ("p90_tpot", "p99_tpot", "p90_itl", "p99_itl")


def test_replicas_at_n_times_the_rate() -> None:
    """The chapter's workload (2000-token prompts, 300-token outputs, H100, continuous batching) at
    6 req/s, which one server keeps up with, against 2 replicas at 12 req/s.

    The sampling-noise bound: each statistic's range over four seeds of the single server, widened
    by that range on either side. Random routing thins a Poisson stream into Poisson streams of half
    the rate, so every TPOT and ITL statistic of the pair must fall in it. Round robin gives each
    replica every other arrival (Erlang-2 gaps, smoother than Poisson: fewer prompts bunch into one
    prefill step), so its statistics may only be lower: the bulk within 3% of the single server's
    mean over the seeds, the tails no higher than the band. Both pairs serve 2x the requests per
    second (within 2%: the runs' first arrival and last finish)."""
    singles = [chapter_stats(rate=6.0, num_requests=2000, seed=seed) for seed in range(4)]
    assert all(s["kept_up"] for s in singles)
    band = {}
    for key in BULK + TAILS:
        values = [s[key] for s in singles]
        spread = max(values) - min(values)
        band[key] = (min(values) - spread, max(values) + spread)
    throughput = singles[0]["request_throughput"]
    for router in ("random", "round-robin"):
        pair = chapter_stats(rate=12.0, num_requests=4000, num_replicas=2, router=router, seed=0)
        for key in BULK + TAILS:
            assert pair[key] <= band[key][1], (router, key, pair[key], band[key])
            if router == "random":
                assert band[key][0] <= pair[key], (router, key, pair[key], band[key])
            elif key in BULK:
                single = float(np.mean([s[key] for s in singles]))
                assert pair[key] == pytest.approx(single, rel=0.03), (router, key, pair[key], single)
        assert pair["request_throughput"] / throughput == pytest.approx(2.0, rel=0.02)
        assert min(s["requests"] for s in pair["servers"]) > 1800  # both served


@pytest.mark.parametrize("seed", [0, 1])
def test_join_the_shortest_queue_beats_random(seed: int) -> None:
    """Two replicas near saturation (Poisson at 23.5 req/s; one server of this workload falls behind
    at 12): least-loaded routing's TTFT p99 is below random assignment's."""
    p99 = {router: chapter_stats(rate=23.5, num_requests=4000, num_replicas=2, router=router, seed=seed)["p99_ttft"]
           for router in ("least-loaded", "random")}
    assert p99["least-loaded"] < p99["random"], p99


def test_fleet_tables_and_summary() -> None:
    """Requests name their replica, steps their server; the per-server blocks add up to the fleet."""
    result = simulate(RunConfig(policy="chunked", rate=20.0, num_requests=300, num_replicas=3))
    tables = build_tables(result)
    summary = summarize(result, tables)
    assert tables.requests["replica"].to_list() == [i % 3 for i in range(300)]
    assert sorted(tables.steps["server"].unique().to_list()) == [0, 1, 2]
    servers = summary["servers"]
    assert sum(s["completed"] for s in servers) == summary["completed"] == 300
    assert sum(s["output_tokens"] for s in servers) == summary["total_output_tokens"]
    for s in servers:
        mine = tables.steps.filter(pl.col("server") == s["server"])
        assert s["busy"] == pytest.approx(float(mine["duration"].sum()) / summary["duration"])
    tokens = tables.tokens.join(tables.requests.select("request_id", "replica"), on="request_id")
    assert tokens.height == 300 * 300


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_replicas": 0}, r"--num-replicas must be an integer in \[1, 100000\] servers, got 0"),
    ({"router": "fastest"}, "unknown --router 'fastest'"),
    ({"router": "least-kv"}, "--router least-kv needs more than one server"),
    ({"prefill_replicas": 1}, "--prefill-replicas needs both"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "num_replicas": 2}, "--num-replicas 2 is for colocated"),
    ({"decode_tensor_parallel_size": 2}, "--decode-tensor-parallel-size applies only to prefill/decode pools"),
    ({"kv_transfer_bandwidth": 10.0}, "--kv-transfer-bandwidth applies only"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "kv_transfer_bandwidth": 0.0}, "--kv-transfer-bandwidth must be"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "kv_transfer_latency": math.inf}, "--kv-transfer-latency must"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "policy": "static"}, "--prefill-replicas: the static policy"),
])
def test_bad_fleet_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        RunConfig(**settings)
