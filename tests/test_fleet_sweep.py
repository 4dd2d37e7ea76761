"""Replicas, routers and P/D pools as sweep axes, and the fleet in the reports."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from test_cli import simulate_cli

SMALL = ["--num-requests", "120", "--input-len", "500", "--output-len", "40"]


def sweep(axes: list[str], out: Path, capsys: pytest.CaptureFixture[str], rows: int) -> pl.DataFrame:
    """`simulate sweep` over `axes` (small chapter-shaped requests), every one of `rows` rows fine."""
    code, stdout, _ = simulate_cli(["sweep", *axes, *SMALL, "--jobs", "1", "--out", str(out)], capsys)
    assert code == 0, stdout
    table = pl.read_parquet(out)
    assert table.height == rows and table["error"].null_count() == rows
    return table


def test_replicas_and_routers_are_sweep_axes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row per (replicas, router): twice the replicas at the same total rate spread the requests
    (each replica's count in the row), and the report draws the load per server."""
    out = tmp_path / "sweep.parquet"
    rows = sweep(["--num-replicas", "2,4", "--router", "round-robin,least-loaded", "--rate", "40"], out, capsys, 4)
    for row in rows.iter_rows(named=True):
        per_server = [s["requests"] for s in row["servers"]]
        assert len(per_server) == row["num_replicas"] and sum(per_server) == 120
        assert row["replica_requests_min"] == min(per_server) and row["replica_requests_max"] == max(per_server)
        if row["router"] == "round-robin":
            assert max(per_server) - min(per_server) <= 1
    assert simulate_cli(["report", str(out)], capsys)[0] == 0
    page = out.with_suffix(".html").read_text()
    assert "Load per server and KV transfers" in page


def test_disaggregated_pools_are_sweep_axes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """P/D pools swept: each row holds its KV transfer times, the same 500-token transfer in every one
    (500 x 131072 bytes at 450 GB/s + 10 us), and the decode pool's load."""
    rows = sweep(["--prefill-replicas", "1,2", "--decode-replicas", "1,2", "--rate", "20"], tmp_path / "sweep.parquet",
                 capsys, 4)
    assert rows["mean_transfer"].to_numpy() == pytest.approx(500 * 131072 / 450e9 + 1e-5, rel=1e-9)
    assert (rows["decode_requests_max"] <= 120).all() and (rows["prefill_requests_max"] <= 120).all()


def test_run_report_lists_the_servers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A P/D run's page has a row per server with its role and transfer times; summary.servers
    from the file is checked like the rest of the summary."""
    run = tmp_path / "run"
    assert simulate_cli(["--prefill-replicas", "1", "--decode-replicas", "2", "--rate", "20", *SMALL,
                         "--out", str(run)], capsys)[0] == 0
    assert simulate_cli(["report", str(run)], capsys)[0] == 0
    page = (run / "report.html").read_text()
    assert "<h3>Servers</h3>" in page and "<td>prefill</td>" in page and page.count("<td>decode</td>") == 2
    summary_file = run / "summary.json"
    data = json.loads(summary_file.read_text())
    data["summary"]["servers"][0]["role"] = "<script>"
    summary_file.write_text(json.dumps(data))
    code, _, stderr = simulate_cli(["report", str(run)], capsys)
    assert code == 2 and "summary.servers role must be one of" in stderr


def test_an_unknown_router_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    code, _, stderr = simulate_cli(["sweep", "--num-replicas", "2", "--router", "round-robin,fastest", *SMALL,
                                    "--out", str(out)], capsys)
    assert code == 2 and "--router lists 'fastest'" in stderr and not out.exists()
