"""Prefix caching in a fleet, and the prefix-aware router: each replica keeps its own cache, and the
router sends a request to the replica holding the longest cached prefix of its prompt."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fleet import POLICIES, assert_same_fleet
from test_prefix_cache import shared_prefixes
from test_properties import SETTINGS, cases

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate
from workloads import Workload
from workloads.prefixes import SHARED_PREFIX, UNIQUE

PREFIX, OWN = 1024, 16


def paired_prefixes(num_requests: int) -> Workload:
    """One client; request i: prefix (i // 2) mod 2, so the prompts go A, A, B, B, A, A, ...; then
    16 tokens of its own and one output token."""
    content = tuple(((SHARED_PREFIX + (i // 2) % 2, PREFIX), (UNIQUE + i, OWN)) for i in range(num_requests))
    return Workload(prompt_tokens=np.full(num_requests, PREFIX + OWN, dtype=np.int64),
                    output_tokens=np.ones(num_requests, dtype=np.int64), arrival=None, concurrency=1,
                    content=content)


def test_prefix_aware_routing_finds_each_prefix_once() -> None:
    """Two replicas, one request at a time. Prefix-aware: both replicas idle, the first A and the
    first B go to replica 0 (ties by load, then index), and every later request finds its prefix
    there: 2 misses. Round robin sends A, A, B, B to replicas 0, 1, 0, 1, so each replica misses
    each prefix once: 4 misses. Hit rate = hits x 1,024 / (n x 1,040) either way."""
    n = 40
    rates, replicas = {}, {}
    for router in ("prefix-aware", "round-robin"):
        result = simulate(RunConfig(policy="chunked", num_replicas=2, router=router), paired_prefixes(n))
        tables = build_tables(result, tokens=False)
        rates[router] = summarize(result, tables)["prefix_cache_hit_rate"]
        replicas[router] = tables.requests["replica"].to_list()
    assert rates["prefix-aware"] == (n - 2) * PREFIX / (n * (PREFIX + OWN))
    assert rates["round-robin"] == (n - 4) * PREFIX / (n * (PREFIX + OWN))
    assert replicas["prefix-aware"] == [0] * n
    assert replicas["round-robin"] == [i % 2 for i in range(n)]


def test_prefix_aware_goes_to_the_holder_not_the_idle_replica() -> None:
    """Two clients, every prompt the same prefix: after the first request, replica 0 holds the prefix;
    the second client's request goes there although replica 0 is busy and replica 1 idle."""
    n = 10
    content = tuple(((SHARED_PREFIX, PREFIX), (UNIQUE + i, OWN)) for i in range(n))
    workload = Workload(prompt_tokens=np.full(n, PREFIX + OWN, dtype=np.int64), output_tokens=np.full(n, 50),
                        arrival=np.array([0.0] + [1.0] * (n - 1)), concurrency=None, content=content)
    result = simulate(RunConfig(policy="chunked", num_replicas=2, router="prefix-aware"), workload)
    tables = build_tables(result, tokens=False)
    assert tables.requests["replica"].to_list() == [0] * n
    assert tables.requests["cached_tokens"].to_list() == [0] + [PREFIX] * (n - 1)
    least_loaded = simulate(RunConfig(policy="chunked", num_replicas=2, router="least-loaded"), workload)
    assert 1 in build_tables(least_loaded, tokens=False).requests["replica"].to_list()


def test_without_prefix_identity_prefix_aware_is_least_loaded() -> None:
    """No prompt shares anything, so every cached prefix is 0 and the load decides."""
    config = RunConfig(policy="chunked", rate=30.0, num_requests=300, num_replicas=3, router="prefix-aware")
    ours = build_tables(simulate(config))
    theirs = build_tables(simulate(replace(config, router="least-loaded")))
    for name in ("requests", "tokens", "steps"):
        assert getattr(ours, name).equals(getattr(theirs, name)), name


def test_each_servers_hit_rate_so_far() -> None:
    """In a fleet's steps table the hit rate so far is each server's own: on each server it ends at
    that server's hits / queries."""
    result = simulate(RunConfig(policy="chunked", num_replicas=2, router="round-robin"), paired_prefixes(20))
    steps = build_tables(result, tokens=False).steps
    for server in (0, 1):
        mine = steps.filter(steps["server"] == server)
        queried, hit = mine["prefix_cache_queried_tokens"].sum(), mine["prefix_cache_hit_tokens"].sum()
        assert mine["prefix_cache_hit_rate"].drop_nulls()[-1] == hit / queried
        assert hit == 8 * PREFIX  # 10 requests, each prefix missed once


def test_a_fleet_refuses_conversations() -> None:
    with pytest.raises(InputError, match="--num-turns 2 runs on one server"):
        simulate(RunConfig(policy="chunked", num_replicas=2, num_turns=2, concurrency=2, num_requests=4))


@pytest.mark.parametrize("policy", POLICIES)
@settings(SETTINGS, max_examples=20)
@given(data=st.data(), router=st.sampled_from(["prefix-aware", "least-loaded", "round-robin"]))
def test_fleet_with_caching_matches_oracle(policy: str, data: st.DataObject, router: str) -> None:
    """As the fleet's oracle cases, with prompts sharing prefixes and every replica's cache on."""
    case = data.draw(cases(policy))
    workload = replace(case.workload, content=data.draw(shared_prefixes(case.workload.prompt_tokens.tolist())))
    assert_same_fleet(replace(case.config, num_replicas=2, router=router), workload)
