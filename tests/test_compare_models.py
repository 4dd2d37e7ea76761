"""`simulate compare` on the new models' rows of aiconfigurator's table: how a row's deployment maps
onto servesim's settings (data-parallel attention, expert parallelism, a checkpoint's own 4-bit
experts, the table's squared workers, disaggregated rows without worker counts), each against a
hand-worked case, and how many of the aggregated rows are rerun."""

from __future__ import annotations

import csv
import statistics
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from test_compare import write_csv
from test_compare_formats import AGG, DISAGG, MODELS, UPSTREAM, needs_upstream

from simulator.deploy.backends import bench_scheduler, stack_defaults
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.deploy.resolve import ModelResolver
from simulator.errors import InputError
from simulator.run.pools import build_pools, pool_configs
from simulator.run.sizing import gpu_shard, kv_cache_blocks
from simulator.sim2real.compare import Scheduler, default_profile, point_config, point_workload
from simulator.sim2real.measured import read_measured
from simulator.sim2real.points import Reading
from simulator.sim2real.silicon import NAMES_TP, SQUARED_ID, TWIN_KEY, unsquared

pytestmark = needs_upstream
NEW = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3", "moonshotai/Kimi-K2.5", "openai/gpt-oss-120b",
       "MiniMaxAI/MiniMax-M2.5")
PARALLEL = ("batch_size", "tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")


def read(tmp_path: Path, *rows: dict[str, str]) -> Reading:
    return read_measured(write_csv(tmp_path / "silicon.csv", *rows), resolver=ModelResolver(MODELS))


def test_a_data_parallel_row_is_one_server_per_rank_sharing_its_experts(tmp_path: Path) -> None:
    # DeepSeek-R1 on 8 GPUs as TensorRT-LLM ran it: attention data parallel 8 (TP 1 each), experts
    # spread over all 8; batch_size 4 is each rank's, so the client ran 4 x 8 = 32 requests at once.
    row = AGG | {"model_path": "deepseek-ai/DeepSeek-R1", "backend": "trtllm", "silicon_data_source": "",
                 "precision": "fp8", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "batch_size": "4",
                 "tp_size": "1", "attention_dp_size": "8", "moe_tp_size": "1", "moe_ep_size": "8"}
    point = read(tmp_path, row).points[0]
    assert point.concurrency == 32 and (point.warmup, point.num_requests) == (32, 320)
    config = point_config(point, "h200_sxm")
    assert (config.tensor_parallel_size, config.data_parallel_size, config.num_replicas) == (1, 8, 8)
    assert config.enable_expert_parallel and config.quantization is None  # the checkpoint's own block fp8
    model = load_model(config.model)
    # Each GPU holds 256 / 8 = 32 routed experts whole; the dense layers and attention unsplit.
    assert gpu_shard(config, model).expert_parallel == 8
    assert model.num_experts // 8 == 32


def test_a_speculating_rerun_is_the_same_deployment_with_every_server_verifying(tmp_path: Path) -> None:
    """`Scheduler.speculation` (compare_models' --speculative) adds speculative decoding to a row's
    deployment and changes nothing else: the stack's own scheduler, the 8 data-parallel ranks as 8
    servers, each verifying with the same settings."""
    row = AGG | {"model_path": "deepseek-ai/DeepSeek-R1", "backend": "trtllm", "silicon_data_source": "",
                 "precision": "fp8", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "batch_size": "4",
                 "tp_size": "1", "attention_dp_size": "8", "moe_tp_size": "1", "moe_ep_size": "8"}
    point = read(tmp_path, row).points[0]
    plain = point_config(point, "h200_sxm")
    config = point_config(point, "h200_sxm", scheduler=Scheduler(speculation=("mtp", 1, "0.85")))
    assert (config.speculative_method, config.num_speculative_tokens, config.spec_acceptance) == ("mtp", 1, "0.85")
    assert replace(config, speculative_method=None, num_speculative_tokens=None, spec_acceptance=None) == plain
    model = load_model(config.model)
    [pool], _ = build_pools(config, model, load_gpu(config.gpu), point_workload(point))
    assert len(pool.policies) == 8 and pool.speculation is not None
    assert (pool.speculation.num_tokens, pool.speculation.acceptance) == (1, (0.85,))


def test_a_dense_rows_attention_data_parallelism_is_replicas(tmp_path: Path) -> None:
    point = read(tmp_path, AGG | {"attention_dp_size": "2", "batch_size": "3", "silicon_data_source": ""}).points[0]
    config = point_config(point, "h100_sxm")
    assert point.concurrency == 6
    assert (config.num_replicas, config.data_parallel_size, config.enable_expert_parallel) == (2, 1, False)


