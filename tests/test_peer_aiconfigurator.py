"""The side-by-side with aiconfigurator: its rows map to aiconfigurator's estimate as its own accuracy
gate maps them, and the medians are the ones computed by hand on a tiny table."""

from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import polars as pl
import pytest

from benchmarks.peer_aiconfigurator import estimate_args, predict, regrets, side_by_side

ROW = {"id": "r", "mode": "agg", "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "backend": "vllm",
       "backend_version": "", "isl": "4000", "osl": "500", "gemm_quant_mode": "", "moe_quant_mode": "",
       "batch_size": "16", "tp_size": "2",
       "pp_size": "1", "attention_dp_size": "", "moe_tp_size": "", "moe_ep_size": "", "prefill_batch_size": "",
       "prefill_num_workers": "", "prefill_tp_size": "", "decode_batch_size": "", "decode_num_workers": "",
       "decode_tp_size": ""}


def test_an_aggregated_row_gives_its_batch_and_parallelism_and_leaves_empty_cells_out() -> None:
    args = estimate_args({**ROW, "backend_version": "0.12.0", "gemm_quant_mode": "fp8"})
    assert args == {"model_path": "Qwen/Qwen3-32B", "system_name": "h100_sxm", "mode": "agg", "backend_name": "vllm",
                    "backend_version": "0.12.0", "isl": 4000, "osl": 500, "gemm_quant_mode": "fp8",
                    "moe_quant_mode": None, "batch_size": 16, "tp_size": 2, "pp_size": 1}


def test_a_disaggregated_row_gives_its_workers_not_the_aggregated_fields() -> None:
    args = estimate_args({**ROW, "mode": "disagg", "prefill_batch_size": "1", "prefill_num_workers": "3",
                          "prefill_tp_size": "4", "decode_batch_size": "64", "decode_num_workers": "1",
                          "decode_tp_size": "8.0"})
    assert {k: args[k] for k in args if k.startswith(("prefill", "decode"))} == {
        "prefill_batch_size": 1, "prefill_num_workers": 3, "prefill_tp_size": 4, "decode_batch_size": 64,
        "decode_num_workers": 1, "decode_tp_size": 8}
    assert "batch_size" not in args and "tp_size" not in args and args["mode"] == "disagg"


def compare_rows(point: str, gpu: str, tp: int, ttft: tuple[float, float], tpot: tuple[float, float]) -> list[dict]:
    base = {"point": point, "gpu": gpu, "backend": "vllm", "mode": "agg", "quantization": "",
            "tensor_parallel_size": tp}
    return [{**base, "statistic": "ttft_mean", "measured": ttft[0], "simulated": ttft[1]},
            {**base, "statistic": "tpot_mean", "measured": tpot[0], "simulated": tpot[1]}]


def test_the_medians_are_over_the_rows_both_predicted_and_the_held_out_scope_leaves_fitted_rows_out() -> None:
    # h100_sxm has no host fit (held out); h100_sxm_vllm's fit used its bf16 TP 2 rows (fitted).
    compare = pl.DataFrame(
        compare_rows("a", "h100_sxm", 2, (0.100, 0.110), (0.010, 0.0100))      # servesim +10% / 0%
        + compare_rows("b", "h100_sxm", 4, (0.200, 0.250), (0.020, 0.0180))    # +25% / -10%
        + compare_rows("c", "h100_sxm_vllm", 2, (0.100, 0.300), (0.010, 0.0200))  # fitted: +200% / +100%
        + compare_rows("d", "h100_sxm", 1, (0.100, math.nan), (0.010, 0.0100))  # servesim could not: left out
        + compare_rows("e", "h100_sxm", 1, (0.100, 0.100), (0.010, 0.0100)))   # aiconfigurator could not: left out
    peer = pl.DataFrame({"id": ["a", "b", "c", "d", "e"], "ttft_ms": ["150", "200", "100", "100", None],
                         "tpot_ms": ["10", "30", "12", "10", None]})
    table = {r["scope"]: r for r in side_by_side(compare, peer).iter_rows(named=True)}
    everything, held_out = table["all"], table["held out"]
    assert everything["rows"] == 3 and held_out["rows"] == 2
    assert everything["servesim_ttft"] == pytest.approx(0.25)  # median of 10%, 25%, 200%
    assert everything["aiconfigurator_ttft"] == pytest.approx(0.0)  # of 50%, 0%, 0%
    assert everything["servesim_tpot"] == pytest.approx(0.10)  # of 0%, 10%, 100%
    assert everything["aiconfigurator_tpot"] == pytest.approx(0.20)  # of 0%, 50%, 20%
    assert held_out["servesim_ttft"] == pytest.approx(0.175) and held_out["aiconfigurator_ttft"] == pytest.approx(0.25)
    assert held_out["servesim_tpot"] == pytest.approx(0.05) and held_out["aiconfigurator_tpot"] == pytest.approx(0.25)


