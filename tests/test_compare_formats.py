"""`simulate compare` on what users have: aiconfigurator's silicon table in its upstream layout
(aggregated and disaggregated rows, every column as shipped), aiperf's exports, and files of other
tools; rows servesim cannot express skipped and counted by reason; points rerun in parallel."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from test_compare import outcome, write_csv

from simulator.deploy.resolve import ModelResolver
from simulator.sim2real.compare import point_config
from simulator.sim2real.measured import read_measured

SERVING = Path(__file__).resolve().parents[2] / "shared" / "reference" / "serving"
UPSTREAM = SERVING / "aiconfigurator_silicon_h100_h200.csv"
MODELS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "models"
needs_upstream = pytest.mark.skipif(not (UPSTREAM.exists() and MODELS.exists()),
                                    reason=f"reference table missing: {UPSTREAM}")
needs_models = pytest.mark.skipif(not MODELS.exists(), reason=f"reference model configs missing: {MODELS}")
AIPERF = Path(__file__).resolve().parent / "data" / "aiperf"

# One aggregated row in aiconfigurator's upstream layout: every column as it ships them.
AGG = {"id": "a1", "silicon_data_source": "source_file=x.csv; silicon_concurrency=4", "backend": "sglang",
       "backend_version": "0.5.1.post1", "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "precision": "",
       "mode": "agg", "isl": "512", "osl": "16", "gemm_quant_mode": "", "moe_quant_mode": "", "batch_size": "4",
       "tp_size": "2", "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1",
       **{f"{role}_{name}": "" for role in ("prefill", "decode")
          for name in ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
                       "moe_ep_size")},
       "silicon_ttft_ms": "120", "silicon_tpot_ms": "14"}
DISAGG = AGG | {"id": "d1", "mode": "disagg", "backend": "vllm", "silicon_data_source": "measured=2026-01-23",
                "batch_size": "", "tp_size": "", "pp_size": "", "attention_dp_size": "", "moe_tp_size": "",
                "moe_ep_size": "", "prefill_batch_size": "1", "prefill_num_workers": "2", "prefill_tp_size": "1",
                "prefill_pp_size": "1", "prefill_attention_dp_size": "1", "prefill_moe_tp_size": "0",
                "prefill_moe_ep_size": "0", "decode_batch_size": "3", "decode_num_workers": "2",
                "decode_tp_size": "2", "decode_pp_size": "1", "decode_attention_dp_size": "1",
                "decode_moe_tp_size": "0", "decode_moe_ep_size": "0"}


def test_an_upstream_row_reads_its_concurrency_from_the_source_or_the_batch(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "silicon.csv", AGG, AGG | {"id": "a2", "silicon_data_source": "",
                                                           "batch_size": "3"}, DISAGG)
    points = {p.name: p for p in read_measured(path).points}
    assert points["a1"].concurrency == 4 and points["a1"].backend == "sglang"
    assert points["a1"].backend_version == "0.5.1.post1" and points["a1"].mode == "agg"
    assert points["a2"].concurrency == 3  # no note: batch_size x attention_dp_size
    # Disaggregated, no note: decode_batch_size x decode_num_workers x decode_attention_dp_size.
    disagg = points["d1"]
    assert disagg.concurrency == 6 and disagg.mode == "disagg"
    assert disagg.prefill is not None and disagg.decode is not None
    assert (disagg.prefill.workers, disagg.prefill.tensor_parallel_size) == (2, 1)
    assert (disagg.decode.workers, disagg.decode.tensor_parallel_size, disagg.decode.batch_size) == (2, 2, 3)
    assert (disagg.warmup, disagg.num_requests) == (6, 60)


def test_a_disaggregated_row_reruns_on_prefill_and_decode_pools(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "silicon.csv", DISAGG)
    point = read_measured(path).points[0]
    config = point_config(point, "h100_sxm")
    assert (config.prefill_replicas, config.decode_replicas) == (2, 2)
    assert (config.prefill_tensor_parallel_size, config.decode_tensor_parallel_size) == (1, 2)
    code, _out, err = outcome(["compare", str(path), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, err
    rows = pl.read_parquet(tmp_path / "rows.parquet")
    assert rows["mode"].to_list() == ["disagg", "disagg"] and rows["simulated"].is_finite().all()
    # The prefill pool's KV goes to a decode server before the first token: a disaggregated rerun's
    # first token comes later than the same row's on one colocated server of the prefill pool's size.
    agg = write_csv(tmp_path / "agg.csv", AGG | {"backend": "vllm", "silicon_data_source": "silicon_concurrency=6",
                                                 "tp_size": "1", "batch_size": "6"})
    code, _, err = outcome(["compare", str(agg), "--out", str(tmp_path / "agg.parquet")], capsys)
    assert code == 0, err
    ttft = {name: pl.read_parquet(tmp_path / f"{name}.parquet").filter(statistic="ttft_mean")["simulated"][0]
            for name in ("rows", "agg")}
    assert ttft["rows"] != ttft["agg"]


@pytest.mark.parametrize(("changes", "reason"), [
    ({"pp_size": "2"}, "pipeline parallelism (pp_size > 1)"),
    ({"model_path": "deepseek-ai/DeepSeek-V3", "tp_size": "8", "attention_dp_size": "4", "moe_tp_size": "32"},
     "attention data parallelism without expert parallelism"),
    ({"backend": "tgi"}, "backend 'tgi'"),
    # A 4-bit mode on a checkpoint without 4-bit experts: servesim does not quantize to 4 bits.
    ({"gemm_quant_mode": "nvfp4", "precision": "fp4"}, "gemm_quant_mode 'nvfp4'"),
    ({"gemm_quant_mode": "int4_wo", "precision": "int4"}, "gemm_quant_mode 'int4_wo'"),
    # Their config.json files are the reference models' (../shared): no built-in holds them.
    pytest.param({"model_path": "zhipuai/GLM-5"}, "index_topk 2048 means sparse indexer attention", marks=needs_models),
    pytest.param({"model_path": "Qwen/Qwen3.5-397B-A17B"}, "full_attention_interval 4 means linear attention layers",
                 marks=needs_models),
])
def test_an_upstream_row_servesim_cannot_express_is_skipped_by_reason(tmp_path: Path, changes: dict[str, str],
                                                                      reason: str) -> None:
    path = write_csv(tmp_path / "silicon.csv", AGG, AGG | {"id": "bad"} | changes)
    reading = read_measured(path, resolver=ModelResolver(MODELS if MODELS.exists() else None))
    assert [p.name for p in reading.points] == ["a1"]
    assert reading.skipped[0][0] == "silicon.csv line 3" and reason in reading.skipped[0][1], reading.skipped


@needs_upstream
def test_the_upstream_table_is_read_whole_every_skip_counted() -> None:
    with UPSTREAM.open() as file:
        table = list(csv.DictReader(file))
    reading = read_measured(UPSTREAM, resolver=ModelResolver(MODELS))
    assert len(reading.points) + len(reading.skipped) == len(table) == 1282
    # Every aggregated Qwen3-32B row of all three stacks and every bf16/fp8 vLLM row of a model
    # servesim prices is rerun (the table's own columns say which they are).
    read = Counter((p.backend, p.mode) for p in reading.points if p.group.startswith("qwen3-32b"))
    expected = Counter((r["backend"], "agg") for r in table
                       if r["model_path"] == "Qwen/Qwen3-32B" and r["mode"] == "agg")
    assert {k: read[k] for k in expected} == expected and set(expected) == {(b, "agg") for b in ("vllm", "sglang",
                                                                                                  "trtllm")}
    assert sum(1 for p in reading.points if p.mode == "disagg") >= 1
    assert sum(1 for p in reading.points if p.group.startswith("llama-3.1-8b")) == sum(
        1 for r in table if r["model_path"] == "nvidia/Llama-3.1-8B-Instruct-FP8")
    # Where the row says its concurrency, the point runs that many clients.
    noted = {r["id"]: int(m.group(1)) for r in table if (m := re.search(r"silicon_concurrency=(\d+)",
                                                                         r["silicon_data_source"]))}
    assert all(p.concurrency == noted[p.name] for p in reading.points if p.name in noted)
    # Skips are by reason, each model servesim cannot price named with the field that stops it.
    reasons = Counter(reason for _, reason in reading.skipped)
    by_model = Counter(r["model_path"] for r in table)
    for model, field in (("zhipuai/GLM-5", "index_topk"), ("Qwen/Qwen3.5-397B-A17B", "full_attention_interval")):
        [(reason, count)] = [(k, v) for k, v in reasons.items() if k.startswith(f"model '{model}'")]
        assert field in reason and count == by_model[model]


def test_a_file_of_another_tool_is_one_line_naming_what_it_lacks(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival,prompt_tokens,output_tokens\n0,10,10\n")
    code, _, err = outcome(["compare", str(trace)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "lacks the column(s) id, backend" in err
    genai = tmp_path / "genai.json"
    genai.write_text(json.dumps({"experiments": [{"requests": []}]}))
    code, _out, err = outcome(["compare", str(genai), "--gpu", "h100_sxm"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "it lacks model_id, num_prompts" in err, err


def test_points_rerun_in_parallel_give_the_rows_of_one_process(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rows = [AGG | {"id": f"p{c}", "silicon_data_source": f"silicon_concurrency={c}", "batch_size": str(c)}
            for c in (1, 2, 3, 5)]
    path = write_csv(tmp_path / "silicon.csv", *rows)
    tables = {}
    for jobs in ("1", "2"):
        code, _, err = outcome(["compare", str(path), "--jobs", jobs, "--out", str(tmp_path / f"{jobs}.parquet")],
                               capsys)
        assert code == 0, err
        tables[jobs] = pl.read_parquet(tmp_path / f"{jobs}.parquet")
    assert tables["1"]["point"].unique(maintain_order=True).to_list() == ["p1", "p2", "p3", "p5"]
    assert tables["1"].equals(tables["2"])


def aiperf_outcome(folder: Path, name: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    return outcome(["compare", str(folder / name), "--gpu", "h100_sxm", "--tensor-parallel-size", "2",
                    "--out", str(folder / f"{name}.parquet"), *flags], capsys)


def test_an_aiperf_export_reruns_as_its_client_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "artifacts"
    shutil.copytree(AIPERF, folder)
    code, _out, err = aiperf_outcome(folder, "profile_export_aiperf.json", capsys)
    assert code == 0, err
    rows = pl.read_parquet(folder / "profile_export_aiperf.json.parquet")
    exported = json.loads((AIPERF / "profile_export_aiperf.json").read_text())
    measured = dict(zip(rows["statistic"], rows["measured"], strict=True))
    assert measured["ttft_mean"] == pytest.approx(exported["time_to_first_token"]["avg"] / 1e3)
    assert measured["tpot_median"] == pytest.approx(exported["inter_token_latency"]["p50"] / 1e3)
    assert measured["e2el_p99"] == pytest.approx(exported["request_latency"]["p99"] / 1e3)
    assert measured["request_throughput"] == pytest.approx(exported["request_throughput"]["avg"])
    assert set(rows["concurrency"]) == {8} and rows["simulated"].is_finite().all()
    # The same benchmark as a silicon row (8 clients, 8 warm-up and 80 measured requests, 1,024/128
    # tokens, Qwen3-32B on two H100s) rerun plainly (not by the rule the table's vLLM rows support)
    # reruns to the same simulated TTFT and TPOT.
    silicon = write_csv(tmp_path / "silicon.csv", AGG | {"backend": "vllm", "isl": "1024", "osl": "128",
                                                         "silicon_data_source": "silicon_concurrency=8"})
    code, _, err = outcome(["compare", str(silicon), "--gpu", "h100_sxm", "--client", "plain",
                            "--out", str(tmp_path / "silicon.parquet")], capsys)
    assert code == 0, err
    again = pl.read_parquet(tmp_path / "silicon.parquet")
    for statistic in ("ttft_mean", "tpot_mean"):
        assert rows.filter(statistic=statistic)["simulated"][0] == again.filter(statistic=statistic)["simulated"][0]
    # Its CSV, read with the JSON aiperf wrote beside it, holds the same statistics to its 2 decimals.
    code, _, err = aiperf_outcome(folder, "profile_export_aiperf.csv", capsys)
    assert code == 0, err
    from_csv = pl.read_parquet(folder / "profile_export_aiperf.csv.parquet")
    assert from_csv["statistic"].to_list() == rows["statistic"].to_list()
    for statistic, a, b in zip(rows["statistic"], from_csv["measured"], rows["measured"], strict=True):
        assert a == pytest.approx(b, abs=0.005 if "throughput" in statistic else 0.005 / 1e3), statistic


def test_an_aiperf_csv_alone_or_a_bad_setting_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(AIPERF / "profile_export_aiperf.csv", tmp_path)
    code, _, err = aiperf_outcome(tmp_path, "profile_export_aiperf.csv", capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "profile_export_aiperf.json beside it" in err
    exported = json.loads((AIPERF / "profile_export_aiperf.json").read_text())
    exported["input_config"]["loadgen"]["concurrency"] = "eight"
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(exported))
    code, _out, err = aiperf_outcome(tmp_path, "profile_export_aiperf.json", capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "loadgen.concurrency" in err and "'eight'" in err


def test_an_aiperf_request_rate_runs_open_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exported = json.loads((AIPERF / "profile_export_aiperf.json").read_text())
    exported["input_config"]["loadgen"] = {"request_rate": 2.0, "request_count": 80}
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(exported))
    code, out, err = aiperf_outcome(tmp_path, "profile_export_aiperf.json", capsys)
    assert code == 0, err
    rows = pl.read_parquet(tmp_path / "profile_export_aiperf.json.parquet")
    assert set(rows["rate"]) == {2.0} and rows["concurrency"].is_null().all()
    exported["input_config"]["loadgen"] |= {"concurrency": 4}
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(exported))
    code, out, err = aiperf_outcome(tmp_path, "profile_export_aiperf.json", capsys)
    assert code == 2 and "a request rate held to a concurrency" in out + err


def test_a_variant_takes_its_weights_dtype_from_the_row_and_says_so(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    row = AGG | {"model_path": "nvidia/Llama-3.1-8B-Instruct-FP8", "precision": "fp8", "tp_size": "1"}
    path = write_csv(tmp_path / "silicon.csv", row | {"gemm_quant_mode": "fp8"}, row | {"id": "a2"})
    code, out, err = outcome(["compare", str(path), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, err
    rows = pl.read_parquet(tmp_path / "rows.parquet").filter(statistic="tpot_mean")
    assert rows["quantization"].to_list() == ["fp8", "fp8"]  # precision fp8 with no gemm mode is fp8 too
    assert ("nvidia/Llama-3.1-8B-Instruct-FP8 -> llama-3.1-8b (built-in, as a variant of "
            "meta-llama/meta-llama-3.1-8b; weights as the row's quant mode") in out
    # The same base model's row without a quant mode reruns unquantized, and faster per token in fp8.
    plain = write_csv(tmp_path / "plain.csv", row | {"precision": "", "model_path": "meta-llama/Llama-3.1-8B"})
    code, _, err = outcome(["compare", str(plain), "--out", str(tmp_path / "plain.parquet")], capsys)
    assert code == 0, err
    bf16 = pl.read_parquet(tmp_path / "plain.parquet").filter(statistic="tpot_mean")
    assert bf16["quantization"].to_list() == [""] and bf16["simulated"][0] > rows["simulated"][0]


def test_a_row_the_rerun_refuses_is_skipped_with_the_refusal(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from test_compare import ROW

    # Llama-3.1-70B's bf16 weights (141 GB) on one 80 GB H100: refused when the rerun sizes the server.
    path = write_csv(tmp_path / "silicon.csv", ROW, ROW | {"id": "big", "model_path": "meta-llama/Meta-Llama-3.1-70B",
                                                          "tp_size": "1"})
    code, out, err = outcome(["compare", str(path), "--jobs", "2", "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, err
    assert re.search(r"^\s+1  llama-3.1-70b's weights \(bfloat16\) need 141.1 GB per GPU", out, re.MULTILINE), out
    assert pl.read_parquet(tmp_path / "rows.parquet")["point"].unique().to_list() == ["r1"]
    code, out, err = outcome(["compare", str(path), "--strict", "--out", str(tmp_path / "strict.parquet")], capsys)
    assert code == 2 and err.startswith("error: big: cannot be rerun (--strict): llama-3.1-70b's weights")
    assert not (tmp_path / "strict.parquet").exists()


def test_a_worker_that_dies_is_one_line_and_no_output(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed mid-compare (the out-of-memory killer) ends the command with one line saying how
    far it got, and no --out file, not a traceback."""
    import simulator.sim2real.units as units
    from simulator.sweep.executors import WorkerDied

    def dies(*_args: object, **_kwargs: object) -> Iterator[object]:
        raise WorkerDied("a worker process died (killed or out of memory)")
        yield  # a generator, as run_units is

    monkeypatch.setattr(units, "run_units", dies)
    path = write_csv(tmp_path / "silicon.csv", AGG)
    code, out, err = outcome(["compare", str(path), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "died" in err and "after 0 of 1 points" in err and "Traceback" not in err + out
    assert not (tmp_path / "rows.parquet").exists()
