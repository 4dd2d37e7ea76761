"""`simulate report` and `batch-table --plot`: figures hold the Parquet's data, and render in Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from test_cli import simulate_cli

from simulator.figures import knee, run_figures, sweep_figures
from simulator.outputs import read_metadata

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs "
                                    "it with apt-get; it could not be installed here)")
# Injected into a copy of a page: record console errors before anything runs, then, once loaded,
# write what plotly drew (per figure: trace count and decoded points per trace) into the DOM for --dump-dom.
PROBE_HEAD = """<script>window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
const __error = console.error; console.error = (...a) => { window.__errors.push(a.join(" ")); __error(...a); };
</script>"""
PROBE_TAIL = """<script>window.addEventListener("load", () => setTimeout(() => {
  const plots = [...document.querySelectorAll(".js-plotly-plot")].map(gd => ({id: gd.id,
    traces: gd.data.length, points: gd._fullData.map(t => t.x ? t.x.length : 0),
    svg: gd.querySelectorAll(".main-svg").length}));
  const pre = document.createElement("pre"); pre.id = "probe";
  pre.textContent = JSON.stringify({errors: window.__errors, plots: plots});
  document.body.appendChild(pre);
}, 500));</script>"""


def probe(page: Path, tmp_path: Path) -> dict[str, object]:
    probed = tmp_path / f"probed-{page.name}"
    text = page.read_text()
    probed.write_text(text.replace("<head>", "<head>" + PROBE_HEAD, 1).replace("</body>", PROBE_TAIL + "</body>"))
    done = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                           "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot_colours(page: Path, tmp_path: Path) -> dict[object, int]:
    """Pixel counts by colour of a 1200x1800 headless screenshot."""
    from PIL import Image

    png = tmp_path / f"{page.stem}.png"
    subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,1800", "--virtual-time-budget=20000", f"--screenshot={png}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    image = Image.open(png).convert("RGB")
    return {colour: count for count, colour in image.getcolors(maxcolors=1 << 20) or []}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    codes: list[int] = []
    from simulator.cli import run
    run(["--policy", "continuous", "--rate", "14", "--num-requests", "150", "--input-len-dist", "uniform:0.5",
         "--out", str(out)], exit=codes.append)
    assert codes == [0]
    return out


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep's rows written by hand: two policies, three rates, two seeds; chunked overloads at 12."""
    rows = []
    for policy, rate, seed in ((p, r, s) for p in ("static", "chunked") for r in (4.0, 8.0, 12.0) for s in (0, 1)):
        throughput = min(rate, 6.0 if policy == "static" else 10.0) - 0.1 * seed
        overloaded = (policy == "static" and rate >= 8) or (policy == "chunked" and rate == 12 and seed == 1)
        rows.append({"config_id": f"{policy}{rate:g}{seed}", "policy": policy, "rate": rate, "seed": seed,
                     "error": None, "request_throughput": throughput, "median_ttft": 0.01 * rate + seed,
                     "p99_ttft": 0.02 * rate, "median_itl": 0.001 * rate, "p99_itl": 0.002 * rate,
                     "kept_up": not overloaded})
    rows.append({"config_id": "broken", "policy": "chunked", "rate": 16.0, "seed": 0, "error": "InputError: no"})
    path = tmp_path_factory.mktemp("report") / "sweep.parquet"
    pl.from_dicts(rows, infer_schema_length=None).write_parquet(path)
    return path


def test_run_figures_hold_the_runs_data(run_dir: Path) -> None:
    saved, figures = run_figures(run_dir)
    requests = pl.read_parquet(run_dir / "requests.parquet")
    tokens = pl.read_parquet(run_dir / "tokens.parquet")
    steps = pl.read_parquet(run_dir / "steps.parquet")
    ttft, itl, e2el = figures["latency"].data
    # 150 requests: every value drawn, sorted, at shares 0, 1/149, ..., 1.
    assert np.allclose(ttft.x, np.sort(requests["ttft"].to_numpy()) * 1e3, rtol=1e-12, atol=0)
    assert np.allclose(e2el.x, np.sort(requests["e2el"].to_numpy()) * 1e3, rtol=1e-12, atol=0)
    assert np.allclose(ttft.y, np.arange(150) / 149)
    # ITL: every gap between a request's consecutive tokens, at 2,000 evenly spaced quantiles.
    gaps = tokens.sort("request_id", "index").group_by("request_id").agg(pl.col("time").diff().drop_nulls())
    pooled = gaps.explode("time")["time"].drop_nulls().to_numpy()
    assert len(itl.x) == 2000
    assert np.allclose(itl.x, np.percentile(pooled, np.linspace(0, 100, 2000)) * 1e3)
    batch, kv, waiting = figures["server"].data
    assert np.array_equal(batch.x, steps["start"].to_numpy())
    assert np.array_equal(batch.y, steps["num_seqs"].to_numpy())
    assert np.allclose(kv.y, steps["kv_blocks_used"].to_numpy() * 100 / saved["summary"]["kv_blocks"])
    assert np.array_equal(waiting.y, steps["num_waiting"].to_numpy())
    marks, _ = figures["tokens"].data
    shown = sorted(set(marks.y))
    assert len(shown) == 100 and shown[0] == 0 and shown[-1] == 149
    assert len(marks.x) == tokens.filter(pl.col("request_id").is_in(shown)).height


