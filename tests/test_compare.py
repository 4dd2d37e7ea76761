"""`simulate compare` on aiconfigurator's silicon CSV: the client's run as it ran (warm-up barrier,
closed loop, client time), every field checked, every row rerun, errors with their sign."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import UnitCost

from simulator.cli.main import run
from simulator.config import RunConfig
from simulator.run.clients import ClientRun
from simulator.run.simulate import build_workload, simulate
from simulator.sim2real.replay import client_delays, replay_workload
from workloads import Workload

SILICON = Path(__file__).resolve().parents[2] / "shared" / "reference" / "serving" / "aiconfigurator_silicon_vllm.csv"
needs_silicon = pytest.mark.skipif(not SILICON.exists(), reason=f"reference table missing: {SILICON}")
ROW = {"id": "r1", "backend": "vllm", "backend_version": "0.12.0", "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm",
       "precision": "", "gemm_quant_mode": "", "isl": "1024", "osl": "16", "concurrency": "4", "tp_size": "2",
       "silicon_ttft_ms": "150", "silicon_tpot_ms": "15"}


def write_csv(path: Path, *rows: dict[str, str]) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def outcome(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    codes: list[int] = []
    run(args, exit=codes.append)
    out, err = capsys.readouterr()
    return codes[0], out, err


def test_warm_up_is_answered_whole_before_the_measured_requests_are_sent() -> None:
    # UnitCost: 1 s a step. Warm-up request 0 ends at 1 s (one token), request 1 at 5 s (five);
    # without the barrier client 0 would send at 1 s. Both measured requests go at 5 s, are
    # prefilled together (first token at 6 s) and end at 7 s.
    workload = Workload(np.full(4, 10, np.int64), np.array([1, 5, 2, 2]), None, 2)
    replay = replay_workload(RunConfig(policy="chunked"), ClientRun(2, 2, 2), workload, UnitCost())  # type: ignore[arg-type]
    assert replay.result.requests.arrival.tolist() == [0.0, 0.0, 5.0, 5.0]
    assert replay.ttft.tolist() == [1.0, 1.0] and replay.tpot.tolist() == [1.0, 1.0]
    # The step sums the fit differentiates by: one step of 2 sequences and 20 tokens under each
    # TTFT; one decode step of 2 sequences, 2 tokens, over 1 token of TPOT.
    assert replay.ttft_sums.tolist() == [[1, 2, 20], [1, 2, 20]]
    assert replay.tpot_sums.tolist() == [[1, 2, 2], [1, 2, 2]]


def test_client_time_counts_in_the_ttft_and_delays_the_engine() -> None:
    client = ClientRun(1, 0, 3, client_time=0.25)
    workload = Workload(np.full(3, 10, np.int64), np.full(3, 2, np.int64), None, 1)
    replay = replay_workload(RunConfig(policy="chunked", seed=7), client, workload, UnitCost())  # type: ignore[arg-type]
    delays = client_delays(client, 3, 7)
    assert len(set(delays.tolist())) == 3  # drawn per request
    # The engine is idle when each arrives: one prefill step after the request reaches it.
    np.testing.assert_allclose(replay.ttft, delays + 1.0)
    np.testing.assert_allclose(np.diff(replay.result.requests.arrival), delays[:2] + 2.0)


def test_a_rerun_keeps_the_workloads_priorities_and_prefix_content() -> None:
    """A rerun is a run like any other: prompts that share prefixes hit the prefix cache as they do
    in `simulate`, and every request keeps its priority (the replay's own engine dropped both)."""
    config = RunConfig(policy="priority", concurrency=1, num_requests=12, input_len=600, output_len=20,
                       prefix_len=512, num_prefixes=2, priority_levels=3, enable_prefix_caching=True)
    workload = build_workload(config)
    assert workload.priority is not None and len(set(workload.priority.tolist())) > 1
    simulated = simulate(config, workload).requests
    rerun = replay_workload(config, ClientRun(concurrency=1, warmup=0, measured=12), workload).result.requests
    assert simulated.cached_tokens.sum() > 0
    assert rerun.cached_tokens.tolist() == simulated.cached_tokens.tolist()
    assert rerun.priority.tolist() == workload.priority.tolist()


def test_a_fleet_is_rerun_as_the_client_sent_it() -> None:
    # UnitCost: 1 s a step. Two replicas, round robin: the two warm-up requests go one to each and
    # end at 1 s; the two measured ones are sent then, one to each, and end at 2 s.
    workload = Workload(np.full(4, 10, np.int64), np.ones(4, np.int64), None, 2)
    replay = replay_workload(RunConfig(policy="chunked", num_replicas=2), ClientRun(2, 2, 2), workload,
                             UnitCost())  # type: ignore[arg-type]
    assert replay.result.fleet is not None
    assert replay.result.fleet.request_columns["replica"].tolist() == [0, 1, 0, 1]
    assert replay.result.requests.arrival.tolist() == [0.0, 0.0, 1.0, 1.0] and replay.ttft.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(("field", "value", "named"), [
    ("concurrency", "-4", "'-4'"), ("isl", "1e3", "'1e3'"), ("silicon_ttft_ms", "nan", "nan"),
    ("silicon_tpot_ms", "fast", "'fast'"), ("tp_size", "0", "'0'"),
])
def test_a_malformed_field_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str,
                                                 value: str, named: str) -> None:
    path = write_csv(tmp_path / "points.csv", ROW, ROW | {field: value})
    code, out, err = outcome(["compare", str(path), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "points.csv line 3" in err and named in err, err
    assert not (tmp_path / "rows.parquet").exists() and out == ""


UNMAPPABLE = [("model_path", "acme/Unknown-7B", "model 'acme/Unknown-7B' has no config.json"),
              ("system", "b200", "system 'b200' has no shipped GPU profile"),
              ("gemm_quant_mode", "w4a8", "gemm_quant_mode 'w4a8'"),
              ("gemm_quant_mode", "nvfp4", "gemm_quant_mode 'nvfp4' (servesim prices bf16 and fp8 weights, and a"),
              ("backend", "tgi", "backend 'tgi'"), ("tp_size", "3", "does not divide qwen3-32b's num_heads 64")]


@pytest.mark.parametrize(("field", "value", "reason"), UNMAPPABLE)
def test_a_row_servesim_cannot_express_is_skipped_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              field: str, value: str, reason: str) -> None:
    path = write_csv(tmp_path / "points.csv", ROW, ROW | {field: value}, ROW | {"id": "r3", field: value})
    code, out, err = outcome(["compare", str(path), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, err
    assert "skipped 2 of 3 rows" in out and re.search(rf"^\s+2  .*{re.escape(reason)}", out, re.MULTILINE), out
    assert pl.read_parquet(tmp_path / "rows.parquet")["point"].unique().to_list() == ["r1"]
    # --strict: the first skip is the error, naming its line; nothing written.
    code, out, err = outcome(["compare", str(path), "--strict", "--out", str(tmp_path / "strict.parquet")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "points.csv line 3" in err and reason in err, err
    assert not (tmp_path / "strict.parquet").exists()


def test_a_file_of_nothing_but_skips_is_an_error_after_the_table(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "points.csv", ROW | {"system": "b200"})
    code, out, err = outcome(["compare", str(path)], capsys)
    assert code == 2 and "skipped 1 of 1 rows" in out and "nothing to rerun" in err


def test_a_table_lacking_a_column_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "points.csv", {k: v for k, v in ROW.items() if k != "osl"})
    code, _, err = outcome(["compare", str(path)], capsys)
    assert code == 2 and "osl" in err and len(err.strip().splitlines()) == 1


def test_a_kv_dtype_the_rows_do_not_say_is_refused_naming_it(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "points.csv", ROW)
    code, _, err = outcome(["compare", str(path), "--kv-cache-dtype", "fp8", "--out", str(tmp_path / "r.parquet")],
                           capsys)
    assert code == 2 and "--kv-cache-dtype fp8" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.parquet").exists()


def test_errors_are_signed_simulated_against_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No server takes 1,000 s to a first token nor 1 us a token: the errors must be about -100% and
    # far above 0.
    slow = ROW | {"id": "slow", "silicon_ttft_ms": "1000000", "silicon_tpot_ms": "0.001"}
    path = write_csv(tmp_path / "points.csv", slow)
    code, out, _ = outcome(["compare", str(path), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, out
    rows = pl.read_parquet(tmp_path / "rows.parquet")
    errors = dict(zip(rows["statistic"], rows["error"], strict=True))
    assert -1 < errors["ttft_mean"] < -0.999 and errors["tpot_mean"] > 1000
    assert "-100.0%" in out


@needs_silicon
def test_every_row_of_the_silicon_table_is_rerun(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = outcome(["compare", str(SILICON), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, err
    with SILICON.open() as file:
        ids = [row["id"] for row in csv.DictReader(file)]
    rows = pl.read_parquet(tmp_path / "rows.parquet")
    assert sorted(rows["point"].unique().to_list()) == sorted(ids) and rows.height == 2 * len(ids)
    assert rows["simulated"].is_finite().all() and rows["measured"].is_finite().all()
    assert "median |error|" in out and "qwen3-32b h100_sxm" in out and "llama-3.1-8b h200_sxm" in out
