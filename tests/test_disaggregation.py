"""Prefill and decode pools joined by a KV link: a transfer computed by hand, the link's queue, the
TTFT's parts per request, and the chapter's claim that disaggregation removes prefill stalls."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from simulator.config import RunConfig
from simulator.deploy.hardware import load_gpu
from simulator.errors import InputError
from simulator.fleet.transfer import kv_link
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import build_workload, simulate
from workloads import Workload

LLAMA_KV_BYTES = 32 * 8 * 128 * 2 * 2
"""Llama-3.1-8B in bf16: 32 layers x 8 KV heads x head_dim 128 x (K and V) x 2 bytes = 131072."""


def one_request(prompt: int, output: int, **settings: object) -> pl.DataFrame:
    workload = Workload(prompt_tokens=np.array([prompt]), output_tokens=np.array([output]),
                        arrival=np.array([0.0]), concurrency=None)
    result = simulate(RunConfig(policy="continuous", prefill_replicas=1, decode_replicas=1, **settings), workload)
    return build_tables(result).requests


def test_kv_transfer_by_hand() -> None:
    """1000 prompt tokens x 131072 bytes = 131,072,000 bytes at 128 GB/s is 1.024 ms, plus 0.5 ms."""
    link = kv_link(128.0, 5e-4, load_gpu("h100_sxm"), LLAMA_KV_BYTES)
    assert link.transfer_time(1000) == 131_072_000 / 128e9 + 5e-4
    assert link.transfer_time(1000) == pytest.approx(1.524e-3, rel=1e-12)
    row = one_request(1000, 10, kv_transfer_bandwidth=128.0, kv_transfer_latency=5e-4).row(0, named=True)
    assert row["transfer_end"] - row["transfer_start"] == pytest.approx(1.524e-3, rel=1e-9)
    assert row["transfer_start"] == row["prefill_end"]  # the link was free
    # Tensor parallelism: each of two ranks sends its half side by side; a TP-1 side holds it all.
    halves = one_request(1000, 10, kv_transfer_bandwidth=128.0, kv_transfer_latency=5e-4,
                         prefill_tensor_parallel_size=2, decode_tensor_parallel_size=2).row(0, named=True)
    assert halves["transfer_end"] - halves["transfer_start"] == pytest.approx(0.512e-3 + 5e-4, rel=1e-9)
    narrow = one_request(1000, 10, kv_transfer_bandwidth=128.0, kv_transfer_latency=5e-4,
                         decode_tensor_parallel_size=2).row(0, named=True)
    assert narrow["transfer_end"] - narrow["transfer_start"] == pytest.approx(1.524e-3, rel=1e-9)


def test_default_link_is_the_profiles_nvlink() -> None:
    """Defaults: the H100 profile's 450 GB/s and 10 us (aiconfigurator's system.yaml)."""
    row = one_request(2000, 10).row(0, named=True)
    assert row["transfer_end"] - row["transfer_start"] == pytest.approx(2000 * LLAMA_KV_BYTES / 450e9 + 1e-5,
                                                                         rel=1e-9)


def test_transfers_queue_on_the_link_and_ttft_adds_up() -> None:
    """Four prompts prefilled in one step leave together; the prefill server's link sends them one
    after another. TTFT = queue + prefill + wait for the link + transfer, for every request."""
    workload = Workload(prompt_tokens=np.array([2000] * 4), output_tokens=np.array([50] * 4),
                        arrival=np.zeros(4), concurrency=None)
    result = simulate(RunConfig(policy="continuous", prefill_replicas=1, decode_replicas=1,
                                kv_transfer_bandwidth=10.0, kv_transfer_latency=1e-3), workload)
    requests = build_tables(result).requests
    assert requests["prefill_end"].n_unique() == 1
    starts, ends = requests["transfer_start"].to_numpy(), requests["transfer_end"].to_numpy()
    assert (starts[1:] == ends[:-1]).all()
    each = 2000 * LLAMA_KV_BYTES / 10e9 + 1e-3
    assert ends - starts == pytest.approx(np.full(4, each), rel=1e-9)
    parts = (requests["queue"] + (requests["prefill_end"] - requests["scheduled"])
             + (requests["transfer_start"] - requests["prefill_end"])
             + (requests["transfer_end"] - requests["transfer_start"]))
    assert requests["ttft"].to_numpy() == pytest.approx(parts.to_numpy(), rel=1e-12)
    assert requests["finished"].all()
    assert (requests["decode_server"] == 1).all() and (requests["prefill_server"] == 0).all()


def test_disaggregation_removes_prefill_stalls() -> None:
    """The chapter's workload at 6 req/s, continuous batching. Colocated, the ITL p99 is a decode
    step stalled behind a prefill step (at least a 2000-token prefill step long). One prefill and
    one decode server: the decode server runs only decode steps and the ITL p99 lies within the
    decode steps' durations (the one gap per request that spans the transfer is under 1%)."""
    settings = dict(policy="continuous", rate=6.0, num_requests=1000)
    colocated = simulate(RunConfig(**settings))  # type: ignore[arg-type]
    tables = build_tables(colocated, tokens=False)
    prefill_steps = tables.steps.filter(pl.col("prefill_tokens") >= 2000)["duration"]
    assert summarize(colocated, tables)["p99_itl"] >= prefill_steps.min()

    split = simulate(RunConfig(prefill_replicas=1, decode_replicas=1, **settings))  # type: ignore[arg-type]
    tables = build_tables(split, tokens=False)
    summary = summarize(split, tables)
    decode_steps = tables.steps.filter(pl.col("server") == 1)
    assert decode_steps["prefill_tokens"].sum() == 0
    assert decode_steps["duration"].min() <= summary["p99_itl"] <= decode_steps["duration"].max()
    assert summary["p99_itl"] < prefill_steps.min()
    assert summary["completed"] == 1000 and summary["kept_up"]
    assert [s["role"] for s in summary["servers"]] == ["prefill", "decode"]
    assert summary["servers"][1]["p99_transfer"] == pytest.approx(2000 * LLAMA_KV_BYTES / 450e9 + 1e-5, rel=1e-6)


