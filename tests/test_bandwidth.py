"""The decode-traffic bound on measured points (`simulator.sim2real.bandwidth`): tight on a uniform
schedule, exact on its KV and weight sums, never broken by servesim's own runs, and broken by the
measured rows that need a KV cache smaller than they were rerun with."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli.main import run
from simulator.cost.operators import weight_bytes_read
from simulator.deploy.model import load_model
from simulator.sim2real.bandwidth import (
    DecodeTraffic,
    decode_rate,
    decode_traffic,
    mean_kv_bytes,
    point_share,
    required_share,
)
from simulator.sim2real.compare import point_config, rerun, simulated_statistics
from simulator.sim2real.points import MeasuredPoint

UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "reference" / "serving" / (
    "aiconfigurator_silicon_h100_h200.csv")


@settings(max_examples=200, deadline=None)
@given(weights=st.floats(1e6, 1e11), kv=st.floats(1e3, 1e9), batch=st.integers(1, 512),
       bandwidth=st.floats(1e11, 1e13))
def test_a_uniform_lockstep_batch_at_exactly_the_bandwidth_needs_all_of_it(weights: float, kv: float, batch: int,
                                                                         bandwidth: float) -> None:
    # `batch` sequences, always all decoding, each step reading the weights and every sequence's KV
    # (one context for all) at exactly the bandwidth: the bound is met with equality.
    tpot = (weights + batch * kv) / bandwidth
    traffic = DecodeTraffic(weights, kv, kv, bandwidth)
    assert required_share(traffic, batch / tpot, tpot) == pytest.approx(1.0, rel=1e-6)
    assert required_share(traffic, batch / (tpot * 0.99), tpot * 0.99) > 1  # any faster is impossible
    assert required_share(traffic, batch / (tpot * 1.01), tpot * 1.01) < 1


def test_the_need_is_the_least_bandwidth_that_meets_the_bound() -> None:
    # 10 clients, 100 decode tokens each in 0.1 + 100 x 0.002 s: 10 x 100 / 0.3 = 3,333.3 tokens/s.
    traffic = DecodeTraffic(weights=1e9, kv_min=1e6, kv_mean=2e6, bandwidth=1e12)
    rate = 10 * 100 / 0.3
    share = required_share(traffic, rate, 0.002)
    need = share * 1e12
    # t B = W (1 + X K_min / (B - X K_mean)) holds with equality at the need, and the need is above
    # the KV reads alone.
    assert 0.002 * need == pytest.approx(1e9 * (1 + rate * 1e6 / (need - rate * 2e6)), rel=1e-9)
    assert need > rate * 2e6
    # Every sequence at one context: the weights once a TPOT and every token's KV once.
    same = DecodeTraffic(weights=1e9, kv_min=2e6, kv_mean=2e6, bandwidth=1e12)
    assert required_share(same, rate, 0.002) * 1e12 == pytest.approx(1e9 / 0.002 + rate * 2e6, rel=1e-9)
    assert share < required_share(same, rate, 0.002)  # shorter contexts at times need less
    assert required_share(traffic, 2 * rate, 0.002) > share  # more tokens a second at the same TPOT need more


@pytest.mark.parametrize("model", ["gpt-oss-120b", "llama-3.1-8b"])
@pytest.mark.parametrize(("input_len", "output_len"), [(1, 2), (100, 50), (100, 100), (120, 40), (5000, 300)])
@pytest.mark.parametrize("tp", [1, 4])
def test_mean_kv_is_the_mean_over_the_decode_contexts(model: str, input_len: int, output_len: int, tp: int) -> None:
    # gpt-oss-120b: half its layers keep a 128-token window; the contexts cross it in some cases.
    shard = load_model(model).shard(tp)
    contexts = range(input_len + 1, input_len + output_len)
    brute = sum(shard.kv_bytes_for_context(c) for c in contexts) / len(contexts)
    assert mean_kv_bytes(shard, input_len, output_len) == pytest.approx(brute, rel=1e-9)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_routed_experts_count_as_the_experts_a_token_reads_spread_over_the_gpus(tp: int) -> None:
    # The bound's weights: what a step of one token reads on each GPU (`decode_traffic`).
    model = load_model("gpt-oss-120b")
    # Routed to every expert, a step reads all of them: the whole shard.
    every = replace(model, num_experts_per_tok=model.num_experts)
    assert weight_bytes_read(every.shard(tp), 1) == pytest.approx(every.shard(tp).weight_bytes_per_step, rel=1e-9)
    # Routed to k of them: the shard less (experts - k) / experts of the routed weights.
    shard = model.shard(tp)
    routed = shard.moe_layers * shard.local_experts * shard.expert_params * shard.expert_weight_bytes
    unread = routed * (model.num_experts - model.num_experts_per_tok) / model.num_experts
    assert weight_bytes_read(shard, 1) == pytest.approx(shard.weight_bytes_per_step - unread, rel=1e-9)
    dense = load_model("llama-3.1-8b")
    assert weight_bytes_read(dense.shard(tp), 1) == dense.shard(tp).weight_bytes_per_step
    measured = point("gpt-oss-120b", tp, 4, 100, 10, ttft_mean=0.1, tpot_mean=0.01)
    traffic = decode_traffic(measured, point_config(measured, "h100_sxm_vllm"))
    assert traffic is not None and traffic.weights == pytest.approx(shard.weight_bytes_per_step - unread, rel=1e-9)


def point(model: str, tp: int, concurrency: int, input_len: int, output_len: int, backend: str = "vllm",
          quantization: str | None = None, **measured: float) -> MeasuredPoint:
    return MeasuredPoint(name="p", group="g", model=model, gpu="h100_sxm", tensor_parallel_size=tp,
                         quantization=quantization, num_requests=3 * concurrency, warmup=concurrency,
                         concurrency=concurrency, rate=None, burstiness=1.0, input_lens=(input_len,),
                         output_lens=(output_len,), measured=measured, backend=backend)


@settings(max_examples=12, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "qwen3-32b", "gpt-oss-120b"]), tp=st.sampled_from([1, 2, 4]),
       concurrency=st.integers(1, 48), input_len=st.integers(16, 3000), output_len=st.integers(8, 40),
       gpu=st.sampled_from(["h100_sxm_vllm", "h200_sxm_vllm"]))
def test_servesim_s_own_closed_loops_never_need_more_than_the_bandwidth(model: str, tp: int, concurrency: int,
                                                                       input_len: int, output_len: int,
                                                                       gpu: str) -> None:
    # servesim's measured kernels read no faster than the datasheet (tests/test_profile_physics.py),
    # so its own runs, taken as measurements, must pass the bound.
    sent = point(model, tp, concurrency, input_len, output_len, ttft_mean=1.0, tpot_mean=1.0)
    simulated = simulated_statistics(rerun(sent, gpu), {"ttft_mean", "tpot_mean"})
    measured = replace(sent, measured=simulated)
    share = point_share(measured, point_config(measured, gpu))
    assert 0 < share <= 1


def test_the_decode_rate_is_the_measured_one_where_the_file_gives_it() -> None:
    # 4 clients, 10 tokens each in 0.1 + 9 x 0.01 s: 4 x 9 / 0.19 decode tokens a second, in a
    # closed loop; a file's throughputs say it directly, the first token of each request not counted.
    closed = point("llama-3.1-8b", 1, 4, 100, 10, ttft_mean=0.1, tpot_mean=0.01)
    assert decode_rate(closed) == pytest.approx(4 * 9 / 0.19)
    measured = closed.measured | {"output_throughput": 150.0, "request_throughput": 15.0}
    assert decode_rate(replace(closed, measured=measured)) == pytest.approx(135.0)
    assert decode_rate(replace(closed, measured=closed.measured | {"output_throughput": 150.0})) == pytest.approx(135.0)
    assert decode_rate(replace(closed, output_lens=(1,), measured={"ttft_mean": 0.0, "tpot_mean": 0.01})) is None
    opened = replace(closed, concurrency=None, rate=2.0)  # an open loop: checked only with its throughput
    assert decode_rate(opened) is None
    config = point_config(closed, "h100_sxm_vllm")
    assert 0 < point_share(replace(opened, measured=measured), config) < 1


def test_what_is_not_checked_is_nan() -> None:
    closed = point("llama-3.1-8b", 1, 4, 100, 10, ttft_mean=0.1, tpot_mean=0.01)
    config = point_config(closed, "h100_sxm_vllm")
    assert point_share(closed, config) < 1
    for unchecked in (replace(closed, concurrency=None, rate=2.0), replace(closed, attention_dp_size=2),
                      replace(closed, output_lens=(10, 12)), replace(closed, measured={"ttft_mean": 0.1})):
        assert math.isnan(point_share(unchecked, config))
    assert math.isnan(point_share(closed, replace(config, speculative_method="ngram", num_speculative_tokens=2,
                                                                spec_acceptance="0.5")))


def test_compare_names_the_points_faster_than_their_gpus_memory(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # Qwen3-32B in bf16 over 2 H100s: 32 GB of weights per GPU, 9.8 ms a step at 3.35 TB/s; a
    # measured 1 ms TPOT is impossible, 30 ms is not.
    rows = [{"id": name, "backend": "vllm", "backend_version": "0.12.0", "model_path": "Qwen/Qwen3-32B",
             "system": "h100_sxm", "precision": "", "gemm_quant_mode": "", "isl": "1024", "osl": "16",
             "concurrency": "4", "tp_size": "2", "silicon_ttft_ms": "150", "silicon_tpot_ms": tpot}
            for name, tpot in (("slow_enough", "30"), ("too_fast", "1"))]
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    codes: list[int] = []
    run(["compare", str(path), "--jobs", "1", "--quiet"], exit=codes.append)
    out = capsys.readouterr().out
    assert codes == [0]
    flagged = out.split("decode traffic: ", 1)[1].split("\n\n", 1)[0]
    assert flagged.startswith("1 of 2 checked points")
    assert "too_fast" in flagged and "slow_enough" not in flagged


@pytest.mark.skipif(not UPSTREAM.exists(), reason=f"reference table missing: {UPSTREAM}")
def test_the_tables_fp8_qwen_rows_at_tp_1_and_2_need_an_fp8_kv_cache() -> None:
    # vLLM 0.12 serving Qwen3-32B with fp8 weights, 4,000 + 1,000 tokens: TP 1 at 24 clients and TP 2
    # at 48 measured TPOTs of 16.9 and 11.6 ms. With the bf16 KV cache vLLM's `auto` gives, the
    # decode reads more than an H100 can; with fp8 KV it fits. TP 8 fits either way.
    from simulator.sim2real.measured import read_measured

    wanted = {"qwen3_32b_qwen3_32b_h100_sxm_vllm_agg_4000x1000_c_tp1_0_epnone_4": 1,
              "qwen3_32b_qwen3_32b_h100_sxm_vllm_agg_4000x1000_c_tp2_0_epnone_3": 2,
              "qwen3_32b_qwen3_32b_h100_sxm_vllm_agg_4000x1000_c_tp8_0_epnone_1": 8}
    found = {p.name: p for p in read_measured(UPSTREAM).points if p.name in wanted}
    assert {p.tensor_parallel_size for p in found.values()} == set(wanted.values())
    for name, tp in wanted.items():
        measured = found[name]
        config = point_config(measured, "h100_sxm_vllm")
        as_rerun = point_share(measured, config)
        with_fp8 = point_share(measured, replace(config, kv_cache_dtype="fp8"))
        assert config.kv_cache_dtype == "auto" and with_fp8 < 1
        assert (as_rerun > 1) == (tp < 8), (name, as_rerun)
