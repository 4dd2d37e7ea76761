"""What a vLLM user expects: `vllm bench serve` and `vllm serve` names, the result JSON, help with defaults."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
import polars as pl
import pytest

from policies import POLICIES
from simulator.cli.main import main, run
from simulator.cli.run_command import run_command
from simulator.deploy.hardware import available_gpus
from simulator.deploy.model import BUILTIN_MODELS

BASE = {"--num-requests": "30", "--input-len": "500", "--output-len": "40", "--seed": "3", "--rate": "8"}


def simulate_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    codes: list[int] = []
    run(args, exit=codes.append)
    out, err = capsys.readouterr()
    return codes[0], out, err


def with_base(flags: list[str], replaces: tuple[str, ...] = ()) -> list[str]:
    args = [word for name, value in BASE.items() if name not in replaces for word in (name, value)]
    return args + flags


# (alias flags, canonical flags, the base flags both replace)
ALIASES = [
    (["--request-rate", "6"], ["--rate", "6"], ("--rate",)),
    (["--max-concurrency", "4"], ["--concurrency", "4"], ("--rate",)),
    (["--num-prompts", "25"], ["--num-requests", "25"], ("--num-requests",)),
    (["--random-input-len", "700"], ["--input-len", "700"], ("--input-len",)),
    (["--random-output-len", "60"], ["--output-len", "60"], ("--output-len",)),
    (["--random-range-ratio", "0.5"], ["--input-len-dist", "uniform:0.5", "--output-len-dist", "uniform:0.5"], ()),
    (["--metric-percentiles", "25,75,99.9"], ["--percentiles", "25,75,99.9"], ()),
    (["--enable-chunked-prefill"], ["--policy", "chunked"], ()),
]


@pytest.mark.parametrize(("alias", "canonical", "replaces"), ALIASES, ids=[a[0][0] for a in ALIASES])
def test_each_vllm_name_runs_as_its_servesim_flag(alias: list[str], canonical: list[str], replaces: tuple[str, ...],
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = []
    for name, flags in (("alias", alias), ("canonical", canonical)):
        code, stdout, err = simulate_cli([*with_base(flags, replaces), "--out", str(tmp_path / name)], capsys)
        assert code == 0, err
        saved = json.loads((tmp_path / name / "summary.json").read_text())
        outputs.append((saved["summary"], saved["settings"], stdout.splitlines()[:-1]))
    assert outputs[0] == outputs[1]
    # The alias took effect: the run differs from the base without it.
    code, _, _ = simulate_cli([*with_base([], replaces), "--out", str(tmp_path / "base")], capsys)
    base = json.loads((tmp_path / "base" / "summary.json").read_text())
    assert (base["summary"], base["settings"]) != outputs[0][:2]


def test_max_model_len_refuses_longer_requests_as_vllm_does(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # 500-token prompts + 40 outputs = 540 tokens.
    code, _, err = simulate_cli([*with_base(["--max-model-len", "539"]), "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and "540 tokens" in err and "--max-model-len 539" in err
    assert not (tmp_path / "a").exists()
    code, _, _ = simulate_cli([*with_base(["--max-model-len", "540"]), "--out", str(tmp_path / "b")], capsys)
    assert code == 0
    code, _, err = simulate_cli([*with_base(["--max-model-len", "200000"]), "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "131072" in err  # past Llama-3.1-8B's context, which vLLM refuses too


@pytest.mark.parametrize(("args", "typed", "canonical"), [
    (["--num-prompts", "0"], "--num-prompts", "--num-requests"),
    (["--request-rate", "-1"], "--request-rate", "--rate"),
    (["--max-concurrency", "0"], "--max-concurrency", "--concurrency"),
    (["--metric-percentiles", "101"], "--metric-percentiles", "--percentiles"),
    (["--random-input-len", "0"], "--random-input-len", "--input-len"),
])
def test_errors_name_the_alias_as_typed(args: list[str], typed: str, canonical: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate_cli([*args, "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and typed in err and canonical + " " not in err, err


@pytest.mark.parametrize(("args", "named"), [
    (["--save-detailed"], "--save-result"),
    (["--result-dir", "somewhere"], "--save-result"),
    (["--enable-chunked-prefill", "--policy", "static"], "--policy static"),
    (["--random-range-ratio", "0.5", "--input-len-dist", "lognormal"], "--input-len-dist"),
    (["--random-range-ratio", "1.5"], "1.5"),
    (["--percentile-metrics", "ttft,latency"], "latency"),
])
def test_vllm_flags_that_contradict_are_refused(args: list[str], named: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate_cli([*args, "--num-requests", "5", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err, err
    assert not (tmp_path / "x").exists()


def test_percentile_metrics_choose_the_printed_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = simulate_cli([*with_base(["--percentile-metrics", "ttft,itl"]), "--out", str(tmp_path / "r")],
                                   capsys)
    assert code == 0
    rows = [line.split()[0] for line in stdout.splitlines() if line[:5] in ("TTFT ", "TPOT ", "ITL  ", "E2EL ")]
    assert rows == ["TTFT", "ITL"]


# The fields `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py), read by tools such as
# vLLM's own benchmark dashboards.
VLLM_FIELDS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
               "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
               "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
               "total_token_throughput", "latencies", "queue_times", "max_output_tokens_per_s",
               "max_concurrent_requests"}
DETAILED_FIELDS = {"input_lens", "output_lens", "ttfts", "itls", "start_times", "errors"}


def test_save_result_writes_vllm_bench_serve_json(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, _ = simulate_cli([*with_base(["--save-result", "--goodput", "ttft:100"]), "--out", "run"], capsys)
    assert code == 0
    [path] = tmp_path.glob("servesim-8.0qps-llama-3.1-8b-*.json")  # vLLM's default name
    assert f"wrote {path.name}" in stdout
    result = json.loads(path.read_text())
    requests = pl.read_parquet(tmp_path / "run" / "requests.parquet")
    assert VLLM_FIELDS <= set(result) and not DETAILED_FIELDS & set(result)
    assert result["completed"] == 30 and result["failed"] == 0 and result["num_prompts"] == 30
    assert result["request_rate"] == 8.0 and result["max_concurrency"] is None
    ttft = requests["ttft"].to_numpy()
    assert result["mean_ttft_ms"] == pytest.approx(ttft.mean() * 1e3)
    assert result["median_ttft_ms"] == pytest.approx(np.median(ttft) * 1e3)
    assert result["p99_ttft_ms"] == pytest.approx(np.percentile(ttft, 99) * 1e3)
    assert result["mean_e2el_ms"] == pytest.approx(requests["e2el"].mean() * 1e3)
    assert result["request_goodput"] == pytest.approx((ttft <= 0.1).sum() / result["duration"])
    assert result["latencies"] == pytest.approx(requests["e2el"].to_list())
    assert result["total_output_tokens"] <= 30 * 40
    # One second holds at most every token, and the busiest second at least the average.
    assert result["total_output_tokens"] / np.ceil(result["duration"]) <= result["max_output_tokens_per_s"] <= 1200


def test_save_detailed_adds_per_request_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--concurrency", "4", "--num-requests", "12", "--input-len", "300", "--output-len", "20",
            "--input-len-dist", "uniform:0.5", "--out", str(tmp_path / "run"), "--save-result", "--save-detailed",
            "--result-dir", str(tmp_path / "results"), "--result-filename", "bench.json"]
    code, _, _ = simulate_cli(args, capsys)
    assert code == 0
    result = json.loads((tmp_path / "results" / "bench.json").read_text())
    requests = pl.read_parquet(tmp_path / "run" / "requests.parquet")
    tokens = pl.read_parquet(tmp_path / "run" / "tokens.parquet").sort("request_id", "index")
    assert DETAILED_FIELDS <= set(result)
    assert result["input_lens"] == requests["prompt_tokens"].to_list()
    assert result["output_lens"] == [20] * 12
    assert result["ttfts"] == pytest.approx(requests["ttft"].to_list())
    for rid, itl in enumerate(result["itls"]):
        times = tokens.filter(pl.col("request_id") == rid)["time"].to_numpy()
        assert itl == pytest.approx(np.diff(times).tolist())
    assert result["max_concurrent_requests"] == 4  # four clients, always one request each
    assert result["max_concurrency"] == 4 and result["errors"] == [""] * 12


def test_save_result_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bench.json").write_text("{}")
    args = [*with_base(["--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json"]),
            "--out", str(tmp_path / "run")]
    code, _, err = simulate_cli(args, capsys)
    assert code == 2 and "bench.json" in err and (tmp_path / "bench.json").read_text() == "{}"
    assert not (tmp_path / "run").exists()


def test_help_gives_every_option_a_text_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = simulate_cli(["--help"], capsys)
    assert code == 0 and "`run` (starred below) is the default command" in stdout
    context = click.Context(run_command)
    for option in run_command.params:
        assert isinstance(option, click.Option)
        record = option.get_help_record(context)
        assert record is not None and record[1], option.name
        if not option.is_flag:
            assert "[default:" in record[1], option.name
    code, stdout, _ = simulate_cli(["run", "--help"], capsys)
    help_text = " ".join(stdout.split())
    assert "[default: inf: all at once]" in help_text
    for name in [*POLICIES, *BUILTIN_MODELS, *available_gpus()]:
        assert name in help_text, name
    assert main.get_command(click.Context(main), "run") is run_command


def test_the_docs_list_every_vllm_name() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    table = page[page.index("## vLLM's names"):]
    aliases = [alias for option in run_command.params for alias in option.opts[1:]]
    vllm_only = ["--random-range-ratio", "--enable-chunked-prefill", "--max-model-len", "--percentile-metrics",
                 "--save-result", "--save-detailed", "--result-dir", "--result-filename"]
    assert aliases
    for name in [*aliases, *vllm_only]:
        assert f"`{name}" in table, name