def test_sweep_figures_average_seeds_and_mark_the_knee(sweep_file: Path) -> None:
    _, figures = sweep_figures(sweep_file)
    curves = {trace.name: trace for trace in figures["throughput-latency"].data if trace.xaxis == "x"}  # TTFT
    static = curves["static median"]
    # Means over the two seeds, by hand: throughput min(rate, 6) - 0.05, median TTFT 0.01 rate + 0.5.
    assert list(static.x) == pytest.approx([3.95, 5.95, 5.95])
    assert list(static.y) == pytest.approx([(0.04 + 0.5) * 1e3, (0.08 + 0.5) * 1e3, (0.12 + 0.5) * 1e3])
    assert "chunked p99" in curves and "static p99" in curves
    load = {trace.name: trace for trace in figures["load"].data}
    assert list(load["chunked"].x) == [4.0, 8.0, 12.0]  # the failed row is left out
    assert list(load["chunked"].marker.symbol) == ["circle", "circle", "x"]
    assert list(load["static"].marker.symbol) == ["circle", "x", "x"]
    assert list(load["chunked knee"].x) == [8.0] and list(load["static knee"].x) == [4.0]


def test_knee_needs_an_overloaded_point() -> None:
    group = pl.DataFrame({"rate": [1.0, 2.0, 3.0], "overloaded": [False, False, False]})
    assert knee(group, "rate") is None
    assert knee(group.with_columns(overloaded=pl.Series([True, True, True])), "rate") is None
    assert knee(group.with_columns(overloaded=pl.Series([False, False, True])), "rate") == 2.0


def test_report_command_writes_and_opens(run_dir: Path, sweep_file: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    code, _, _ = simulate_cli(["report", str(run_dir), "--open"], capsys)
    assert code == 0 and (run_dir / "report.html").is_file()
    assert opened == [(run_dir / "report.html").resolve().as_uri()]
    page = (run_dir / "report.html").read_text()
    assert "<script src" not in page and "Plotly.newPlot" in page  # plotly.js is inlined
    assert simulate_cli(["report", str(sweep_file), "--out", str(tmp_path / "s.html")], capsys)[0] == 0
    assert "InputError: no" in (tmp_path / "s.html").read_text()
    for bad, named in ((tmp_path / "nothing", "nothing"), (tmp_path, "not a run folder"),
                       (run_dir / "requests.parquet", "not a sweep")):
        code, _, err = simulate_cli(["report", str(bad), "--out", str(tmp_path / "never.html")], capsys)
        assert code == 2 and named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "never.html").exists()


def test_batch_table_plot_marks_knee_and_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "table.parquet"
    code, _, _ = simulate_cli(["batch-table", "--batch", "1,8,64,128", "--out", str(out), "--plot"], capsys)
    assert code == 0 and (tmp_path / "table.html").is_file()
    page = (tmp_path / "table.html").read_text()
    meta = read_metadata(out)
    assert f"batch {meta['knee_batch']:.1f}" in page and f"KV cache full ({meta['max_batch']} sequences)" in page


@needs_chromium
def test_reports_render_in_chromium_without_errors(run_dir: Path, sweep_file: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.report import write_report

    run_page = write_report(run_dir, tmp_path / "run.html")
    sweep_page = write_report(sweep_file, tmp_path / "sweep.html")
    table = tmp_path / "table.html"
    assert simulate_cli(["batch-table", "--plot", str(table)], capsys)[0] == 0
    steps = pl.read_parquet(run_dir / "steps.parquet")
    drawn = probe(run_page, tmp_path)
    assert drawn["errors"] == []
    plots = {plot["id"]: plot for plot in drawn["plots"]}  # type: ignore[attr-defined]
    assert set(plots) == {"latency", "tokens", "server"} and all(p["svg"] > 0 for p in plots.values())
    assert plots["server"]["points"] == [steps.height] * 3
    assert plots["latency"]["points"][0] == 150
    drawn = probe(sweep_page, tmp_path)
    assert drawn["errors"] == []
    assert [plot["id"] for plot in drawn["plots"]] == ["throughput-latency", "load"]  # type: ignore[attr-defined]
    assert probe(table, tmp_path)["errors"] == []
    # The screenshot shows the figures: plotly's first trace colour (#636efa) over many pixels.
    for page in (run_page, sweep_page, table):
        assert screenshot_colours(page, tmp_path).get((0x63, 0x6E, 0xFA), 0) > 500, page