def test_decode_server_queues_when_its_kv_is_full() -> None:
    """A decode server with room for two requests' KV: the third waits in its queue (visible in its
    steps' num_waiting) until one finishes, however early its KV arrived."""
    workload = Workload(prompt_tokens=np.array([100] * 3), output_tokens=np.array([40] * 3),
                        arrival=np.zeros(3), concurrency=None)
    # 16-token blocks: a request needs ceil(140 / 16) = 9 at most; 18 blocks hold two.
    result = simulate(RunConfig(policy="chunked", prefill_replicas=1, decode_replicas=1,
                                num_gpu_blocks_override=18), workload)
    tables = build_tables(result, tokens=False)
    decode_steps = tables.steps.filter(pl.col("server") == 1)
    assert decode_steps["num_waiting"].max() >= 1
    requests = tables.requests
    assert requests["finished"].all() and requests["preemptions"].sum() == 0
    third = requests.row(2, named=True)
    first_finish = requests["finish"].min()
    assert third["transfer_end"] < first_finish < third["finish"]


def test_closed_loop_and_time_limit() -> None:
    """Closed-loop clients work across the pools (each sends its next request when its last one
    finishes on a decode server, or on its prefill server for a one-token output); a time limit
    leaves requests unfinished with their own lengths and no TTFT while their KV is unsent."""
    settings = dict(policy="chunked", prefill_replicas=2, decode_replicas=1, concurrency=8, num_requests=100,
                    input_len=500, output_len=20, output_len_dist="uniform:0.95", router="least-loaded",
                    kv_transfer_bandwidth=0.5)  # 0.13 s a transfer, so the limit falls in some
    assert len(single := [1 for n in build_workload(RunConfig(**settings)).output_tokens if n == 1]) > 0, single  # type: ignore[arg-type]
    result = simulate(RunConfig(**settings))  # type: ignore[arg-type]
    requests = build_tables(result, tokens=False).requests
    assert requests["finished"].all() and requests.height == 100
    single = requests.filter(pl.col("output_tokens") == 1)
    assert single["transfer_start"].is_null().all() and (single["decode_server"] == -1).all()
    cut = simulate(RunConfig(time_limit=float(requests["finish"].max()) / 2, **settings))  # type: ignore[arg-type]
    cut_requests = build_tables(cut, tokens=False).requests
    assert 0 < cut_requests["finished"].sum() < cut_requests.height
    workload_lengths = requests["output_tokens"].head(cut_requests.height)
    assert cut_requests["output_tokens"].equals(workload_lengths)
    unsent = cut_requests.filter(pl.col("transfer_end").is_null() & (pl.col("output_tokens") > 1))
    assert unsent.height > 0 and unsent["ttft"].is_null().all()


