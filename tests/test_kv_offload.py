"""KV offload (`--kv-offload-gb`, a host tier under the prefix cache, simulator.engine.kv): a hit's
load time by hand, the Mooncake replay against a cache that never evicts, what the tier is refused
for, per-tier counts that add up, the tier as a sweep axis. The engine against the oracle and the
block-by-block reference with the tier on is in tests/test_prefix_cache.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import needs_mooncake
from test_cli import simulate_cli
from test_prefix_cache import cyclic_workload

from simulator.config import RunConfig
from simulator.cost import StepShape, build_cost_model
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate
from workloads import Workload
from workloads.prefixes import SHARED_PREFIX, UNIQUE

# Llama-3.1-8B's KV per token, from its config.json: K and V, 32 layers, 8 KV heads of 128, bf16.
LLAMA_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
PREFIX, OWN, BLOCK, ROOM = 1024, 16, 16, 4


@pytest.mark.parametrize("bandwidth", [None, 10.0])
def test_a_host_hit_loads_in_bytes_over_bandwidth(bandwidth: float | None) -> None:
    """One client, prompts of one of 5 prefixes (1,024 tokens) and 16 tokens of their own, a GPU
    cache for 4 such prompts: least-recently-used evicts each prefix just before it comes back, so
    the GPU never hits (tests/test_prefix_cache.py's worst case). With a host tier every evicted
    block is stored there, and from the sixth request on the whole prefix (64 blocks) is a host hit:
    its TTFT is the step computing its 16 tokens over 1,040, priced by the cost model, plus 64
    blocks of 16 tokens x 131,072 bytes over the host link (PCIe, 64 GB/s, or the flag's)."""
    n = 15
    workload = cyclic_workload(n, ROOM + 1, PREFIX, OWN)
    config = RunConfig(policy="chunked", num_gpu_blocks_override=ROOM * (PREFIX + OWN) // BLOCK,
                       kv_offload_gb=1.0, kv_offload_bandwidth=bandwidth)
    result = simulate(config, workload)
    requests = build_tables(result, tokens=False).requests
    assert requests["cached_tokens_gpu"].to_list() == [0] * n
    assert requests["cached_tokens_host"].to_list() == [0] * (ROOM + 1) + [PREFIX] * (n - ROOM - 1)
    model = load_model(config.model)
    assert model.kv_bytes_per_token == LLAMA_KV_BYTES_PER_TOKEN
    load = PREFIX * LLAMA_KV_BYTES_PER_TOKEN / (64e9 if bandwidth is None else bandwidth * 1e9)
    cost = build_cost_model(config, model, load_gpu(config.gpu))
    compute = cost.step_time(StepShape.from_rows([(OWN, PREFIX + OWN)]))
    ttft = requests["ttft"].to_numpy()
    assert ttft[ROOM + 1:] == pytest.approx([compute + load] * (n - ROOM - 1), rel=1e-9)
    whole = cost.step_time(StepShape.from_rows([(PREFIX + OWN, PREFIX + OWN)]))
    assert ttft[:ROOM + 1] == pytest.approx([whole] * (ROOM + 1), rel=1e-9)
    summary = summarize(result, build_tables(result, tokens=False))
    assert summary["kv_offload_loaded_blocks"] == (n - ROOM - 1) * PREFIX // BLOCK
    assert summary["kv_offload_load_time"] == pytest.approx((n - ROOM - 1) * load, rel=1e-12)


def test_a_load_overlaps_another_requests_decode_steps() -> None:
    """A GPU cache of 100 blocks. Request 0 computes prompt X (1,040 tokens, 65 blocks) and leaves
    it cached; request 1 (1,040 other tokens) evicts X's last 30 blocks to the host tier (the 35
    blocks never used come first in the free queue); request 2 (150 tokens, 10 blocks, 10 output
    tokens, so 9 decode steps that take no block) evicts 10 more. Request 3, X again, arrives during
    request 2's first decode step: its hit is X's first 25 blocks on the GPU and the next 39
    (up to 64 = (1,040 - 1) // 16) on the host. It starts loading at the end of that step: 39 blocks
    of 16 x 131,072 bytes at 1 GB/s, 81.8 ms, longer than request 2's remaining steps. Those steps
    take the cost model's time, no more (request 2 finishes at its prefill and 9 decode steps
    after it arrived); request 3 is computed alone once its load ends: 16 tokens over 1,040."""
    x, block = ((SHARED_PREFIX, 1040),), 16
    config = RunConfig(policy="chunked", num_gpu_blocks_override=100, kv_offload_gb=1.0, kv_offload_bandwidth=1.0)
    model = load_model(config.model)
    cost = build_cost_model(config, model, load_gpu(config.gpu))
    prefill = cost.step_time(StepShape.from_rows([(150, 150)]))
    decodes = [cost.step_time(StepShape.from_rows([(1, 150 + j)])) for j in range(1, 10)]
    arrival2 = 2.0
    arrival3 = arrival2 + prefill + decodes[0] / 2
    workload = Workload(prompt_tokens=np.array([1040, 1040, 150, 1040], dtype=np.int64),
                        output_tokens=np.array([1, 1, 10, 1], dtype=np.int64),
                        arrival=np.array([0.0, 1.0, arrival2, arrival3]), concurrency=None,
                        content=(x, ((UNIQUE + 1, 1040),), ((UNIQUE + 2, 150),), x))
    result = simulate(config, workload)
    requests = build_tables(result, tokens=False).requests
    assert requests["cached_tokens_gpu"].to_list() == [0, 0, 0, 25 * block]
    assert requests["cached_tokens_host"].to_list() == [0, 0, 0, 39 * block]
    finish = requests["finish"].to_numpy()
    end = arrival2 + prefill
    ends = []
    for duration in decodes:
        end += duration
        ends.append(end)
    assert finish[2] == pytest.approx(ends[-1], rel=1e-12)  # not one step waited for the load
    load_end = ends[0] + 39 * block * LLAMA_KV_BYTES_PER_TOKEN / 1e9
    assert ends[-1] < load_end
    alone = cost.step_time(StepShape.from_rows([(16, 1040)]))
    assert requests["ttft"].to_numpy()[3] == pytest.approx(load_end + alone - arrival3, rel=1e-12)


def test_a_host_tier_too_small_for_a_prefix_hits_only_what_it_holds() -> None:
    """The same cycle with a host tier of 40 blocks: a released prompt's blocks are evicted from its
    tail, so the last 40 stored, those the host keeps, are its prefix's first 40 blocks; a hit
    starts at the first block, and so from the sixth request on is those 40 blocks, never more."""
    n = 15
    block_bytes = LLAMA_KV_BYTES_PER_TOKEN * BLOCK
    config = RunConfig(policy="chunked", num_gpu_blocks_override=ROOM * (PREFIX + OWN) // BLOCK,
                       kv_offload_gb=40.5 * block_bytes / 1e9)
    result = simulate(config, cyclic_workload(n, ROOM + 1, PREFIX, OWN))
    host = build_tables(result, tokens=False).requests["cached_tokens_host"].to_numpy()
    assert (host <= 40 * BLOCK).all() and host[ROOM + 1:].max() == 40 * BLOCK


@needs_mooncake
def test_mooncake_with_a_host_tier_approaches_a_cache_that_never_evicts() -> None:
    """benchmarks.prefix_cache's Mooncake replay, shortened to 300 requests: one H100's cache finds
    much less than a GPU cache that holds every block; a host tier that holds every block brings
    the hit rate to within a percentage point of it, the host's part being what the GPU evicted."""
    from benchmarks.prefix_cache import mooncake_runs

    rates = {}
    for label, config in mooncake_runs(300, 0.2, "trace")[:3]:
        result = simulate(config)
        summary = summarize(result, build_tables(result, tokens=False))
        rates[label.split(" + ")[-1]] = summary
    on, host, unbounded = rates["on"], next(s for k, s in rates.items() if k.endswith("GB host")), rates[
        "on, GPU unbounded"]
    assert on["prefix_cache_hit_rate"] < 0.6 * unbounded["prefix_cache_hit_rate"]
    assert abs(host["prefix_cache_hit_rate"] - unbounded["prefix_cache_hit_rate"]) < 0.01
    assert host["prefix_cache_hit_rate_host"] > 0 and "kv_offload_blocks" not in on
    assert host["prefix_cache_hit_rate_gpu"] + host["prefix_cache_hit_rate_host"] == pytest.approx(
        host["prefix_cache_hit_rate"], rel=1e-12)


def test_per_tier_hits_add_up_and_kv_stays_within_both_tiers() -> None:
    """A squeezed GPU cache over shared prefixes with preemptions: each step's host hits are part of
    its hits, each request's host tokens part of its cached tokens, the summary's tiers add up to its
    hit rate, and the GPU never holds more blocks than it has (the engine asserts the host's)."""
    config = RunConfig(policy="continuous", concurrency=24, num_requests=400, prefix_len=600, num_prefixes=12,
                       input_len=500, num_gpu_blocks_override=700, kv_offload_gb=0.5)
    result = simulate(config)
    tables = build_tables(result, tokens=False)
    summary = summarize(result, tables)
    steps, requests = tables.steps, tables.requests
    assert summary["preemptions"] > 0 and summary["prefix_cache_host_hit_tokens"] > 0
    assert (steps["prefix_cache_host_hit_tokens"] <= steps["prefix_cache_hit_tokens"]).all()
    assert (requests["cached_tokens_host"] <= requests["cached_tokens"]).all()
    assert (requests["cached_tokens_gpu"] + requests["cached_tokens_host"] == requests["cached_tokens"]).all()
    assert summary["prefix_cache_host_hit_tokens"] == int(steps["prefix_cache_host_hit_tokens"].sum())
    assert summary["prefix_cache_hit_rate_gpu"] + summary["prefix_cache_hit_rate_host"] == pytest.approx(
        summary["prefix_cache_hit_rate"], rel=1e-12)
    assert int(steps["kv_blocks_used"].max()) <= 700  # type: ignore[arg-type]
    assert summary["completed"] == 400
    # With no tier the same run hits less.
    plain = simulate(replace(config, kv_offload_gb=0.0))
    assert summarize(plain, build_tables(plain, tokens=False))["prefix_cache_hit_rate"] < summary[
        "prefix_cache_hit_rate"]


@pytest.mark.parametrize(("settings", "named"), [
    (dict(enable_prefix_caching=False), "--kv-offload-gb 2 needs prefix caching"),
    (dict(policy="static"), "--kv-offload-gb 2 does not apply to --policy static"),
    (dict(num_replicas=2), "--kv-offload-gb 2 runs on one server"),
    (dict(kv_offload_gb=0.0, kv_offload_bandwidth=10.0), "--kv-offload-bandwidth 10 needs --kv-offload-gb"),
    (dict(kv_offload_gb=-1.0), "kv-offload-gb"),
    (dict(kv_offload_bandwidth=0.0), "kv-offload-bandwidth"),
])
def test_refused_where_it_does_not_apply(settings: dict[str, object], named: str) -> None:
    with pytest.raises(InputError, match=named):
        RunConfig(**{"kv_offload_gb": 2.0, **settings})  # type: ignore[arg-type]


@pytest.mark.parametrize(("args", "named"), [
    (["--kv-offload-gb", "0.001", "--prefix-len", "100"], "holds no KV block"),
    (["--kv-offload-gb", "1"], "needs a workload whose prompts share tokens"),
])
def test_refused_in_one_line_before_anything_is_written(args: list[str], named: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A tier too small for one block; a workload without prefix identity, which never evicts a
    cached block."""
    code, _, err = simulate_cli([*args, "--num-requests", "5", "--out", str(tmp_path / "run")], capsys)
    assert code != 0 and err.strip().count("\n") == 0 and named in err
    assert not (tmp_path / "run").exists()


def test_the_run_prints_and_reports_each_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.report.page import write_report

    out = tmp_path / "run"
    code, stdout, _ = simulate_cli(["--policy", "chunked", "--concurrency", "4", "--num-requests", "120",
                                    "--input-len", "512", "--output-len", "20", "--prefix-len", "1024",
                                    "--num-prefixes", "30", "--num-gpu-blocks-override", "600",
                                    "--kv-offload-gb", "2", "--out", str(out), "--no-tokens", "--quiet"], capsys)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())["summary"]
    gpu, host = summary["prefix_cache_hit_rate_gpu"], summary["prefix_cache_hit_rate_host"]
    assert host > 0 and f"{gpu:.2%} / {host:.2%}" in stdout
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests["cached_tokens_host"].sum() > 0
    page = write_report(out, tmp_path / "report.html").read_text()
    assert "of it on GPU / host (KV offload)" in page and "KV host tier (blocks / tokens)" in page


def test_kv_offload_is_a_sweep_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    code, stdout, _ = simulate_cli(["sweep", "--kv-offload-gb", "0,2", "--policy", "chunked", "--concurrency", "4",
                                    "--num-requests", "120", "--input-len", "512", "--output-len", "20",
                                    "--prefix-len", "1024", "--num-prefixes", "30", "--num-gpu-blocks-override",
                                    "600", "--jobs", "1", "--out", str(out)], capsys)
    assert code == 0, stdout
    rows = pl.read_parquet(out).sort("kv_offload_gb")
    assert rows["error"].null_count() == 2
    host = rows["prefix_cache_hit_rate_host"].to_numpy()
    assert host[0] == 0 and host[1] > 0
    assert np.diff(rows["prefix_cache_hit_rate"].to_numpy())[0] > 0


def test_each_gpu_loads_its_tensor_parallel_shard_over_its_own_link() -> None:
    """Under tensor parallelism 2 each GPU holds 4 of Llama-3.1-8B's 8 KV heads: a block it loads is
    half the bytes, over its own PCIe link (the profile's 64 GB/s), and N GB of host memory hold
    as many blocks as at TP 1 (every GPU offloads its shard of each block)."""
    from simulator.run.sizing import host_tier

    model, gpu = load_model("llama-3.1-8b"), load_gpu("h100_sxm")
    tiers = {tp: host_tier(RunConfig(tensor_parallel_size=tp, kv_offload_gb=100.0), model, gpu) for tp in (1, 2)}
    assert tiers[1] is not None and tiers[2] is not None
    assert tiers[1].block_bytes == LLAMA_KV_BYTES_PER_TOKEN * BLOCK == 2 * tiers[2].block_bytes
    assert tiers[1].blocks == tiers[2].blocks == int(100e9 // (LLAMA_KV_BYTES_PER_TOKEN * BLOCK))
    assert tiers[1].bandwidth == tiers[2].bandwidth == 64e9
    assert host_tier(RunConfig(), model, gpu) is None


def test_loads_and_preemptions_do_not_feed_each_other_for_ever() -> None:
    """A run hypothesis found: 1-token blocks, 211 of them, outputs of up to 187 tokens, a 1 MB/s
    host link. Preempted requests' KV is evicted to the host and loaded back, and loads that took
    blocks in steps that preempted made the running requests preempt each other without end (3,676
    preemptions each in 1e5 simulated s). Starting no load in a step that preempts (vLLM's rule),
    every request finishes within seconds."""
    config = RunConfig(policy="priority", max_num_seqs=3, max_num_batched_tokens=9, long_prefill_token_threshold=0,
                       block_size=1, num_gpu_blocks_override=211, kv_offload_gb=57.5 * LLAMA_KV_BYTES_PER_TOKEN / 1e9,
                       kv_offload_bandwidth=0.001, time_limit=1000.0)
    a, b, c = 2_199_023_255_552, 1_099_511_627_777, 1_099_511_627_776
    content = (((a, 3),), ((b, 2),), ((a, 3),), ((b, 4),), ((b, 3),), ((a + 5, 4),), ((c, 1), (a + 6, 2)),
               ((c, 1), (a + 7, 3)), ((a, 3),), ((c, 1), (a, 2)))
    workload = Workload(prompt_tokens=np.array([3, 2, 3, 4, 3, 4, 3, 4, 3, 3]),
                        output_tokens=np.array([169, 86, 53, 63, 187, 183, 126, 128, 102, 56]),
                        arrival=np.array([5.4e-05, 1.3e-04, 1.5e-04, 1.5e-04, 1.7e-04, 1.7e-04, 1.7e-04, 2.2e-04,
                                          3.2e-04, 3.2e-04]), concurrency=None, content=content)
    requests = build_tables(simulate(config, workload), tokens=False).requests
    assert requests["finished"].all()
    assert requests["cached_tokens_host"].sum() > 0
