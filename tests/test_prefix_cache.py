"""Prefix caching (simulator.engine.kv): hand-computed hit rates and TTFTs, LRU's worst case, and the
engine against the oracle with the cache on."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kv_reference import ReferenceKVBlocks
from test_cli import simulate_cli
from test_engines import ENGINE_EXAMPLES, assert_identical
from test_properties import SETTINGS, cases

from simulator.config import RunConfig
from simulator.cost import StepShape, build_cost_model
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.engine import stretch
from simulator.engine.kv import KVBlocks, block_keys
from simulator.engine.offload import HostTier
from simulator.engine.request import Request
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, summarize
from simulator.run import driver
from simulator.run.simulate import simulate
from workloads import Workload
from workloads.prefixes import SHARED_PREFIX, UNIQUE
from workloads.sessions import conversations


def test_fifty_requests_sharing_a_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One after another (concurrency 1), each 1,024 shared + 512 own tokens: every request but the
    first finds the prefix (64 blocks of 16; the 32 own blocks are new), so the hit rate is
    49 x 1024 / (50 x 1536), and a later request's TTFT is one step computing its 512 tokens
    over a 1,536-token context, priced by the cost model directly."""
    out = tmp_path / "run"
    code, stdout, _ = simulate_cli(["--policy", "chunked", "--concurrency", "1", "--num-requests", "50",
                                    "--input-len", "512", "--output-len", "20", "--prefix-len", "1024",
                                    "--out", str(out), "--no-tokens", "--quiet"], capsys)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["prefix_cache_hit_rate"] == 49 * 1024 / (50 * 1536)
    assert "prefix cache hit rate                   65.33%" in stdout
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests["cached_tokens"].to_list() == [0] + [1024] * 49
    cost = build_cost_model(RunConfig(), load_model("llama-3.1-8b"), load_gpu("h100_sxm"))
    suffix_alone = cost.step_time(StepShape.from_rows([(512, 1536)]))
    whole = cost.step_time(StepShape.from_rows([(1536, 1536)]))
    ttft = requests["ttft"].to_numpy()
    assert ttft[0] == pytest.approx(whole, rel=1e-12)
    assert ttft[1:] == pytest.approx([suffix_alone] * 49, rel=1e-12)
    assert suffix_alone < whole / 2
    steps = pl.read_parquet(out / "steps.parquet")
    queried = steps.filter(pl.col("prefix_cache_queried_tokens") > 0)
    assert queried.height == 50
    assert queried["prefix_cache_hit_rate"].to_list() == [i * 1024 / ((i + 1) * 1536) for i in range(50)]


def test_caching_off_hits_nothing() -> None:
    config = RunConfig(policy="chunked", concurrency=1, num_requests=20, input_len=512, output_len=20,
                       prefix_len=1024, enable_prefix_caching=False)
    result = simulate(config)
    summary = summarize(result, build_tables(result, tokens=False))
    assert summary["prefix_cache_queried_tokens"] == 0 and np.isnan(summary["prefix_cache_hit_rate"])
    assert not result.requests.cached_tokens.any()


def cyclic_workload(num_requests: int, cycle: int, prefix_len: int, own_len: int) -> Workload:
    """Request i: prefix i mod `cycle`, then its own tokens; one output token, one client."""
    content = tuple(((SHARED_PREFIX + i % cycle, prefix_len), (UNIQUE + i, own_len)) for i in range(num_requests))
    return Workload(prompt_tokens=np.full(num_requests, prefix_len + own_len, dtype=np.int64),
                    output_tokens=np.ones(num_requests, dtype=np.int64), arrival=None, concurrency=1,
                    content=content)


