"""`simulate report` on run folders it cannot trust: damaged files, runs where nothing finished, hostile
strings, and an --out it cannot write. Each bad input is one error line and exit 2, and no page."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from test_cli import simulate_cli
from test_report import CHROMIUM


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inputs") / "run"
    codes: list[int] = []
    from simulator.cli.main import run
    run(["--rate", "8", "--num-requests", "30", "--out", str(out)], exit=codes.append)
    assert codes == [0]
    return out


def copy_of(run_dir: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / name))


def refused(args: list[str], capsys: pytest.CaptureFixture[str], *named: str) -> None:
    """Exit 2 with one line that names each of `named`, no traceback."""
    code, _, err = simulate_cli(args, capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    for text in named:
        assert text in err, (text, err)


def edit_summary(folder: Path, edit: object) -> None:
    path = folder / "summary.json"
    saved = json.loads(path.read_text())
    path.write_text(edit(saved) if callable(edit) else str(edit))


def test_out_naming_a_folder_is_refused(small_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["report", str(small_run), "--out", str(tmp_path)], capsys, f"--out {str(tmp_path)!r} is a folder")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["/proc/x", "/proc/x/report.html"])
def test_unwritable_out_is_refused(small_run: Path, out: str, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["report", str(small_run), "--out", out], capsys, f"--out {out!r} cannot be written")


@pytest.mark.parametrize("table", ["requests", "steps", "tokens"])
def test_truncated_parquet_is_named(small_run: Path, tmp_path: Path, table: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder = copy_of(small_run, tmp_path)
    path = folder / f"{table}.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    refused(["report", str(folder)], capsys, repr(str(path)), "is not a readable Parquet file")
    assert not (folder / "report.html").exists()


def test_parquet_without_a_drawn_column_is_named(small_run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = copy_of(small_run, tmp_path)
    pl.read_parquet(folder / "requests.parquet").drop("ttft").write_parquet(folder / "requests.parquet")
    refused(["report", str(folder)], capsys, "requests.parquet", "lacks the column(s) ttft")
    pl.read_parquet(small_run / "requests.parquet").with_columns(pl.col("ttft").cast(pl.String)).write_parquet(
        folder / "requests.parquet")
    refused(["report", str(folder)], capsys, "column ttft holds String, not numeric values")


@pytest.mark.parametrize(("table", "column", "value", "named"), [
    ("requests", "ttft", float("nan"), "column ttft holds nan at row 3"),
    ("requests", "e2el", float("inf"), "column e2el holds inf at row 3"),
    ("steps", "num_waiting", -2, "column num_waiting holds -2 at row 3"),
    ("tokens", "time", -0.5, "column time holds -0.5 at row 3"),
    ("requests", "ttft", None, "the finished request at row 3 has no ttft"),
])
def test_a_value_no_run_writes_is_named(small_run: Path, tmp_path: Path, table: str, column: str, value: object,
                                        named: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A run writes its times, counts and tokens as numbers of at least 0 and null where none happened,
    and a finished request has every time; a NaN drew nothing but a traceback before."""
    folder = copy_of(small_run, tmp_path)
    path = folder / f"{table}.parquet"
    frame = pl.read_parquet(path)
    assert frame["finished"][3] if table == "requests" else True
    cells = frame[column].to_list()
    cells[3] = value
    frame.with_columns(pl.Series(column, cells, dtype=frame[column].dtype)).write_parquet(path)
    refused(["report", str(folder)], capsys, repr(str(path)), named)
    assert not (folder / "report.html").exists()


