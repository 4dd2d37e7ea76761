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


def test_points_over_their_gpus_bandwidth_are_crosses_and_counted(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base = {"point": ["fast", "fine", "unchecked"], "group": ["g"] * 3, "statistic": ["tpot_mean"] * 3,
            "measured": [0.001, 0.02, 0.03], "simulated": [0.01, 0.021, 0.03], "error": [9.0, 0.05, 0.0]}
    pl.DataFrame(base | {"bandwidth_share": [2.5, 0.4, float("nan")]}).write_parquet(tmp_path / "rows.parquet")
    code, _, err = outcome(["report", str(tmp_path / "rows.parquet")], capsys)
    assert code == 0, err
    page = (tmp_path / "rows.html").read_text()
    assert "3 measured points rerun. 1 of them need more memory bandwidth" in page
    assert '"symbol":["x","circle","circle"]' in page and "decode needs 250% of its GPUs" in page
    # A file written before the column existed draws as before; a mistyped one is refused in one line.
    pl.DataFrame(base).write_parquet(tmp_path / "old.parquet")
    code, _, err = outcome(["report", str(tmp_path / "old.parquet")], capsys)
    assert code == 0 and "need more memory bandwidth" not in (tmp_path / "old.html").read_text(), err
    pl.DataFrame(base | {"bandwidth_share": ["2.5", "0.4", ""]}).write_parquet(tmp_path / "typed.parquet")
    code, _, err = outcome(["report", str(tmp_path / "typed.parquet")], capsys)
    assert code == 2 and "bandwidth_share must be numeric" in err and len(err.strip().splitlines()) == 1, err