def test_a_tensorrt_llm_server_of_a_block_fp8_checkpoint_stores_its_kv_in_fp8(tmp_path: Path) -> None:
    # The table's DeepSeek-R1 TensorRT-LLM server at 128 clients of 1,024 + 8,192 tokens (TP 8,
    # experts over 8) measured a 1.4 s TTFT and 23 ms TPOT: all 128 ran at once, 128 x 9,216 tokens
    # of KV. The latent is each TP rank's whole: 61 layers x (512 + 64) elements a token, 70 kB in
    # bf16, 35 kB in fp8; bf16 cannot hold them beside 1/8 of the weights, fp8 can.
    row = AGG | {"model_path": "deepseek-ai/DeepSeek-R1", "backend": "trtllm", "system": "h200_sxm",
                 "silicon_data_source": "silicon_concurrency=128", "precision": "fp8", "gemm_quant_mode": "fp8",
                 "moe_quant_mode": "fp8", "isl": "1024", "osl": "8192", "batch_size": "128", "tp_size": "8",
                 "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "8"}
    point = read(tmp_path, row).points[0]
    trtllm = Scheduler.of(bench_scheduler("trtllm", 1024, 128))
    config = point_config(point, "h200_sxm_trtllm", scheduler=trtllm)
    assert config.quantization is None and config.kv_cache_dtype == "fp8"  # the checkpoint's own block fp8
    model, gpu = load_model(config.model), load_gpu(config.gpu)
    assert gpu_shard(config, model).kv_bytes_per_token == 61 * (512 + 64) * 1
    need = 128 * (1024 + 8192)
    held = {dtype: kv_cache_blocks(replace(config, kv_cache_dtype=dtype), model, gpu, 1024) * config.block_size
            for dtype in ("auto", "fp8")}
    assert held["auto"] < need <= held["fp8"]
    # SGLang's servers of the same checkpoint keep the model's dtype (its stock `auto`), and so do
    # TensorRT-LLM's disaggregated ones, which the data does not say otherwise of.
    sglang = point_config(replace(point, backend="sglang"), "h200_sxm_sglang",
                          scheduler=Scheduler.of(stack_defaults("sglang")))
    assert sglang.kv_cache_dtype == "auto"
    assert point_config(replace(point, mode="disagg"), "h200_sxm_trtllm", scheduler=trtllm).kv_cache_dtype == "auto"


@pytest.mark.parametrize(("model_path", "gemm", "expert_dtype"), [
    ("openai/gpt-oss-120b", "nvfp4", "mxfp4"), ("moonshotai/Kimi-K2.5", "int4_wo", "int4")])
def test_a_4bit_row_on_a_4bit_checkpoint_runs_the_checkpoints_own_weights(tmp_path: Path, model_path: str,
                                                                          gemm: str, expert_dtype: str) -> None:
    row = AGG | {"model_path": model_path, "backend": "vllm", "precision": "fp4", "gemm_quant_mode": gemm,
                 "moe_quant_mode": gemm, "tp_size": "8", "moe_tp_size": "8"}
    point = read(tmp_path, row).points[0]
    assert point.quantization is None
    model = load_model(point.model).deployed(point.quantization, "auto")
    assert model.expert_dtype == expert_dtype


def test_gpt_oss_4bit_weights_are_about_the_size_openai_ships(tmp_path: Path) -> None:
    # gpt-oss-120b: 116.8 B parameters, of which the routed experts (36 layers x 128 experts x 3
    # x 2880 x 2880 = 114.7 B) are mxfp4: 4 bits plus an 8-bit scale per 32, 4.25 bits; the rest
    # (about 2.1 B) bf16. So about 114.7e9 x 4.25 / 8 + 2.1e9 x 2 = 65.1 GB (vLLM's gpt-oss post:
    # 63 GB); in 16 bits it would be 234 GB.
    row = AGG | {"model_path": "openai/gpt-oss-120b", "backend": "vllm", "precision": "fp4",
                 "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4", "tp_size": "1", "moe_tp_size": "1"}
    point = read(tmp_path, row).points[0]
    weights = load_model(point.model).deployed(point.quantization, "auto").weight_bytes
    assert 60e9 < weights < 70e9, weights


def test_block_fp8_of_a_16bit_checkpoint_is_block_fp8_weights(tmp_path: Path) -> None:
    point = read(tmp_path, AGG | {"precision": "fp8", "gemm_quant_mode": "fp8_block"}).points[0]
    assert point.quantization == "fp8_block"
    bf16 = load_model(point.model)
    deployed = bf16.deployed("fp8_block", "auto")
    # The linear layers one byte a weight instead of two; the embeddings and the untied LM head
    # (2 x 151,936 x 5,120 bf16, 3.11 GB) stay. Block fp8 adds a 4-byte scale per 128 x 128 block
    # of the ~31.2 B linear weights: ~7.6 MB more than per-tensor fp8.
    assert deployed.weight_dtype == "fp8_block"
    embeddings = 2 * 151_936 * 5_120 * 2
    expected = (bf16.weight_bytes - embeddings) / 2 + embeddings
    assert abs(bf16.deployed("fp8", "auto").weight_bytes - expected) / expected < 1e-4
    scales = deployed.weight_bytes - bf16.deployed("fp8", "auto").weight_bytes
    assert 7.4e6 < scales < 7.8e6, scales


@pytest.mark.parametrize(("row_id", "given", "meant"), [
    ("x_agg_1024x1024_c64_tp8_ep8_953", (64, 1, 8, 8, 64), (8, 1, 1, 8, 64)),
    ("x_agg_1024x1024_c256_tp8_ep8_2011", (1, 64, 8, 8, 4), (1, 8, 1, 8, 32)),
    ("x_agg_8192x1024_c16_tp4_ep4_926", (16, 1, 4, 4, 16), (4, 1, 1, 4, 16)),
    ("x_agg_1024x1024_c32_tp4_ep4_1342", (4, 4, 1, 16, 8), (4, 1, 1, 4, 32)),
    # An id that names no parallelism: the squared columns alone.
    ("dsr1_h200_trtllm_fp8_agg_1024x1024_c64_cfg181", (64, 1, 8, 8, 64), (8, 1, 1, 8, 64)),
    ("dsr1_h200_trtllm_fp8_agg_8192x1024_c64_cfg183", (1, 64, 8, 8, 1), (1, 8, 1, 8, 8)),
    # Consistent rows stay as they are: 4 GPUs of MoE TP 2 x EP 2 (named, or not), TP 8 of MoE TP 8.
    ("x_agg_1024x1024_c8_tp4_ep2_1", (4, 1, 2, 2, 8), (4, 1, 2, 2, 8)),
    ("x_agg_4000x1000_c320_tp4_ep2", (4, 1, 2, 2, 80), (4, 1, 2, 2, 80)),
    ("dsr1_h200_trtllm_fp8_agg_1024x1024_c4_cfg83", (8, 1, 8, 1, 4), (8, 1, 8, 1, 4)),
])
def test_a_squared_worker_is_read_as_the_deployment_its_id_names(row_id: str, given: tuple[int, ...],
                                                                 meant: tuple[int, ...]) -> None:
    assert unsquared(row_id, *given) == meant


def test_the_squared_rows_repair_agrees_with_the_same_measurements_earlier_row() -> None:
    # The table holds some measurements twice, from two source files: where one says N x N GPUs,
    # the other (same lengths, same TTFT and TPOT to the microsecond) says the N GPUs the id names.
    with UPSTREAM.open() as file:
        table = [r for r in csv.DictReader(file) if r["mode"] == "agg"]
    same = defaultdict(list)
    for r in table:
        same[(r["model_path"], r["system"], r["isl"], r["osl"], r["silicon_ttft_ms"][:9], r["silicon_tpot_ms"][:9])
             ].append(r)
    checked = 0
    for rows in same.values():
        shapes = {tuple(unsquared(r["id"], *(int(r[c] or 1) for c in ("tp_size", "attention_dp_size",
                                                                       "moe_tp_size", "moe_ep_size",
                                                                       "batch_size")))) for r in rows}
        if len(rows) > 1 and len({tuple(r[c] for c in PARALLEL) for r in rows}) > 1:
            assert len(shapes) == 1, [r["id"] for r in rows]
            checked += 1
    assert checked >= 30


@needs_upstream
def test_a_repaired_row_is_the_deployment_its_remeasurement_in_the_earlier_file_names() -> None:
    # Some measurements were run again for a later source file whose columns square the worker
    # (tp_size 4, attention_dp_size 4, moe_ep_size 16 for MiniMax-M2.5 on 4 H100s); the earlier
    # file's row of the same server, lengths and concurrency names its N GPUs, and the two
    # measured TPOTs agree as one deployment's would (a 16-GPU server would decode far faster).
    with UPSTREAM.open() as file:
        table = [r for r in csv.DictReader(file) if r["mode"] == "agg" and "silicon_concurrency=" in
                 r["silicon_data_source"]]

    def columns(r: dict[str, str]) -> tuple[int, ...]:
        return tuple(int(r[c] or 1) for c in ("tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
                                              "batch_size"))

    def key(r: dict[str, str]) -> tuple[str, ...]:
        noted = r["silicon_data_source"].split("silicon_concurrency=")[1].split(";")[0]
        named = SQUARED_ID.search(r["id"])  # the deployment the id names, tpN_epM
        return (r["model_path"], r["system"], r["backend"], r["backend_version"], r["isl"], r["osl"], noted,
                named.groups() if named else ("", ""))

    plain = defaultdict(list)
    for r in table:
        if unsquared(r["id"], *columns(r)) == columns(r):
            plain[key(r)].append(r)
    ratios = []
    for r in table:
        repaired = unsquared(r["id"], *columns(r))
        if repaired == columns(r):
            continue
        for twin in plain[key(r)]:
            assert columns(twin) == repaired, (r["id"], twin["id"])
            ratios.append(float(r["silicon_tpot_ms"]) / float(twin["silicon_tpot_ms"]))
    # Most twins are the same numbers copied; a few were measured again and moved (up to +61%).
    assert len(ratios) >= 60
    assert statistics.median(abs(x - 1) for x in ratios) < 0.01
    assert sum(abs(x - 1) < 0.05 for x in ratios) >= 0.9 * len(ratios)


@needs_upstream
def test_squared_rows_whose_ids_name_nothing_decode_as_the_same_stacks_n_gpu_rows() -> None:
    # DeepSeek-V3 on TensorRT-LLM (ids `..._cfg181`) says tp_size 64 with MoE TP 8 x EP 8 and names
    # no parallelism; the same stack's rows of the same model, GPU, lengths and clients on 8 GPUs
    # (TP 8) measured the same TPOTs, where a 64-GPU server would decode several times faster.
    with UPSTREAM.open() as file:
        table = [r for r in csv.DictReader(file) if r["mode"] == "agg" and "silicon_concurrency=" in
                 r["silicon_data_source"]]

    def gpus(r: dict[str, str]) -> int:
        return int(r["tp_size"] or 1) * int(r["attention_dp_size"] or 1)

    def key(r: dict[str, str]) -> tuple[str, ...]:
        noted = r["silicon_data_source"].split("silicon_concurrency=")[1].split(";")[0]
        return r["model_path"], r["system"], r["backend"], r["isl"], r["osl"], noted

    eight = defaultdict(list)
    for r in table:
        if gpus(r) == 8:
            eight[key(r)].append(float(r["silicon_tpot_ms"]))
    ratios = [float(r["silicon_tpot_ms"]) / tpot for r in table
              if gpus(r) == 64 and not NAMES_TP.search(r["id"]) for tpot in eight[key(r)]]
    assert len(ratios) >= 12
    assert all(abs(x - 1) < 0.05 for x in ratios), ratios


def test_a_disaggregated_row_without_workers_is_one_prefill_and_one_decode_worker(tmp_path: Path) -> None:
    row = DISAGG | {"model_path": "deepseek-ai/DeepSeek-R1", "backend": "trtllm", "precision": "fp8",
                    "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8",
                    "silicon_data_source": "source_file=2026-03-25.csv; silicon_concurrency=13",
                    "prefill_batch_size": "", "prefill_num_workers": "", "prefill_tp_size": "8",
                    "prefill_moe_tp_size": "1", "prefill_moe_ep_size": "8", "decode_batch_size": "",
                    "decode_num_workers": "", "decode_tp_size": "8", "decode_moe_tp_size": "1",
                    "decode_moe_ep_size": "8"}
    reading = read(tmp_path, row, row | {"id": "d2", "silicon_data_source": "source_file=2026-03-25.csv"})
    point = reading.points[0]
    assert point.concurrency == 13
    config = point_config(point, "h200_sxm")
    assert (config.prefill_replicas, config.decode_replicas) == (1, 1)
    assert (config.prefill_tensor_parallel_size, config.decode_tensor_parallel_size) == (8, 8)
    assert config.prefill_enable_expert_parallel and config.decode_enable_expert_parallel
    # Without its concurrency either, nothing says how many clients ran: skipped.
    assert "without prefill_num_workers nor its concurrency" in reading.skipped[0][1]


def test_a_disaggregated_row_without_workers_takes_those_of_its_twin(tmp_path: Path) -> None:
    # The same measurement (GPU, stack, lengths, TTFT and TPOT cell for cell) given again with its
    # pools: 2 prefill workers of TP 8, 3 decode workers of 8 attention-DP ranks of batch 4 (96
    # clients). A row whose TPOT differs in its last digit is another measurement: 1 and 1.
    bare = DISAGG | {"model_path": "deepseek-ai/DeepSeek-R1", "backend": "trtllm", "system": "h200_sxm",
                     "precision": "fp8", "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8",
                     "silicon_data_source": "silicon_concurrency=96", "silicon_ttft_ms": "875.5077142391302",
                     "silicon_tpot_ms": "16.264664318900248", "prefill_batch_size": "", "prefill_num_workers": "",
                     "prefill_tp_size": "8", "prefill_moe_tp_size": "1", "prefill_moe_ep_size": "8",
                     "decode_batch_size": "", "decode_num_workers": "", "decode_tp_size": "8",
                     "decode_moe_tp_size": "1", "decode_moe_ep_size": "8"}
    twin = bare | {"id": "d2", "model_path": "deepseek-ai/DeepSeek-V3", "silicon_data_source": "",
                   "prefill_batch_size": "1", "prefill_num_workers": "2", "decode_batch_size": "4",
                   "decode_num_workers": "3", "decode_tp_size": "1", "decode_attention_dp_size": "8"}
    other = bare | {"id": "d3", "silicon_tpot_ms": "16.264664318900249"}
    points = {p.name: p for p in read(tmp_path, bare, twin, other).points}
    config = point_config(points["d1"], "h200_sxm")
    assert points["d1"].concurrency == 96
    assert (config.prefill_replicas, config.prefill_tensor_parallel_size) == (2, 8)
    assert (config.decode_replicas, config.decode_tensor_parallel_size, config.decode_data_parallel_size) == (3, 1, 8)
    alone = point_config(points["d3"], "h200_sxm")
    assert (alone.prefill_replicas, alone.decode_replicas) == (1, 1)
    # Its error is reported apart: a guessed deployment is not averaged with stated ones.
    assert points["d1"].group == "deepseek-r1 h200_sxm trtllm disagg"
    assert points["d3"].group == "deepseek-r1 h200_sxm trtllm disagg (workers assumed)"


def test_every_twin_in_the_table_ran_the_clients_its_bare_row_notes() -> None:
    # A twin's decode batch x workers x attention-DP ranks is the bare row's silicon_concurrency.
    with UPSTREAM.open() as file:
        table = [r for r in csv.DictReader(file) if r["mode"] == "disagg"]
    given = {tuple(r[c] for c in TWIN_KEY): r for r in table if r["decode_num_workers"].strip()}
    checked = 0
    for r in table:
        twin = given.get(tuple(r[c] for c in TWIN_KEY))
        if r["decode_num_workers"].strip() or twin is None:
            continue
        noted = int(r["silicon_data_source"].split("silicon_concurrency=")[1].split(";")[0])
        assert noted == (int(twin["decode_batch_size"]) * int(twin["decode_num_workers"])
                         * int(twin["decode_attention_dp_size"] or 1)), r["id"]
        checked += 1
    assert checked >= 40


def test_a_disaggregated_pool_with_data_parallel_attention_is_one_server_per_rank(tmp_path: Path) -> None:
    # DeepSeek-V3 as SGLang ran it on 16 H200: one prefill worker of TP 8 with its experts split
    # (moe_tp 8, no EP), one decode worker of 8 data-parallel attention ranks of TP 1 sharing
    # experts spread over all 8; decode_batch_size 16 is each rank's: 16 x 1 x 8 = 128 clients.
    row = DISAGG | {"model_path": "deepseek-ai/DeepSeek-V3", "backend": "sglang", "system": "h200_sxm",
                    "silicon_data_source": "", "precision": "fp8_block", "gemm_quant_mode": "fp8_block",
                    "moe_quant_mode": "fp8_block", "prefill_num_workers": "1", "prefill_tp_size": "8",
                    "prefill_moe_tp_size": "8", "prefill_moe_ep_size": "1", "decode_num_workers": "1",
                    "decode_batch_size": "16", "decode_tp_size": "1", "decode_attention_dp_size": "8",
                    "decode_moe_tp_size": "1", "decode_moe_ep_size": "8"}
    reading = read(tmp_path, row)
    assert not reading.skipped, reading.skipped
    point = reading.points[0]
    assert point.concurrency == 128
    config = point_config(point, "h200_sxm")
    assert (config.prefill_replicas, config.decode_replicas) == (1, 1)
    assert (config.decode_data_parallel_size, config.decode_enable_expert_parallel) == (8, True)
    assert config.prefill_data_parallel_size is None and not config.enable_expert_parallel
    model = load_model(config.model)
    pools, _ = build_pools(config, model, load_gpu("h200_sxm"), point_workload(point))
    assert [(pool.role, len(pool.policies)) for pool in pools] == [("prefill", 1), ("decode", 8)]
    _, _, prefill = pool_configs(config)[0]
    _, _, decode = pool_configs(config)[1]
    # The prefill GPU holds 1/8 of every expert; a decode GPU 256 / 8 = 32 experts whole.
    assert gpu_shard(prefill, model).expert_parallel == 1 and gpu_shard(decode, model).expert_parallel == 8
    assert (decode.tensor_parallel_size, decode.data_parallel_size, decode.num_replicas) == (1, 8, 8)


def test_every_disaggregated_deepseek_row_with_pool_data_parallelism_is_rerun() -> None:
    # Each DeepSeek-V3 disaggregated row whose prefill or decode pool has data-parallel attention
    # is read and its pools built and sized as its rerun does (weights fit, longest request fits).
    with UPSTREAM.open() as file:
        ids = {r["id"] for r in csv.DictReader(file) if r["mode"] == "disagg"
               and r["model_path"] == "deepseek-ai/DeepSeek-V3"
               and max(int(r["prefill_attention_dp_size"] or 1), int(r["decode_attention_dp_size"] or 1)) > 1}
    reading = read_measured(UPSTREAM, resolver=ModelResolver(MODELS))
    assert ids <= {point.name for point in reading.points}  # none skipped
    built = 0
    for point in reading.points:
        if point.name in ids:
            config = point_config(point, default_profile(point.gpu, point.backend))
            pools, link = build_pools(config, load_model(config.model), load_gpu(config.gpu), point_workload(point))
            assert point.prefill is not None and point.decode is not None and link is not None
            assert [len(pool.policies) for pool in pools] == [
                point.prefill.workers * point.prefill.attention_dp_size,
                point.decode.workers * point.decode.attention_dp_size]
            built += 1
    assert built == len(ids) == 27


def test_nine_in_ten_of_the_new_models_aggregated_rows_are_rerun() -> None:
    # Each row read, and its deployment built and sized as its rerun does (the weights fit each GPU,
    # the longest request fits the KV cache), without running it.
    with UPSTREAM.open() as file:
        ids = {r["id"]: r["model_path"] for r in csv.DictReader(file) if r["model_path"] in NEW
               and r["mode"] == "agg"}
    reading = read_measured(UPSTREAM, resolver=ModelResolver(MODELS))
    rerun: Counter[str] = Counter()
    for point in reading.points:
        if point.name in ids:
            config = point_config(point, default_profile(point.gpu))
            try:
                build_pools(config, load_model(config.model), load_gpu(config.gpu), point_workload(point))
            except InputError:
                continue
            rerun[ids[point.name]] += 1
    total = Counter(ids.values())
    assert sum(total.values()) == 538
    assert sum(rerun.values()) >= 0.9 * sum(total.values()), (rerun, total)
    assert all(rerun[m] >= 0.8 * total[m] for m in NEW), (rerun, total)


def test_compare_models_filters_rows_by_model() -> None:
    """`benchmarks.compare_models --models`: only the named models' rows, DeepSeek's disaggregated ones
    with DeepSeek; an unknown name is refused naming it."""
    import argparse

    from benchmarks.compare_models import TABLE, model_names, selected_rows

    if not TABLE.exists():
        pytest.skip("the reference table is not here")
    by_id, _ = selected_rows(TABLE, model_names("kimi-k2.5,gpt-oss-120b"))
    assert {key[0] for key in by_id.values()} == {"kimi-k2.5", "gpt-oss-120b"}
    assert Counter(key[0] for key in by_id.values()) == {"kimi-k2.5": 45, "gpt-oss-120b": 246}
    everything, _ = selected_rows(TABLE)
    assert any(key[2].startswith("disagg") for key in everything.values())
    with pytest.raises(argparse.ArgumentTypeError, match="unknown model llama"):
        model_names("llama,kimi-k2.5")
