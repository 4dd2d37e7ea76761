"""`simulate compare` on `vllm bench serve --save-result` files, built here from the fields vLLM's
vllm/benchmarks/serve.py writes (benchmark()'s result plus main()'s run settings), with and
without `--save-detailed`'s per-request lists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from simulator.cli.main import run

STATISTICS = {f"{stat}_{metric}_ms": value for metric, base in (("ttft", 60.0), ("tpot", 9.0), ("itl", 9.0))
              for stat, value in (("mean", base), ("median", base * 0.9), ("std", base * 0.2), ("p99", base * 2))}


def vllm_result(**changes: Any) -> dict[str, Any]:
    """A result as vLLM saves it: 20 requests at concurrency 4, 1,000 prompt and 100 output tokens each."""
    n = 20
    result: dict[str, Any] = {
        "date": "20260101-120000", "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": n, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 4,
        "duration": 5.0, "completed": n, "failed": 0, "total_input_tokens": 1000 * n, "total_output_tokens": 100 * n,
        "request_throughput": 4.0, "request_goodput": None, "output_throughput": 400.0,
        "total_token_throughput": 4400.0, "max_output_tokens_per_s": 450.0, "max_concurrent_requests": 4,
        "input_lens": [1000] * n, "output_lens": [100] * n, "ttfts": [0.06] * n, "itls": [[0.009] * 99] * n,
        "latencies": [0.95] * n, "start_times": [0.25 * i for i in range(n)], "queue_times": [0.0] * n,
        "generated_texts": [""] * n, "errors": [""] * n,
    } | STATISTICS
    return result | changes


def brief(result: dict[str, Any]) -> dict[str, Any]:
    """As saved without --save-detailed: vLLM deletes the per-request lists."""
    return {k: v for k, v in result.items() if k not in ("input_lens", "output_lens", "ttfts", "itls",
                                                         "start_times", "errors", "generated_texts")}


def compare(tmp_path: Path, capsys: pytest.CaptureFixture[str], result: dict[str, Any] | str,
            *flags: str) -> tuple[int, str, str, Path]:
    path = tmp_path / "result.json"
    path.write_text(result if isinstance(result, str) else json.dumps(result))
    out_file = tmp_path / "rows.parquet"
    codes: list[int] = []
    run(["compare", str(path), "--gpu", "h100_sxm", "--out", str(out_file), *flags], exit=codes.append)
    out, err = capsys.readouterr()
    return codes[0], out, err, out_file


@pytest.mark.parametrize("detailed", [True, False])
def test_a_vllm_result_is_rerun_and_every_statistic_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             detailed: bool) -> None:
    result = vllm_result() if detailed else brief(vllm_result())
    code, out, err, out_file = compare(tmp_path, capsys, result)
    assert code == 0, err
    rows = pl.read_parquet(out_file)
    expected = {f"{m}_{s}" for m in ("ttft", "tpot", "itl") for s in ("mean", "median", "p99")}
    assert set(rows["statistic"]) == expected | {"request_throughput", "output_throughput"}
    assert rows["simulated"].is_finite().all()
    measured = dict(zip(rows["statistic"], rows["measured"], strict=True))
    assert measured["ttft_p99"] == pytest.approx(0.120) and measured["output_throughput"] == 400.0
    for line in ("ttft_p99 ms", "itl_median ms", "request_throughput/s"):
        assert line in out


def test_per_request_lengths_are_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prompts of 100 and 7,900 tokens by turns: the totals of 4,000 each, but with the lists the
    # TTFT spreads (a 7,900-token prefill against a 100-token one), without them it cannot.
    mixed = vllm_result(input_lens=[100, 7900] * 10, total_input_tokens=80_000)
    spreads = []
    for name, result in (("detailed", mixed), ("brief", brief(mixed))):
        (tmp_path / name).mkdir()
        code, _, err, out_file = compare(tmp_path / name, capsys, result)
        assert code == 0, err
        simulated = dict(pl.read_parquet(out_file).select("statistic", "simulated").iter_rows())
        spreads.append(simulated["ttft_p99"] / simulated["ttft_median"])
    assert spreads[0] > 1.6 and spreads[1] < 1.45, spreads


def test_an_open_loop_result_runs_at_its_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err, out_file = compare(tmp_path, capsys, vllm_result(request_rate=2.0, max_concurrency=None))
    assert code == 0, err
    rows = pl.read_parquet(out_file)
    throughput = float(rows.filter(pl.col("statistic") == "request_throughput")["simulated"][0])
    assert 1.0 < throughput < 4.0  # 20 Poisson arrivals at 2/s on a server that keeps up


@pytest.mark.parametrize(("result", "named"), [
    ('{"records": [{"ttft": 1}], "benchmark": "aiperf"}', "num_prompts"),
    (brief(vllm_result(num_prompts="twenty")), "'twenty'"),
    ({k: v for k, v in vllm_result().items() if k != "itls"}, "itls"),
    ({k: v for k, v in vllm_result().items() if k != "mean_ttft_ms"}, "mean_ttft_ms"),
    (vllm_result(request_rate=3.0), "max_concurrency 4"),
    (vllm_result(p99_ttft_ms=-1.0), "p99_ttft_ms"),
    ("[1, 2]", "not a JSON object"),
    ("{", "cannot read"),
])
def test_another_tools_file_or_a_missing_field_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           result: dict[str, Any] | str, named: str) -> None:
    code, out, err, out_file = compare(tmp_path, capsys, result)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err, err
    assert not out_file.exists() and out == ""


def test_a_vllm_result_needs_its_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(vllm_result()))
    codes: list[int] = []
    run(["compare", str(path)], exit=codes.append)
    assert codes == [2] and "--gpu" in capsys.readouterr().err


def test_a_model_id_found_nowhere_is_a_skip_then_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err, out_file = compare(tmp_path, capsys, vllm_result(model_id="acme/Unknown-7B"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "model 'acme/Unknown-7B' has no config.json" in err
    assert "skipped 1 of 1 rows" in out and not out_file.exists()