@pytest.mark.parametrize("room", [4, 5])
def test_lru_worst_case(room: int) -> None:
    """KV for `room` requests (each 64 prefix blocks + 1 own block, all cached when it finishes).
    Cycling over `room` prefixes, request i finds prefix i mod room still cached from `room`
    requests ago (only that request's own block was evicted), so all but the first `room` hit;
    cycling over room + 1, least-recently-used evicts each prefix just before it comes back: no hit."""
    n, prefix_len, own_len, block = 60, 1024, 16, 16
    config = RunConfig(policy="chunked", num_gpu_blocks_override=room * (prefix_len + own_len) // block)
    rates = {}
    for cycle in (room, room + 1):
        result = simulate(config, cyclic_workload(n, cycle, prefix_len, own_len))
        rates[cycle] = summarize(result, build_tables(result, tokens=False))["prefix_cache_hit_rate"]
    assert rates[room] == (n - room) * prefix_len / (n * (prefix_len + own_len))
    assert rates[room + 1] == 0.0


def test_block_keys_are_chained() -> None:
    """Equal content at equal positions gives equal keys, and a difference anywhere changes every
    later key; a partial block has none."""
    a = block_keys(((7, 40), (8, 30)), 16)
    b = block_keys(((7, 40), (9, 30)), 16)
    c = block_keys(((6, 8), (7, 32), (8, 30)), 16)
    assert len(a) == 4 and a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]
    assert not set(a) & set(c)


def test_free_queue_evicts_least_recently_released_first() -> None:
    """Two requests release their cached blocks; taking one block evicts the first request's last
    block (released tails go first), leaving the rest of both hits."""
    kv = KVBlocks(4, 16, caching=True)
    first, second = (Request(i, 0.0, 33, 1, content=((100 + i, 34),)) for i in range(2))
    for request in (first, second):
        kv.take(2)
        request.blocks = 2
        request.computed = 32
        kv.release(request)
    assert kv.num_free == 4 and kv.num_cached == 4
    kv.take(1)
    assert kv.num_cached == 3
    for request in (first, second):
        request.computed = 0
        kv.look_up(request)
    assert (first.hit_blocks, second.hit_blocks) == (1, 2)


