"""`simulate report` on a plan folder: the Pareto frontier as plot_pareto defines it, worked by hand,
and an untrusted plan.parquet refused in one line."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from simulator.cli.main import run
from simulator.report.plan import pareto, read_plan, viable


def plan_folder(tmp_path: Path, **changes: object) -> Path:
    rows = pl.DataFrame({
        "deployment": ["a", "b", "c", "d", "e"], "kind": ["aggregated"] * 3 + ["disaggregated", "aggregated"],
        "how": ["simulated", "symmetry: 8 x one replica", "simulated", "simulated", "refused"],
        "gpus": [8, 8, 1, 8, 2], "max_rate": [90.0, 73.0, 9.0, 80.0, None],
        "max_rate_high": [92.0, None, 9.4, 83.0, None],
        # (tokens/s/user, tokens/s/GPU): a (56, 3300), b (70, 2770), c (70, 2800), d (60, 3000), e refused.
        "tokens_per_s_per_user": [56.0, 70.0, 70.0, 60.0, None],
        "tokens_per_s_per_gpu": [3300.0, 2770.0, 2800.0, 3000.0, None],
        "viable": [True, True, True, True, False], "cost_per_million_tokens": [0.2, 0.25, 0.25, 0.23, None],
    }).with_columns(**{name: pl.lit(value) for name, value in changes.items()})
    folder = tmp_path / "plan"
    folder.mkdir()
    rows.write_parquet(folder / "plan.parquet")
    return folder


def test_the_frontier_keeps_what_nothing_beats_on_both_axes(tmp_path: Path) -> None:
    rows = viable(read_plan(plan_folder(tmp_path)))
    assert rows.height == 4
    # b is beaten by c (same tokens/s/user, more per GPU); a, d and c each win somewhere.
    assert pareto(rows)["deployment"].to_list() == ["a", "d", "c"]


def test_report_on_a_plan_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = plan_folder(tmp_path)
    codes: list[int] = []
    run(["report", str(folder)], exit=codes.append)
    assert codes == [0]
    page = (folder / "report.html").read_text()
    assert "Pareto frontier" in page and "disaggregated" in page and "USD per million output tokens" in page
    (tmp_path / "x").mkdir()
    bad = plan_folder(tmp_path / "x", gpus="eight")
    run(["report", str(bad)], exit=codes.append)
    err = capsys.readouterr().err
    assert codes[-1] == 2 and "column gpus must be integer" in err and len(err.strip().splitlines()) == 1
