"""`simulate report` on a `simulate compare --out` file: predicted against measured, escaped."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from test_compare import ROW, outcome, write_csv


def test_the_report_draws_simulated_against_measured_and_escapes_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "<script>alert(1)</script>"
    path = write_csv(tmp_path / "points.csv", ROW | {"id": hostile}, ROW | {"id": "plain", "concurrency": "8"})
    code, _, err = outcome(["compare", str(path), "--out", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, err
    code, out, err = outcome(["report", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0 and "rows.html" in out, err
    page = (tmp_path / "rows.html").read_text()
    assert 'id="predicted-measured"' in page and "2 measured points rerun" in page
    # Escaped for plotly's text (which reads tags), then JSON-encoded by plotly ("/" as \u002f).
    assert hostile not in page and "&lt;script&gt;alert(1)&lt;\\u002fscript&gt;" in page
    assert page.count("median |error|") >= 1 and "ttft_mean" in page and "tpot_mean" in page


def test_a_compare_file_with_a_mistyped_column_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = pl.DataFrame({"point": ["a"], "group": ["g"], "statistic": ["ttft_mean"], "measured": ["0.1"],
                         "simulated": [0.2], "error": [1.0]})
    rows.write_parquet(tmp_path / "rows.parquet")
    code, _, err = outcome(["report", str(tmp_path / "rows.parquet")], capsys)
    assert code == 2 and "measured" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "rows.html").exists()