@settings(SETTINGS, max_examples=ENGINE_EXAMPLES)
@given(data=st.data())
def test_spans_keep_the_block_rules_call_by_call(data: st.DataObject) -> None:
    """Spans split by hits, shortened by evictions and freed in any order: KVBlocks and the
    block-by-block reference through the same random calls (an admission taking its hit, its host
    part loaded first or not, and a prompt chunk, a later chunk, a release), the counts and every
    waiting request's hit compared
    after each call. Prompts are a few segments from a small pool, each sent twice, so they share
    prefixes, part inside each other's spans, and compute the same blocks at once."""
    block = 4
    num_blocks = data.draw(st.integers(2, 16), label="blocks")
    segment = st.tuples(st.integers(0, 3), st.sampled_from([1, 3, 4, 5, 8, 13]))
    contents = data.draw(st.lists(st.lists(segment, min_size=1, max_size=4), min_size=1, max_size=4)) * 2
    # Sometimes a host tier under the cache: the evicted blocks' LRU, which a hit continues into.
    host_blocks = data.draw(st.none() | st.integers(1, 12), label="host blocks")
    host = HostTier(host_blocks, 1, 1.0) if host_blocks is not None else None
    kvs = (KVBlocks(num_blocks, block, caching=True, host=host),
           ReferenceKVBlocks(num_blocks, block, caching=True, host=host))
    twins = [[Request(i, 0.0, sum(n for _, n in content), 1, content=tuple(content)) for _ in kvs]
             for i, content in enumerate(contents)]
    cached, evicted, loads = 0, False, 0
    for _ in range(data.draw(st.integers(1, 60), label="calls")):
        pair = data.draw(st.sampled_from(twins))
        if pair[0].admitted < 0:
            if host is not None and data.draw(st.booleans(), label="loads first"):
                # Its host part loaded (if it has one and it fits), released cached at the load's
                # end, then looked up again.
                started = [kv.start_load(request) for kv, request in zip(kvs, pair, strict=True)]
                assert started[0] == started[1]
                if started[0] > 0:
                    loads += 1
                    for kv, request in zip(kvs, pair, strict=True):
                        kv.release(request)
                        kv.look_up(request)
            for kv, request in zip(kvs, pair, strict=True):
                kv.take_hit(request)
                request.admitted = 0
        pending = pair[0].num_pending
        n = data.draw(st.integers(1, pending)) if pending and data.draw(st.booleans()) else 0
        fits = n > 0 and kvs[0].extra_blocks(pair[0], pair[0].computed + n) <= kvs[0].num_free
        for kv, request in zip(kvs, pair, strict=True):
            if fits:
                kv.grow(request, request.computed + n)
                kv.register(request, request.computed + n)
                request.computed += n
            else:
                kv.release(request)
                request.admitted, request.computed = -1, 0
        assert (kvs[0].num_free, kvs[0].num_cached) == (kvs[1].num_free, kvs[1].num_cached)
        counters = [(len(kv.offload), kv.offload.stored) if kv.offload is not None else ()
                    for kv in kvs]
        assert counters[0] == counters[1]
        assert [(kv.hit_tokens, kv.host_hit_tokens) for kv in kvs] == [(kvs[1].hit_tokens, kvs[1].host_hit_tokens)] * 2
        assert not counters[0] or counters[0][0] <= host.blocks  # never more than the host tier holds
        assert pair[0].cached_tokens_host == pair[1].cached_tokens_host <= pair[0].cached_tokens
        for kv in kvs:
            kv.read_hits.clear()
        for mine, theirs in twins:
            if mine.admitted < 0:
                for kv, request in zip(kvs, (mine, theirs), strict=True):
                    kv.look_up(request)
            assert (mine.blocks, mine.computed, mine.hit_blocks, mine.hit_in_use) == (
                theirs.blocks, theirs.computed, theirs.hit_blocks, theirs.hit_in_use)
        waiting = [pair for pair in twins if pair[0].admitted < 0]
        # What a decode stretch in flight leaves cached (a router's read), and how far it may take
        # blocks before a looked-up hit shrinks: against the reference taking the blocks for real.
        popped = data.draw(st.integers(0, kvs[0].num_free), label="popped")
        if host is None:  # a router reads the GPU's cache alone (a host tier runs on one server)
            hits = hits_after_taking(kvs[1], [theirs for _, theirs in waiting], popped)
            assert [kvs[0].cached_tokens(mine, popped) for mine, _ in waiting] == [h * block for h in hits]
            assert [kvs[1].cached_tokens(theirs, popped) for _, theirs in waiting] == [h * block for h in hits]
        room = kvs[0].room_sparing_hits(kvs[0].num_free)
        assert kvs[1].room_sparing_hits(kvs[1].num_free) == room
        before = [theirs.hit_blocks for _, theirs in waiting]
        assert hits_after_taking(kvs[1], [theirs for _, theirs in waiting], room) == before
        if room < kvs[0].num_free and host is None:  # with a host part, the room is cautious (kv.py)
            assert hits_after_taking(kvs[1], [theirs for _, theirs in waiting], room + 1) != before
        evicted = evicted or kvs[0].num_cached < cached
        cached = kvs[0].num_cached
    event("evicted" if evicted else "nothing evicted")
    event("host hits" if kvs[0].host_hit_tokens else "no host hit")
    event("loads" if loads else "no load")


def hits_after_taking(kv: KVBlocks, waiting: list[Request], n: int) -> list[int]:
    """Each waiting request's hit blocks in a copy of `kv` once `n` blocks are taken from it."""
    copied, waiting = copy.deepcopy((kv, waiting))
    if hasattr(kv, "__dict__"):  # a subclass's own state (a compiled base class copies only its own fields)
        copied.__dict__.update(copy.deepcopy(kv.__dict__))
    kv = copied
    kv.take(n)
    for request in waiting:
        kv.look_up(request)
    return [request.hit_blocks for request in waiting]


def test_content_must_cover_the_prompt() -> None:
    with pytest.raises(InputError, match="covers 30 tokens, its prompt has 31"):
        Workload(prompt_tokens=np.array([31], dtype=np.int64), output_tokens=np.array([1], dtype=np.int64),
                 arrival=np.zeros(1), concurrency=None, content=(((1, 30),),))