def test_each_tool_plans_from_its_own_predictions_on_the_same_cases() -> None:
    """Two deployments of one workload: A measures a 10 ms TPOT, B 20 ms, so every limit (the 25th to
    75th percentile, 12.5-17.5 ms) admits A only. servesim predicts B at 30 ms and picks A (regret 0);
    aiconfigurator predicts B at 5 ms with more tokens/s and picks B, which misses (regret 1)."""
    def rows(point: str, tpot: float, ours: float) -> list[dict]:
        base = {"point": point, "backend": "vllm", "mode": "agg", "group": "g", "input_len": 100.0,
                "output_len": 11.0, "gpu": "h100_sxm", "model": "m", "tensor_parallel_size": 1, "quantization": "",
                "concurrency": 8}
        return [{**base, "statistic": "ttft_mean", "measured": 0.1, "simulated": 0.1},
                {**base, "statistic": "tpot_mean", "measured": tpot, "simulated": ours}]

    compare = pl.DataFrame(rows("A", 0.010, 0.010) + rows("B", 0.020, 0.030))
    peer = pl.DataFrame({"id": ["A", "B"], "ttft_ms": ["100", "100"], "tpot_ms": ["10", "5"]})
    table = regrets(compare, peer).row(0, named=True)
    assert table["cases"] == 3 and table["servesim"] == 0.0 and table["aiconfigurator"] == 1.0


def test_predict_writes_a_line_per_row_falls_back_to_the_default_database_and_asks_once_per_deployment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A stand-in for aiconfigurator's `cli_estimate` that refuses the 0.12.0 database and any TP 3:
    the row of 0.12.0 is predicted from the default database, the TP 3 row gets the refusal as its
    reason, and the row that repeats a deployment is asked for once."""
    calls: list[dict] = []

    def cli_estimate(**kwargs: object) -> SimpleNamespace:
        calls.append(kwargs)
        if kwargs["backend_version"] == "0.12.0":
            raise ValueError("no database vllm 0.12.0\nsecond line")
        if kwargs["tp_size"] == 3:
            raise AssertionError("num_heads 64 should be divisible by tp_size 3")
        return SimpleNamespace(ttft=100.0 * float(kwargs["tp_size"]), tpot=10.0)  # type: ignore[arg-type]

    api = ModuleType("aiconfigurator.cli.api")
    api.cli_estimate = cli_estimate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aiconfigurator", ModuleType("aiconfigurator"))
    monkeypatch.setitem(sys.modules, "aiconfigurator.cli", ModuleType("aiconfigurator.cli"))
    monkeypatch.setitem(sys.modules, "aiconfigurator.cli.api", api)
    rows = [{**ROW, "id": "a", "backend_version": "0.12.0"}, {**ROW, "id": "b", "tp_size": "3"},
            {**ROW, "id": "c", "backend_version": "0.12.0"}]
    silicon = tmp_path / "silicon.csv"
    with silicon.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROW))
        writer.writeheader()
        writer.writerows(rows)
    predict(silicon)
    lines = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [line["id"] for line in lines] == ["a", "b", "c"]
    assert lines[0] == lines[2] | {"id": "a"}
    assert (lines[0]["ttft_ms"], lines[0]["tpot_ms"], lines[0]["database"], lines[0]["reason"]) == (
        "200.000000", "10.000000", "default", "")
    assert lines[1]["ttft_ms"] == ""
    assert lines[1]["reason"] == "AssertionError: num_heads 64 should be divisible by tp_size 3"
    assert len(calls) == 2 + 1  # a: 0.12.0 then the default; b: no version of its own, once; c: a's answer