def test_a_run_whose_latencies_are_all_zero_still_gets_a_page(small_run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Zero is a number a file may hold: nothing to place on the log axes, and still a page."""
    folder = copy_of(small_run, tmp_path)
    path = folder / "requests.parquet"
    pl.read_parquet(path).with_columns(ttft=0.0, e2el=0.0).write_parquet(path)
    code, _, err = simulate_cli(["report", str(folder)], capsys)
    assert code == 0, err
    assert 'id="latency"' in (folder / "report.html").read_text()


@pytest.mark.parametrize(("edit", "named"), [
    ('{"settings": {}, "summary": {"completed": 1', "is not valid JSON (Expecting"),
    ("[1, 2]", "is not a run's summary"),
    ("[" * 10**5, "nests deeper than any run's summary"),  # a RecursionError traceback (the fuzz of summaries)
    (lambda s: json.dumps(s | {"summary": s["summary"] | {"completed": "lots"}}),
     "summary.completed must be a count, got 'lots'"),
    (lambda s: json.dumps(s | {"summary": s["summary"] | {"p99_ttft": [1]}}),
     "summary.p99_ttft must be a number or null, got [1]"),
    (lambda s: json.dumps(s | {"summary": s["summary"] | {"kv_blocks": 0}}), "summary.kv_blocks must be positive"),
    (lambda s: json.dumps(s | {"summary": s["summary"] | {"kept_up": "yes"}}), "summary.kept_up must be true"),
])
def test_broken_summary_is_named(small_run: Path, tmp_path: Path, edit: object, named: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = copy_of(small_run, tmp_path)
    edit_summary(folder, edit)
    refused(["report", str(folder)], capsys, "summary.json", named)
    assert not (folder / "report.html").exists()


@pytest.mark.parametrize(("limit", "said"), [
    ("0.001", "No request arrived before --time-limit 0.001 s: nothing was measured."),
    ("0.5", "No request completed: 2 arrived, none finished before --time-limit 0.5 s."),
])
def test_run_where_nothing_completed_gets_a_page_that_says_so(tmp_path: Path, limit: str, said: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    assert simulate_cli(["--rate", "10", "--num-requests", "10", "--time-limit", limit, "--out", str(folder)],
                        capsys)[0] == 0
    code, _, err = simulate_cli(["report", str(folder)], capsys)
    assert code == 0, err
    page = (folder / "report.html").read_text()
    assert f'<p class="verdict bad">{said}' in page and "kept up" not in page
    assert "No latency distributions: no request completed." in page and 'id="latency"' not in page


HOSTILE = '<img src=x onerror="document.body.setAttribute(\'data-pwned\', 1)"></p><script>alert(1)</script>'


def test_strings_from_the_run_folder_are_escaped(small_run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = copy_of(small_run, tmp_path, "run<b>x</b>")
    edit_summary(folder, lambda s: json.dumps(s | {
        "settings": s["settings"] | {"policy": HOSTILE, "model": HOSTILE, "rate": HOSTILE, "seed": HOSTILE},
        "summary": s["summary"] | {"kept_up": True, "load": HOSTILE, "cost_extrapolations": 1,
                                   "cost_extrapolated": HOSTILE}}))
    code, _, err = simulate_cli(["report", str(folder)], capsys)
    assert code == 0, err
    page = (folder / "report.html").read_text()
    assert "<img" not in page and "<script>alert" not in page and "<b>x</b>" not in page
    assert page.count("&lt;img src=x onerror=") == 6  # policy, model, rate, seed, the verdict's load, the note
    assert "run&lt;b&gt;x&lt;/b&gt;" in page
    if CHROMIUM is not None:  # the browser's view agrees: no element was made from the strings
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                              "--dump-dom", (folder / "report.html").as_uri()], capture_output=True, text=True,
                             timeout=120).stdout
        assert "<body" in dom and "data-pwned=" not in dom.split("<body", 1)[1].split(">", 1)[0]


def test_reports_do_not_reach_up_into_the_command_line(small_run: Path, tmp_path: Path) -> None:
    """Imports point down: drawing a run's or a sweep's page loads nothing of simulator.cli.main."""
    sweep = tmp_path / "sweep.parquet"
    pl.DataFrame({"config_id": ["a"], "policy": ["static"], "rate": [1.0], "seed": [0], "error": [None],
                  "request_throughput": [1.0], "median_ttft": [0.1], "p99_ttft": [0.2], "median_itl": [0.01],
                  "p99_itl": [0.02], "kept_up": [True]}).write_parquet(sweep)
    script = ("import sys; from pathlib import Path; from simulator.report.page import write_report; "
              f"write_report(Path({str(small_run)!r}), Path({str(tmp_path / 'r.html')!r})); "
              f"write_report(Path({str(sweep)!r})); "
              "print(sorted(m for m in sys.modules if m.startswith('simulator.cli.main')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parent.parent)
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "r.html").is_file() and sweep.with_suffix(".html").is_file()


def test_a_sweep_with_a_point_off_the_load_axis_gets_a_page(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`--rate 2,4,none --concurrency 4 --goodput ...`: the closed-loop point has no rate to stand at
    on the load figure, and is left off it; the SLO capacity was a TypeError on its None."""
    sweep = tmp_path / "sweep.parquet"
    code, _, err = simulate_cli(["sweep", "--rate", "2,4,none", "--concurrency", "4", "--num-requests", "30",
                                 "--goodput", "ttft:300", "--out", str(sweep)], capsys)
    assert code == 0, err
    code, _, err = simulate_cli(["report", str(sweep)], capsys)
    assert code == 0, err
    page = sweep.with_suffix(".html").read_text()
    assert 'id="load"' in page and 'id="throughput-latency"' in page


@pytest.mark.parametrize(("edit", "named"), [
    (lambda rows: rows.with_columns(config_id=pl.int_range(pl.len())), "config_id column is not one distinct text"),
    (lambda rows: rows.with_columns(kept_up=pl.lit("yes")), "column kept_up holds String, not true or false"),
    (lambda rows: rows.drop("p90_ttft", "p99_ttft", "p50_ttft"),
     "lacks what its figures draw: a tail percentile of ttft"),
])
def test_a_sweep_file_no_sweep_writes_is_named(tmp_path: Path, edit: object, named: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep.parquet"
    assert simulate_cli(["sweep", "--rate", "2,4", "--num-requests", "30", "--out", str(sweep)], capsys)[0] == 0
    edit(pl.read_parquet(sweep)).write_parquet(sweep)  # type: ignore[operator]
    refused(["report", str(sweep)], capsys, repr(str(sweep)), named)
    assert not sweep.with_suffix(".html").exists()


def test_a_sweep_point_without_its_count_of_good_requests_does_not_meet_the_slos(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A row whose good_requests is null (a file edited or merged by hand) is drawn, and the SLO
    capacity stops below it; it was a TypeError comparing None (the fuzz of sweep files)."""
    sweep = tmp_path / "sweep.parquet"
    assert simulate_cli(["sweep", "--rate", "1,2,3", "--num-requests", "30", "--goodput", "ttft:5000",
                         "--out", str(sweep)], capsys)[0] == 0
    rows = pl.read_parquet(sweep)
    assert (rows["good_requests"] == rows["completed"]).all()  # every point meets the SLOs as written
    rows.with_columns(good_requests=pl.when(pl.col("rate") == 2).then(None).otherwise(pl.col("good_requests"))
                      ).write_parquet(sweep)
    code, _, err = simulate_cli(["report", str(sweep)], capsys)
    assert code == 0, err
    page = sweep.with_suffix(".html").read_text()
    assert "SLO capacity 1" in page and "SLO capacity 3" not in page