@st.composite
def shared_prefixes(draw: st.DrawFn, prompts: list[int]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Some prompts start with one of a few shared prefixes (or are whole copies of another)."""
    lengths = draw(st.lists(st.integers(1, max(prompts)), min_size=1, max_size=3))
    content = []
    for i, prompt in enumerate(prompts):
        k = draw(st.integers(-1, len(lengths) - 1))
        shared = min(lengths[k], prompt) if k >= 0 else 0
        pieces = ((SHARED_PREFIX + k, shared),) if shared else ()
        if prompt > shared:
            pieces += ((UNIQUE + draw(st.sampled_from([i, 0])), prompt - shared),)
        content.append(pieces)
    return tuple(content)


@pytest.mark.parametrize("run_min", [1, stretch.RUN_MIN], ids=["every-stretch-as-arrays", "default-stretches"])
@pytest.mark.parametrize("policy", ["continuous", "chunked", "priority"])
@settings(SETTINGS, max_examples=ENGINE_EXAMPLES // 2)
@given(data=st.data())
def test_engine_matches_oracle_with_caching(policy: str, run_min: int, data: st.DataObject) -> None:
    """As test_engines' random cases, with prompts sharing prefixes and the cache on; `run_min` 1
    prices every decode stretch as arrays (its blocks taken, and cached ones evicted, at once)."""
    default, stretch.RUN_MIN = stretch.RUN_MIN, run_min
    try:
        check_caching_case(policy, data)
    finally:
        stretch.RUN_MIN = default


def check_caching_case(policy: str, data: st.DataObject) -> None:
    case = data.draw(cases(policy))
    workload = replace(case.workload, content=data.draw(shared_prefixes(case.workload.prompt_tokens.tolist())))
    if policy == "priority":
        workload = replace(workload, priority=np.array(
            data.draw(st.lists(st.integers(0, 2), min_size=workload.num_requests, max_size=workload.num_requests)),
            dtype=np.int64))
    summary = assert_identical(case.config, workload, may_fail=True)
    if summary:
        event(f"hit rate {'> 0' if summary['prefix_cache_hit_rate'] else '0'}")
        event("preempted" if summary["preemptions"] else "no preemption")


def test_decoders_growing_alone_evict_from_the_free_queue() -> None:
    """Eight 1-token prompts of the same content, block size 1, 7 blocks, chunked, 2 rows of 2
    tokens. Request 3 (6 tokens out) holds a copy of the prompt's block (request 0 cached it and
    left it at the free queue's head) when the decoding request 1 and then request 3 take a block
    each: the second pops that cached block, evicting it. Request 3, preempted after its second
    token and readmitted, so finds nothing cached, and no admission ever hits. The engine's step of
    decoders alone once took their blocks off the free count only, keeping the evicted block cached
    (a 2-block hit at the readmission), unlike the oracle."""
    outputs = [1, 5, 1, 6, 1, 1, 1, 1]
    workload = Workload(prompt_tokens=np.ones(8, dtype=np.int64), output_tokens=np.array(outputs),
                        arrival=np.zeros(8), concurrency=None, content=(((UNIQUE, 1),),) * 8)
    config = RunConfig(policy="chunked", max_num_seqs=2, max_num_batched_tokens=2, block_size=1,
                       num_gpu_blocks_override=7)
    summary = assert_identical(config, workload)
    assert summary["preemptions"] == 1 and summary["prefix_cache_hit_rate"] == 0


@pytest.mark.parametrize("run_min", [1, stretch.RUN_MIN], ids=["every-stretch-as-arrays", "default-stretches"])
def test_a_decode_stretch_ends_where_it_evicts_part_of_a_read_hit(run_min: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by hypothesis. Chunked, 59-token budget, block 16, 351 blocks. Request 2 (2,956
    tokens: request 1's 128, then its own), preempted after computing 2,544, waits with a
    159-block hit that nobody holds, so admitting it with a 58-token chunk needs 163 of the 160
    free blocks. Request 0 decodes alone and takes a block from the free queue's head: the last of
    request 1's cached blocks, released before request 2's. Request 2's chain now breaks at block
    7: it needs 7 + 4 blocks, and is admitted beside request 0's last token. The engine once priced
    request 0's decoding to its finish as one stretch, deciding once for a state that changed."""
    workload = Workload(prompt_tokens=np.array([3000, 128, 2956]), output_tokens=np.array([59, 2, 1]), arrival=None,
                        concurrency=5, content=(((UNIQUE, 3000),), ((SHARED_PREFIX, 128),),
                                                ((SHARED_PREFIX, 2242), (UNIQUE + 16, 714))))
    config = RunConfig(policy="chunked", max_num_seqs=4, max_num_batched_tokens=59, long_prefill_token_threshold=59,
                       num_gpu_blocks_override=351)
    monkeypatch.setattr(stretch, "RUN_MIN", run_min)
    assert_identical(config, workload)
    tables = build_tables(simulate(config, workload))
    admission = tables.steps.filter(pl.col("prefix_cache_hit_tokens") == 7 * 16).row(-1, named=True)
    assert (admission["num_seqs"], admission["prefill_tokens"], admission["decode_tokens"]) == (2, 58, 1)
    assert admission["start"] + admission["duration"] == tables.requests["finish"][0]


@pytest.mark.parametrize("policy", ["static", "chunked"])
def test_caching_off_is_the_run_without_identity(policy: str) -> None:
    """--no-enable-prefix-caching (and static batching, which takes no hits) serve a workload with
    prefix identity exactly as the same prompts without it; with caching on they differ."""
    config = RunConfig(policy=policy, rate=20.0, num_requests=200, input_len=300, output_len=50, prefix_len=200,
                       num_prefixes=2, num_gpu_blocks_override=400, enable_prefix_caching=False)
    plain = build_tables(simulate(replace(config, prefix_len=0, num_prefixes=1, input_len=500)))
    off = build_tables(simulate(config))
    for name in ("requests", "tokens", "steps"):
        assert getattr(off, name).equals(getattr(plain, name)), name
    on = build_tables(simulate(replace(config, enable_prefix_caching=True)))
    assert on.steps.equals(plain.steps) is (policy == "static")


@pytest.mark.parametrize("host", [False, True], ids=["gpu-cache", "with-a-host-tier"])
@pytest.mark.parametrize("policy", ["chunked", "priority"])
@settings(SETTINGS, max_examples=ENGINE_EXAMPLES)
@given(data=st.data(), turns=st.integers(1, 2))
def test_bulk_cache_is_the_block_by_block_one(policy: str, host: bool, data: st.DataObject, turns: int) -> None:
    """simulator.engine.kv's KVBlocks (runs of blocks at once) against tests/kv_reference.py (one block at
    a time, the rules as the module docstring says them): the same run, table for table; `host`
    with a KV host tier (the reference's own LRU, block by block)."""
    case = data.draw(cases(policy))
    workload = replace(case.workload, content=data.draw(shared_prefixes(case.workload.prompt_tokens.tolist())))
    if turns > 1:
        if workload.arrival is not None:
            workload = replace(workload, arrival=np.sort(workload.arrival))
        workload = conversations(workload, turns, 0.0)
    config = case.config
    if host:
        config = with_host_tier(config, data, int((workload.prompt_tokens + workload.output_tokens).max()))
    outcomes = []
    for blocks in (KVBlocks, ReferenceKVBlocks):
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(driver, "KVBlocks", blocks)
                result = simulate(config, workload)
        except InputError as error:
            outcomes.append(str(error))
            continue
        tables = build_tables(result)
        outcomes.append((tables.requests, tables.steps, tables.tokens))
        event("hits" if result.requests.cached_tokens.any() else "no hits")
        event("host hits" if result.requests.cached_tokens_host.any() else "no host hit")
    if isinstance(outcomes[0], str):
        assert outcomes[1] == outcomes[0]
        return
    for mine, theirs in zip(outcomes[0], outcomes[1], strict=True):
        assert mine.equals(theirs)


def test_report_draws_the_hit_rate_over_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The run page has a hit-rate panel for a run that queried the cache: the line ends at the
    summary's hit rate, the windows' bars hold each span's own hits over queries; a run with the
    cache off has neither the panel nor the summary row."""
    from simulator.report.page import read_run_folder, write_report
    from simulator.report.run_figures import HIT_RATE_WINDOWS, prefix_cache_figure

    pages = {}
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        out = tmp_path / flag
        code, _, _ = simulate_cli(["--policy", "chunked", "--rate", "4", "--num-requests", "120", "--input-len", "256",
                                   "--output-len", "32", "--prefix-len", "512", "--num-prefixes", "3", flag,
                                   "--out", str(out), "--no-tokens", "--quiet"], capsys)
        assert code == 0
        pages[flag] = write_report(out, tmp_path / f"{flag}.html").read_text()
    assert 'id="prefix_cache"' in pages["--enable-prefix-caching"] and "prefix cache hit rate" in pages[
        "--enable-prefix-caching"]
    assert 'id="prefix_cache"' not in pages["--no-enable-prefix-caching"]
    assert "prefix cache hit rate" not in pages["--no-enable-prefix-caching"]
    run = read_run_folder(tmp_path / "--enable-prefix-caching")
    so_far, windows = prefix_cache_figure(run.steps).data
    assert so_far.y[-1] == pytest.approx(run.summary["prefix_cache_hit_rate"] * 100)
    queried = run.steps.filter(pl.col("prefix_cache_queried_tokens") > 0)
    first = queried.filter(pl.col("start") < queried["start"][0] + (queried["start"][-1] - queried["start"][0])
                           / HIT_RATE_WINDOWS)
    assert windows.y[0] == pytest.approx(first["prefix_cache_hit_tokens"].sum()
                                         / first["prefix_cache_queried_tokens"].sum() * 100)


def test_continuous_finishes_a_prompt_whose_hit_was_evicted_at_admission() -> None:
    """Tight KV, shared prefixes, continuous batching: some admissions find part of their looked-up
    prefix evicted by the blocks the same step took first, leaving their prompt unfinished; the
    policy computes the rest (it used to schedule nothing and stall). Every request finishes."""
    config = RunConfig(policy="continuous", concurrency=48, num_requests=1500, prefix_len=600, num_prefixes=4,
                       input_len=500, num_gpu_blocks_override=900)
    result = simulate(config)
    assert (result.requests.emitted == result.requests.output_tokens).all()
    assert result.requests.cached_tokens.sum() > 0


def with_host_tier(config: RunConfig, data: st.DataObject, longest: int) -> RunConfig:
    """`config` with a KV host tier of a few blocks (--kv-offload-gb for that many of its model's
    blocks), a squeezed GPU cache (so it evicts) and sometimes a slow host link (so loads show)."""
    block_bytes = load_model(config.model).kv_bytes_per_token * config.block_size
    host_blocks = data.draw(st.integers(1, 64), label="host blocks")
    gpu_blocks = -(-longest // config.block_size) + data.draw(st.integers(0, 40), label="spare GPU blocks")
    bandwidth = data.draw(st.sampled_from([None, 1e-3, 1.0]), label="host link GB/s")
    return replace(config, kv_offload_gb=(host_blocks + 0.5) * block_bytes / 1e9, kv_offload_bandwidth=bandwidth,
                   num_gpu_blocks_override=config.num_gpu_blocks_override or gpu_blocks)


@pytest.mark.parametrize("run_min", [1, stretch.RUN_MIN], ids=["every-stretch-as-arrays", "default-stretches"])
@pytest.mark.parametrize("policy", ["continuous", "chunked", "priority"])
@settings(SETTINGS, max_examples=ENGINE_EXAMPLES // 2)
@given(data=st.data())
def test_engine_matches_oracle_with_a_host_tier(policy: str, run_min: int, data: st.DataObject) -> None:
    """As test_engine_matches_oracle_with_caching, with a KV host tier under the cache (--kv-offload-gb):
    evicted blocks stored, hits continued on the host and loaded, the admitting steps waiting for them."""
    default, stretch.RUN_MIN = stretch.RUN_MIN, run_min
    try:
        case = data.draw(cases(policy))
        workload = replace(case.workload, content=data.draw(shared_prefixes(case.workload.prompt_tokens.tolist())))
        if policy == "priority":
            workload = replace(workload, priority=np.array(
                data.draw(st.lists(st.integers(0, 2), min_size=workload.num_requests,
                                   max_size=workload.num_requests)), dtype=np.int64))
        longest = int((workload.prompt_tokens + workload.output_tokens).max())
        summary = assert_identical(with_host_tier(case.config, data, longest), workload, may_fail=True)
    finally:
        stretch.RUN_MIN = default
    if summary:
        event("host hits" if summary["prefix_cache_host_hit_tokens"] else "no host hit")
        event("preempted" if summary["preemptions"] else "no preemption")
