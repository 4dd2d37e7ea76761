"""`simulate report` and `batch-table --plot`: figures hold the Parquet's data, and render in Chromium."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from test_cli import simulate_cli

from simulator.outputs.run_folder import read_metadata
from simulator.report.figures import knee, sweep_figures
from simulator.report.page import read_run_folder
from simulator.report.run_figures import run_figures

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs "
                                    "it with apt-get; it could not be installed here)")
WINDOW = (1200, 3600)
"""Every page is probed and photographed in a window this size, taller than the run's page, so the
subplot boxes the probe measures are where the screenshot shows them."""
# Injected into a copy of a page: record console errors before anything runs, then, once loaded,
# write into the DOM for --dump-dom what plotly drew: per figure its subplots' boxes on the page and
# per trace its subplot, colour and number of points with finite x and y (NaN breaks a line; plotly
# gives an empty trace neither line nor marker).
PROBE_HEAD = """<script>window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
const __error = console.error; console.error = (...a) => { window.__errors.push(a.join(" ")); __error(...a); };
</script>"""
PROBE_TAIL = """<script>window.addEventListener("load", () => setTimeout(() => {
  const finite = v => v !== null && v !== "" && Number.isFinite(Number(v));
  const points = t => t.x && t.y ? Array.from(t.x).filter((x, i) => finite(x) && finite(t.y[i])).length : 0;
  const colour = t => { const c = (t.mode || "").includes("lines") ? t.line.color : t.marker ? t.marker.color : null;
                        return Array.isArray(c) ? c[0] : c; };
  const plots = [...document.querySelectorAll(".js-plotly-plot")].map(gd => {
    const box = gd.getBoundingClientRect(), subplots = {};
    for (const [id, p] of Object.entries(gd._fullLayout._plots)) {
      subplots[id] = [box.left + window.scrollX + p.xaxis._offset, box.top + window.scrollY + p.yaxis._offset,
                      p.xaxis._length, p.yaxis._length];
    }
    return {id: gd.id, svg: gd.querySelectorAll(".main-svg").length, subplots: subplots,
            traces: gd._fullData.map(t => ({name: t.name, subplot: t.xaxis + t.yaxis, colour: colour(t),
                                            points: points(t)}))};
  });
  const verdict = document.querySelector(".verdict");
  const pre = document.createElement("pre"); pre.id = "probe";
  pre.textContent = JSON.stringify({errors: window.__errors, plots: plots, height: document.body.scrollHeight,
                                    verdict: verdict ? verdict.textContent : null});
  document.body.appendChild(pre);
}, 500));</script>"""


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=20000", *args],
                          capture_output=True, text=True, timeout=120)


def probe(page: Path, tmp_path: Path) -> dict[str, Any]:
    probed = tmp_path / f"probed-{page.name}"
    text = page.read_text()
    probed.write_text(text.replace("<head>", "<head>" + PROBE_HEAD, 1).replace("</body>", PROBE_TAIL + "</body>"))
    done = chromium("--dump-dom", probed.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, tmp_path: Path) -> Any:
    from PIL import Image

    png = tmp_path / f"{page.stem}.png"
    chromium(f"--screenshot={png}", page.as_uri()).check_returncode()
    return np.asarray(Image.open(png).convert("RGB")).astype(int)


def pixels_near(region: np.ndarray, colour: str, tolerance: int = 24) -> int:
    """Pixels of `region` within `tolerance` per channel of a CSS colour (#rrggbb, rgb(r, g, b), a name)."""
    from PIL import ImageColor

    rgb = np.array(ImageColor.getrgb(colour)[:3])
    return int(np.sum(np.all(np.abs(region - rgb) <= tolerance, axis=-1)))


def assert_every_trace_drawn(drawn: dict[str, Any], image: np.ndarray) -> None:
    """Each trace with points shows its colour inside its subplot's box of the screenshot."""
    assert drawn["height"] <= WINDOW[1]
    for plot in drawn["plots"]:
        for trace in plot["traces"]:
            if trace["points"]:
                x, y, w, h = (round(v) for v in plot["subplots"][trace["subplot"]])
                region = image[y:y + h, x:x + w]
                assert pixels_near(region, trace["colour"]) >= 10, (plot["id"], trace["name"])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """150 requests on a KV cache of 1,500 blocks: preemptions, stalls, and an overloaded server."""
    out = tmp_path_factory.mktemp("report") / "run"
    codes: list[int] = []
    from simulator.cli.main import run
    run(["--policy", "continuous", "--rate", "14", "--num-requests", "150", "--input-len-dist", "uniform:0.5",
         "--num-gpu-blocks-override", "1500", "--out", str(out)], exit=codes.append)
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


def figures_of(run_dir: Path) -> dict[str, Any]:
    run = read_run_folder(run_dir)
    return run_figures(run.requests, run.steps, run.tokens, run.summary["kv_blocks"])


def finite_points(trace: Any) -> int:
    """Points a line or marker trace draws: NaN breaks a line and is no point."""
    return int(np.sum(np.isfinite(np.asarray(trace.x, float)) & np.isfinite(np.asarray(trace.y, float))))


def test_latency_cdfs_hold_the_runs_data_and_mark_its_percentiles(run_dir: Path) -> None:
    figure = figures_of(run_dir)["latency"]
    requests = pl.read_parquet(run_dir / "requests.parquet")
    tokens = pl.read_parquet(run_dir / "tokens.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    traces = {trace.name: trace for trace in figure.data}
    assert list(traces) == ["TTFT", "TTFT percentiles", "TPOT", "TPOT percentiles", "ITL", "ITL percentiles",
                            "E2EL", "E2EL percentiles"]
    # 150 requests: every value drawn, sorted, at shares 0, 1/149, ..., 1.
    for name in ("ttft", "tpot", "e2el"):
        assert np.allclose(traces[name.upper()].x, np.sort(requests[name].to_numpy()) * 1e3, rtol=1e-12, atol=0)
    assert np.allclose(traces["TTFT"].y, np.arange(150) / 149)
    # ITL: every gap between a request's consecutive tokens, at 2,000 evenly spaced quantiles.
    gaps = tokens.sort("request_id", "index").group_by("request_id").agg(pl.col("time").diff().drop_nulls())
    pooled = gaps.explode("time")["time"].drop_nulls().to_numpy()
    assert len(traces["ITL"].x) == 2000
    assert np.allclose(traces["ITL"].x, np.percentile(pooled, np.linspace(0, 100, 2000)) * 1e3)
    # The marks are the summary's percentiles, which metrics.py computed its own way (ITL from a
    # histogram of the step log, not from tokens.parquet).
    for name in ("ttft", "tpot", "itl", "e2el"):
        marks = traces[f"{name.upper()} percentiles"]
        assert list(marks.y) == [0.5, 0.9, 0.99]
        assert np.allclose(marks.x, [summary[f"p{q}_{name}"] * 1e3 for q in (50, 90, 99)], rtol=1e-9)
        assert [text.split()[0] for text in marks.text] == ["p50", "p90", "p99"]
    assert all(axis.type == "log" for axis in (figure.layout.xaxis, figure.layout.xaxis2, figure.layout.xaxis3,
                                               figure.layout.xaxis4))


def test_token_rows_show_each_sampled_requests_stalls_and_preemption(run_dir: Path) -> None:
    figure = figures_of(run_dir)["tokens"]
    requests = pl.read_parquet(run_dir / "requests.parquet")
    tokens = pl.read_parquet(run_dir / "tokens.parquet")
    waiting, decoding, stalls, preempted, gap, stall_gap = figure.data
    ids = sorted({int(y) for y in decoding.y if np.isfinite(y)})
    assert len(ids) == 50 and ids[0] == 0 and ids[-1] == 149
    assert ids == sorted(set(np.linspace(0, 149, 50).round().astype(int).tolist()))
    # Stalls by hand: a gap over 3 median gaps of the finished requests (all 150 finished).
    gaps = tokens.sort("request_id", "index").with_columns(gap=pl.col("time").diff().over("request_id"))
    threshold = 3 * gaps["gap"].drop_nulls().median()  # type: ignore[operator]
    shown = gaps.filter(pl.col("request_id").is_in(ids))
    num_stalls = shown.filter(pl.col("gap") > threshold).height
    assert num_stalls > 0
    assert finite_points(stalls) == 2 * num_stalls and finite_points(stall_gap) == num_stalls
    assert finite_points(gap) + finite_points(stall_gap) == shown.height - len(ids)
    assert finite_points(decoding) == 2 * (len(ids) + num_stalls)  # a run of tokens ends at each stall
    assert finite_points(waiting) == 2 * len(ids)
    assert np.allclose(np.asarray(waiting.x[0::3]), requests["arrival"].to_numpy()[ids])
    assert np.allclose(np.asarray(waiting.x[1::3]), requests["first_token"].to_numpy()[ids])
    were_preempted = requests.filter(pl.col("request_id").is_in(ids) & (pl.col("preemptions") > 0))
    assert were_preempted.height > 0 and list(preempted.y) == were_preempted["request_id"].to_list()
    assert list(preempted.text) == [f"preempted {n}x" for n in were_preempted["preemptions"]]


def test_server_panels_keep_prefill_and_decode_steps_apart(run_dir: Path) -> None:
    figure = figures_of(run_dir)["server"]
    steps = pl.read_parquet(run_dir / "steps.parquet")
    kv_blocks = json.loads((run_dir / "summary.json").read_text())["summary"]["kv_blocks"]
    decode, prefill, prefill_tokens, kv, preempting, waiting = figure.data
    start, seqs, prefilled = (steps[c].to_numpy() for c in ("start", "num_seqs", "prefill_tokens"))
    assert np.array_equal(decode.x, start[prefilled == 0]) and np.array_equal(decode.y, seqs[prefilled == 0])
    assert np.array_equal(prefill.x, start[prefilled > 0]) and np.array_equal(prefill.y, seqs[prefilled > 0])
    assert 0 < len(prefill.x) < steps.height
    assert np.array_equal(prefill_tokens.y, prefilled[prefilled > 0])
    assert np.allclose(kv.y, steps["kv_blocks_used"].to_numpy() * 100 / kv_blocks)
    preempted = steps["num_preempted"].to_numpy()
    assert np.array_equal(preempting.x, start[preempted > 0]) and len(preempting.x) > 0
    assert np.array_equal(waiting.y, steps["num_waiting"].to_numpy())


def test_run_page_opens_with_the_verdict_and_the_summary(run_dir: Path, tmp_path: Path) -> None:
    from simulator.report.page import write_report

    page = write_report(run_dir, tmp_path / "run.html").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    requests = pl.read_parquet(run_dir / "requests.parquet")
    verdict = re.search(r'<p class="verdict bad">(.*?)</p>', page)
    assert verdict and verdict.group(1).startswith(
        f"OVERLOADED: the server did not keep up with {summary['offered_rate']:.2f} req/s")
    cells = re.findall(r"<tr><td>(.*?)</td>(.*?)</tr>", page)
    rows = {label: re.findall(r"<td>(.*?)</td>", rest) for label, rest in cells}
    assert rows["completed / arrived requests"] == ["150 / 150"]
    assert rows["preemptions"] == [str(int(requests["preemptions"].sum()))]
    # Latency rows in ms, by hand from requests.parquet: mean, median, std, p50, p90, p99.
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL")):
        values = requests[name].drop_nulls().to_numpy() * 1e3
        expected = [np.mean(values), np.median(values), np.std(values), *np.percentile(values, [50, 90, 99])]
        assert rows[label] == [f"{v:.2f}" for v in expected]
    assert len(rows["ITL"]) == 6 and len(rows["queue"]) == 6


@pytest.mark.parametrize(("summary", "kind", "start"), [
    ({"arrived": 0, "completed": 0, "load": "empty", "kept_up": None}, "bad",
     "No request arrived before --time-limit 0.5 s"),
    # --time-limit cut every request short: the server did not "keep up", nothing finished.
    ({"arrived": 10, "completed": 0, "load": "open loop", "kept_up": True}, "bad",
     "No request completed: 10 arrived, none finished before --time-limit 0.5 s."),
    ({"arrived": 10, "completed": 9, "load": "open loop", "kept_up": False, "offered_rate": 8.0,
      "queue_growth": 1.25}, "bad", "OVERLOADED: the server did not keep up with 8.00 req/s (requests in the "
     "system grew by 1.25/s"),
    ({"arrived": 10, "completed": 10, "load": "open loop", "kept_up": None}, "unsure", "Too short to tell"),
    ({"arrived": 10, "completed": 10, "load": "all at once", "kept_up": None}, "unsure",
     "All requests arrived at once"),
    ({"arrived": 10, "completed": 10, "load": "closed loop", "kept_up": True}, "good",
     "The server kept up (closed loop)."),
])
def test_verdict_says_what_the_run_shows(summary: dict[str, Any], kind: str, start: str) -> None:
    from simulator.report.page import verdict

    said = verdict(summary, {"time_limit": 0.5})
    assert said[0] == kind and said[1].startswith(start)


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


def test_slo_capacity_is_the_last_load_before_the_first_that_fails_its_slos() -> None:
    from simulator.report.figures import slo_capacity

    group = pl.DataFrame({"rate": [1.0, 2.0, 3.0, 4.0], "overloaded": [False, False, False, True],
                          "completed": [100, 100, 100, 100], "good_requests": [100, 99, 98, 40]})
    assert slo_capacity(group, "rate") == 2.0  # 98 of 100 good at rate 3 is under 99%
    assert slo_capacity(group.with_columns(good_requests=pl.lit(100)), "rate") == 3.0  # then overloaded at 4
    assert slo_capacity(group.with_columns(good_requests=pl.lit(10)), "rate") is None
    assert slo_capacity(group.drop("good_requests"), "rate") is None


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
def test_reports_render_in_chromium_and_every_panel_draws_its_data(run_dir: Path, sweep_file: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.report.page import write_report

    run_page = write_report(run_dir, tmp_path / "run.html")
    sweep_page = write_report(sweep_file, tmp_path / "sweep.html")
    table = tmp_path / "table.html"
    assert simulate_cli(["batch-table", "--plot", str(table)], capsys)[0] == 0
    steps = pl.read_parquet(run_dir / "steps.parquet")
    requests = pl.read_parquet(run_dir / "requests.parquet")
    drawn = probe(run_page, tmp_path)
    assert drawn["errors"] == []
    assert drawn["verdict"].startswith("OVERLOADED: the server did not keep up")
    plots = {plot["id"]: {t["name"]: t["points"] for t in plot["traces"]} for plot in drawn["plots"]}
    assert list(plots) == ["latency", "tokens", "server"] and all(p["svg"] > 0 for p in drawn["plots"])
    assert plots["latency"]["TTFT"] == plots["latency"]["E2EL"] == 150 and plots["latency"]["ITL"] == 2000
    assert plots["latency"]["TPOT"] == requests["tpot"].drop_nulls().len()
    assert all(plots["latency"][f"{name} percentiles"] == 3 for name in ("TTFT", "TPOT", "ITL", "E2EL"))
    prefill = int((steps["prefill_tokens"] > 0).sum())
    assert plots["server"]["decode-only step"] == steps.height - prefill > 0
    assert plots["server"]["step with a prefill"] == plots["server"]["prefill tokens"] == prefill > 0
    assert plots["server"]["KV cache used"] == plots["server"]["waiting requests"] == steps.height
    assert plots["server"]["step that preempted"] == int((steps["num_preempted"] > 0).sum()) > 0
    assert plots["tokens"]["waiting for the first token"] == 100  # 50 rows, two ends each
    assert all(plots["tokens"][name] > 0 for name in plots["tokens"])
    image = screenshot(run_page, tmp_path)
    assert_every_trace_drawn(drawn, image)
    assert pixels_near(image[:400], "#fdecea", 2) > 10_000  # the verdict's red box sits in the header
    drawn = probe(sweep_page, tmp_path)
    assert drawn["errors"] == []
    assert [plot["id"] for plot in drawn["plots"]] == ["throughput-latency", "load"]
    assert_every_trace_drawn(drawn, screenshot(sweep_page, tmp_path))
    drawn = probe(table, tmp_path)
    assert drawn["errors"] == []
    assert_every_trace_drawn(drawn, screenshot(table, tmp_path))
