"""The measured-kernel cost model against the measurements it was not given, and its physics.

The held-out tests rebuild the interpolators from the shipped H100 profile with some shapes left
out and predict those shapes: an independent check, since the predicted points never enter the
tables. Measured (H100, Llama-3.1-8B head configuration): median |error| 2.7% over 2,457 GEMMs
with n or k in {3584, 5120, 10240}; 1.3% decode attention at held-out contexts; 1.6% at a held-out
batch size; 3.0% prefill attention at held-out prompt lengths.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from simulator.config import RunConfig
from simulator.cost import (
    BatchCurves,
    Curve,
    GemmTable,
    MeasuredCost,
    RooflineCost,
    StepShape,
    build_cost_model,
    build_tables,
    measured_cost,
)
from simulator.deploy.hardware import load_gpu, load_profile
from simulator.deploy.model import LLAMA_3_1_8B
from simulator.errors import InputError

LLAMA_HEADS = (pl.col("num_heads") == 32) & (pl.col("num_kv_heads") == 8)


def median_error(predicted: list[float], measured: list[float]) -> float:
    return float(np.median(np.abs(np.array(predicted) / np.array(measured) - 1)))


@pytest.mark.parametrize("gpu", ["h100_sxm", "h200_sxm"])
def test_gemm_held_out_shapes(gpu: str) -> None:
    profile = load_profile(gpu)
    gemm = profile.tables["gemm"]
    held = [3584, 5120, 10240]
    is_held = pl.col("n").is_in(held) | pl.col("k").is_in(held)
    table = GemmTable(gemm.filter(~is_held), profile.gpu, 2)
    predicted, measured = [], []
    for (n, k), rows in gemm.filter(is_held).group_by("n", "k"):
        curve = table.curve("held out", int(n), int(k), [])  # type: ignore[call-overload]
        predicted += [curve.at(m, lambda m: 0.0, Counter()) for m in rows["m"].to_list()]
        measured += rows["latency"].to_list()
    assert len(measured) > 2000
    assert median_error(predicted, measured) < 0.05


@pytest.mark.parametrize("held", [{"context": [64, 512, 8192]}, {"batch_size": [32]}])
def test_decode_attention_held_out(held: dict[str, list[int]]) -> None:
    cost = measured_cost(LLAMA_3_1_8B, "h100_sxm")
    decode = load_profile("h100_sxm").tables["decode_attention"].filter(LLAMA_HEADS)
    (column, values), = held.items()
    curves = BatchCurves.from_frame("decode", decode.filter(~pl.col(column).is_in(values)), "context")
    test = decode.filter(pl.col(column).is_in(values))
    predicted = [curves.at(r["batch_size"], r["context"], cost.decode_roofline, Counter())
                 for r in test.iter_rows(named=True)]
    assert test.height >= 12
    assert median_error(predicted, test["latency"].to_list()) < 0.05


def test_prefill_attention_held_out_lengths() -> None:
    cost = measured_cost(LLAMA_3_1_8B, "h100_sxm")
    prefill = (load_profile("h100_sxm").tables["prefill_attention"].filter(LLAMA_HEADS)
               .with_columns(pairs=pl.col("new_tokens") * (pl.col("new_tokens") + 1) / 2))
    held = pl.col("new_tokens").is_in([256, 1536, 6144])
    curves = BatchCurves.from_frame("prefill", prefill.filter(~held), "pairs")
    test = prefill.filter(held)
    predicted = [curves.at(r["batch_size"], r["pairs"], cost.prefill_roofline, Counter())
                 for r in test.iter_rows(named=True)]
    assert test.height >= 20
    assert median_error(predicted, test["latency"].to_list()) < 0.06


def test_a_curve_past_its_last_point_at_its_own_rate_between_floor_and_roofline() -> None:
    # Two points, 0.8 ms per 1000 x on the last segment; at 3000 the extra 1000 costs the last rate
    # where the roofline's is slower, the roofline's where that is faster, and never under the floor.
    curve = Curve("k", (1000.0, 2000.0), (1.0, 1.8))
    record: Counter[str] = Counter()
    assert curve.at(3000, lambda x: 1e-3 * x, record) == pytest.approx(2.8)  # no floor: the roofline, as ever
    assert curve.at(3000, lambda x: 1e-3 * x, record, lambda x: 1e-4 * x) == pytest.approx(2.6)
    assert curve.at(3000, lambda x: 5e-4 * x, record, lambda x: 1e-4 * x) == pytest.approx(2.3)
    assert curve.at(3000, lambda x: 1e-3 * x, record, lambda x: 9e-4 * x) == pytest.approx(2.7)
    assert curve.at(1500, lambda x: 1e-3 * x, record, lambda x: 9e-4 * x) == pytest.approx(1.4)  # inside: measured
    assert record == Counter({"k above measured 2000": 4})


@pytest.mark.parametrize("gpu", ["h100_sxm_vllm", "h100_sxm_sglang", "h100_sxm_trtllm",
                                 "h200_sxm_vllm", "h200_sxm_sglang", "h200_sxm_trtllm"])
def test_decode_attention_past_the_measured_contexts_held_out(gpu: str) -> None:
    # Each stack's tables stop at a batch's largest context (vLLM's H200 rows at 2,048 tokens for
    # 128 sequences); leave out every batch's two largest (batch >= 32, Llama-3.1-8B's heads) and
    # price them from the rest, as a step past the tables is priced. The kernels' own last rate
    # (within 2-4x of the edge): median |error| 1.7-6.5% per stack, where the roofline's
    # profile-wide rate prices them 12-26% too slow.
    cost = measured_cost(LLAMA_3_1_8B, gpu)
    heads = LLAMA_HEADS & (pl.col("head_dim") == 128) & (pl.col("batch_size") >= 32)
    decode = load_profile(gpu).tables["decode_attention"].filter(heads)
    held = pl.col("context") >= pl.col("context").max().over("batch_size") // 2
    curves = BatchCurves.from_frame("decode", decode.filter(~held), "context")
    test = decode.filter(held)
    gpu_spec = load_gpu(gpu)
    least = LLAMA_3_1_8B.kv_bytes_per_token_per_layer / gpu_spec.datasheet_mem_bw
    own, roofline = ([curves.at(r["batch_size"], r["context"], cost.decode_roofline, Counter(), floor)
                      for r in test.iter_rows(named=True)] for floor in (lambda b, c: b * c * least, None))
    assert test.height >= 14
    measured = test["latency"].to_list()
    assert median_error(own, measured) < 0.08
    assert median_error(own, measured) < median_error(roofline, measured) / 1.5


@pytest.mark.parametrize(("model", "gpu", "tp"), [
    ("llama-3.1-8b", "h200_sxm_vllm", 1), ("qwen3-32b", "h100_sxm_trtllm", 2), ("minimax-m2.5", "h200_sxm_vllm", 8),
    ("gpt-oss-120b", "h100_sxm_sglang", 4)])
def test_decode_attention_never_reads_kv_faster_than_the_datasheet(model: str, gpu: str, tp: int) -> None:
    # Past the tables (and with a stand-in table of other heads: MiniMax-M2.5's one KV head per GPU
    # priced from two-head kernels), every further token of context a step reads costs at least
    # its KV bytes at the GPU's datasheet bandwidth, on every full-attention layer.
    from simulator.deploy.model import load_model

    rank = load_model(model).shard(tp)
    cost = measured_cost(load_model(model).deployed(None, "auto"), gpu, tp)
    layers = rank.num_layers - rank.sliding_layers
    batch = 64
    times = [cost.breakdown(StepShape.from_rows([(1, c)] * batch))["decode_attention"] for c in (20000, 40000)]
    per_token = batch * layers * rank.kv_bytes_per_token_per_layer / load_gpu(gpu).datasheet_mem_bw
    assert times[1] - times[0] >= 20000 * per_token * (1 - 1e-9)


def test_a_stand_in_prefill_tables_extrapolation_is_priced_in_the_ranks_own_heads() -> None:
    # MiniMax-M2.5 at TP 8 has one KV head per GPU, priced from two-head kernels scaled by 0.5. Past
    # the table, further query-key pairs cost the rank's own roofline (its six query heads), not
    # that roofline scaled by 0.5 again: the increment between two prompts past the table is the
    # full-attention layers' roofline increment, by hand from its FLOPs and bytes.
    from simulator.cost.contract import causal_pairs
    from simulator.deploy.model import load_model

    model = load_model("minimax-m2.5")
    cost = measured_cost(model.deployed(None, "auto"), "h200_sxm_vllm", 8)
    assert any(note.startswith("prefill attention:") and "scaled by 0.5" in note for note in cost.notes)
    rank, gpu = model.shard(8), load_gpu("h200_sxm_vllm")
    layers = rank.num_layers - rank.sliding_layers
    times = [cost.breakdown(StepShape.from_rows([(n, n)]))["prefill_attention"] for n in (200_000, 300_000)]
    assert any("prefill attention" in key and "above measured" in key for key in cost.extrapolated)

    def roofline(n: int) -> float:  # 4 h d FLOPs per pair, or Q, K, V and O read and written
        flops = causal_pairs(n, n) * 4 * rank.num_heads * rank.head_dim / gpu.attn_flops
        nbytes = n * (2 * rank.num_heads + 2 * rank.num_kv_heads) * rank.head_dim * rank.dtype_bytes / gpu.attn_bw
        return max(flops, nbytes)

    assert times[1] - times[0] == pytest.approx(layers * (roofline(300_000) - roofline(200_000)), rel=1e-9)


def test_gemms_flat_until_arithmetic_takes_over() -> None:
    curve = build_tables(LLAMA_3_1_8B, load_profile("h100_sxm")).layer_gemms[2][0]  # gate/up
    at = dict(zip(curve.xs, curve.ys, strict=True))
    assert at[64] == pytest.approx(at[1], rel=0.10)  # streaming 235 MB of weights either way
    assert at[8192] / at[4096] == pytest.approx(2.0, rel=0.10)  # compute-bound: linear in tokens


def test_decode_attention_linear_in_kv_bytes() -> None:
    cost = measured_cost(LLAMA_3_1_8B, "h100_sxm")
    step = [cost.breakdown(StepShape.from_rows([(1, context)] * 64))["decode_attention"]
            for context in (2000, 3000, 4000)]
    assert step[2] - step[1] == pytest.approx(step[1] - step[0], rel=0.10)


def test_step_time_is_the_sum_of_the_breakdown_and_ignores_empty_steps() -> None:
    cost = measured_cost(LLAMA_3_1_8B, "h100_sxm")
    shape = StepShape.from_rows([(1, 2300)] * 40 + [(512, 3000), (300, 300)])
    assert cost.step_time(shape) == pytest.approx(sum(cost.breakdown(shape).values()), rel=1e-12)
    assert cost.step_time(StepShape()) == 0.0


def test_extrapolation_beyond_the_measured_range_is_recorded() -> None:
    cost = measured_cost(LLAMA_3_1_8B, "h100_sxm")
    assert any("lm_head" in note for note in cost.notes)  # n = 128256 lies beyond the measured 65536
    cost.step_time(StepShape.from_rows([(2000, 2000)]))
    assert not cost.extrapolated
    inside = cost.step_time(StepShape.from_rows([(8192, 8192)]))
    beyond = cost.step_time(StepShape.from_rows([(16384, 16384)]))
    assert any("above measured 8192" in key for key in cost.extrapolated)
    assert beyond > 2 * inside  # GEMMs double, attention quadruples
    fresh = measured_cost(LLAMA_3_1_8B, "h100_sxm")
    assert not fresh.extrapolated  # records belong to one cost model, one run


@pytest.mark.parametrize("keep_shapes", [False, True])
def test_a_shape_priced_again_costs_and_records_what_a_fresh_model_does(keep_shapes: bool,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    # A cost model keeps the parts of a step that depend only on its tokens and sequences (and, shared
    # by servers in step, whole steps); a step of a shape it has seen (same batch, another context; a
    # step past the measured range; the very same shape) must cost and record exactly what a cost
    # model that never saw it does, step by step, and warn once per new extrapolation as it does.
    model = LLAMA_3_1_8B
    shapes = [StepShape(8, 8, 8 * c) for c in (900, 1300, 900, 5000)] + [StepShape.from_rows([(16384, 16384)])] * 2
    shapes += [StepShape.from_rows([(1, 3000)] * 8), StepShape(8, 8, 8 * 2000), StepShape(8, 8, 8 * 5000)]
    kept = measured_cost(model, "h100_sxm")
    kept.keep_shapes = keep_shapes
    records: Counter[str] = Counter()
    warned = []
    for shape in shapes:
        fresh = measured_cost(model, "h100_sxm")
        caplog.clear()
        time = kept.step_time(shape)
        warned += [r.getMessage() for r in caplog.records]
        assert time == fresh.step_time(shape)  # to the bit
        stepped = Counter(fresh.extrapolated)
        records.update(stepped)
        assert kept.extrapolated == records
        assert kept.breakdown(shape) == fresh.breakdown(shape)
        records.update(fresh.extrapolated - stepped)  # its breakdown's
    assert records and kept.extrapolated == records
    assert len(warned) == 1 and "above measured 8192" in warned[0]


def test_a_pool_of_several_servers_keeps_step_times_per_shape() -> None:
    from simulator.deploy.model import load_model
    from simulator.run.pools import build_pools
    from workloads import synthetic_workload

    workload = synthetic_workload(input_len=100, output_len=10, rate=1.0, num_requests=4, seed=0)
    for replicas, kept in ((1, False), (4, True)):
        config = RunConfig(cost="measured", num_replicas=replicas)
        [pool], _ = build_pools(config, load_model(config.model), load_gpu(config.gpu), workload)
        assert isinstance(pool.cost, MeasuredCost) and pool.cost.keep_shapes is kept


def test_tensor_parallel_halves_gemms_and_adds_all_reduces() -> None:
    shape = StepShape.from_rows([(1, 2300)] * 64)
    one = measured_cost(LLAMA_3_1_8B, "h100_sxm").breakdown(shape)
    two = measured_cost(LLAMA_3_1_8B, "h100_sxm", tensor_parallel_size=2).breakdown(shape)
    assert one["collectives"] == 0 and two["collectives"] > 0
    assert two["gemm"] < 0.7 * one["gemm"]
    assert two["decode_attention"] == pytest.approx(one["decode_attention"] / 2, rel=0.2)
    with pytest.raises(InputError, match="--tensor-parallel-size 3 does not divide"):
        measured_cost(LLAMA_3_1_8B, "h100_sxm", tensor_parallel_size=3)


NCCL_H100 = Path(__file__).resolve().parents[2] / "shared" / "reference" / "kernels" / "h100_sxm" / "nccl_perf.parquet"


@pytest.mark.skipif(not NCCL_H100.exists(), reason=f"reference measurements missing: {NCCL_H100}")
@pytest.mark.parametrize("cost", ["measured", "roofline"])
def test_without_the_custom_all_reduce_every_all_reduce_is_nccls(cost: str) -> None:
    # Llama-3.1-8B at TP 2, 16 decoding sequences: each all-reduce carries 16 x 4096 bf16 values
    # (128 KiB), a size NCCL was measured at on 2 GPUs; 32 layers x 2 all-reduces of that latency,
    # read here from the reference measurements rather than the profile built from them.
    nccl = pl.read_parquet(NCCL_H100).filter(
        (pl.col("op_name") == "all_reduce") & (pl.col("nccl_dtype") == "half") & (pl.col("num_gpus") == 2)
        & (pl.col("message_size") == 16 * 4096))
    expected = 2 * 32 * float(nccl["latency"].median()) * 1e-3  # ms
    shape = StepShape(16, 16, 16 * 1000)
    gpu = load_gpu("h100_sxm")

    def collectives(off: bool) -> float:
        config = RunConfig(cost=cost, tensor_parallel_size=2, disable_custom_all_reduce=off)
        return float(build_cost_model(config, LLAMA_3_1_8B, gpu).breakdown(shape)["collectives"])

    assert collectives(True) == pytest.approx(expected, rel=1e-9)
    assert collectives(False) < 0.7 * expected  # the custom all-reduce: under two thirds of NCCL's latency there


def test_without_nccl_measurements_the_flag_names_the_table(tmp_path: Path) -> None:
    folder = tmp_path / "gpu"
    folder.mkdir()
    source = load_profile("h100_sxm").path
    for name in source.iterdir():
        if name.name != "collectives_nccl.parquet":
            (folder / name.name).write_bytes(name.read_bytes())
    with pytest.raises(InputError, match=r"--disable-custom-all-reduce: profile .* no NCCL all-reduce"):
        measured_cost(LLAMA_3_1_8B, str(folder), tensor_parallel_size=2, disable_custom_all_reduce=True)
    measured_cost(LLAMA_3_1_8B, str(folder), tensor_parallel_size=2)  # the stack's all-reduce needs none


def test_build_cost_model_follows_the_config() -> None:
    gpu = load_gpu("h100_sxm")
    assert isinstance(build_cost_model(RunConfig(cost="roofline"), LLAMA_3_1_8B, gpu), RooflineCost)
    assert isinstance(build_cost_model(RunConfig(cost="measured"), LLAMA_3_1_8B, gpu), MeasuredCost)
    with pytest.raises(InputError, match="unknown --cost 'fast'"):
        RunConfig(cost="fast")


def test_bad_profiles_name_the_problem(tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "gpu"
    folder.mkdir()
    (folder / "roofline.json").write_text((load_profile("h100_sxm").path / "roofline.json").read_text())
    with pytest.raises(InputError, match=r"no profile\.json"):
        load_profile(str(folder))
    source = load_profile("h100_sxm").path
    for name in ("profile.json", "gemm.parquet", "prefill_attention.parquet", "decode_attention.parquet",
                 "elementwise.parquet", "collectives.parquet"):
        (folder / name).write_bytes((source / name).read_bytes())
    pl.read_parquet(source / "gemm.parquet").drop("k").write_parquet(folder / "gemm.parquet")
    with pytest.raises(InputError, match=r"gemm\.parquet' lacks k"):
        load_profile(str(folder))
    with pytest.raises(InputError, match="unknown GPU 'nowhere'"):
        load_profile("nowhere")