def test_pools_on_different_gpu_types() -> None:
    """--decode-gpu h200_sxm beside --gpu h100_sxm: the decode server's KV cache is sized from the
    H200's memory, the prefill server's from the H100's; each pool's steps are priced by its own
    profile (the same steps as in a fleet all of that GPU); the KV link is the run's --gpu's."""
    workload = Workload(prompt_tokens=np.array([2000] * 4), output_tokens=np.array([30] * 4),
                        arrival=np.array([0.0, 0.05, 0.1, 0.15]), concurrency=None)

    def run(**settings: object) -> tuple[list[int], pl.DataFrame]:
        result = simulate(RunConfig(policy="chunked", prefill_replicas=1, decode_replicas=1, **settings), workload)
        assert result.fleet is not None
        return result.fleet.kv_blocks, build_tables(result, tokens=False).steps

    (prefill_h100, _), steps_h100 = run(gpu="h100_sxm")
    (_, decode_h200), steps_h200 = run(gpu="h200_sxm")
    (prefill_mixed, decode_mixed), steps_mixed = run(gpu="h100_sxm", decode_gpu="h200_sxm")
    assert (prefill_mixed, decode_mixed) == (prefill_h100, decode_h200)
    # The weights and activations are the same on both GPUs, so the extra blocks are the extra memory:
    # (141 - 80) GiB x 0.9 / (16 tokens x 131072 bytes) = 28108.8.
    extra = (151_397_597_184 - 85_899_345_920) * 0.9 / (16 * LLAMA_KV_BYTES)
    assert math.floor(extra) <= decode_mixed - prefill_mixed <= math.ceil(extra)

    def durations(steps: pl.DataFrame, server: int) -> list[float]:
        return steps.filter(pl.col("server") == server)["duration"].to_list()

    assert durations(steps_mixed, 0) == durations(steps_h100, 0)
    assert durations(steps_mixed, 1) == durations(steps_h200, 1)
    assert sum(durations(steps_mixed, 1)) < sum(durations(steps_h100, 1))  # the H200 decodes faster
    (_, _), steps_prefill_h200 = run(gpu="h100_sxm", prefill_gpu="h200_sxm")
    assert durations(steps_prefill_h200, 0) == durations(steps_h200, 0)


@pytest.mark.parametrize(("settings", "message"), [
    ({"prefill_replicas": 1, "decode_replicas": 1, "decode_gpu": "h999"}, "--decode-gpu: unknown GPU 'h999'"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "prefill_gpu": "nope"}, "--prefill-gpu: unknown GPU 'nope'"),
    ({"decode_gpu": "h200_sxm"}, "--decode-gpu applies only to prefill/decode pools"),
])
def test_pool_gpu_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as error:
        RunConfig(**settings)  # type: ignore[arg-type]
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
