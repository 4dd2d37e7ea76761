"""The page `simulate report` writes: one self-contained HTML page of plotly figures for a run folder,
a sweep file, or a `simulate compare --out` file (predicted against measured,
`simulator.report.compare_figures`). The command is `simulator.cli.report_command`.

A run's page opens with the verdict (kept up, OVERLOADED, too short to tell, nothing completed) and
the summary as tables, then its figures (`simulator.report.run_figures`). A run folder is untrusted input:
summary.json is checked for the types the page uses, each Parquet file for the columns it draws and
their values (`check_values`), and every string from the folder is escaped on the page.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError
from simulator.metrics.summary import LATENCY_STAT, REQUEST_NULLABLE, load_verdict
from simulator.report.html import fmt, milliseconds, number, shown, table

if TYPE_CHECKING:  # polars loads when a page is drawn, not when the command line starts
    import polars as pl

COUNTS = ("arrived", "completed", "unfinished", "preemptions", "kv_blocks", "kv_capacity_tokens")
NUMBERS = ("duration", "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
           "utilisation", "offered_rate", "queue_growth", "cost_extrapolations")
LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"), ("queue", "queue"))
# The columns each table must have for the figures, and their kind.
COLUMNS = {
    "requests.parquet": {"request_id": "integer", "arrival": "numeric", "first_token": "numeric",
                         "finish": "numeric", "ttft": "numeric", "tpot": "numeric", "e2el": "numeric",
                         "preemptions": "integer", "finished": "boolean"},
    "steps.parquet": {"start": "numeric", "num_seqs": "integer", "prefill_tokens": "numeric",
                      "kv_blocks_used": "numeric", "num_waiting": "numeric", "num_preempted": "integer"},
    "tokens.parquet": {"request_id": "integer", "index": "integer", "time": "numeric"},
}
OPTIONAL_COLUMNS = {"steps.parquet": {"prefix_cache_queried_tokens": "integer", "prefix_cache_hit_tokens": "integer"}}
"""Read, their kinds checked, when present (runs written before prefix caching lack them)."""
LARGEST = 1e12
"""No run's time (s), count or token index comes near: past it a value is not a run's (and overflows in ms)."""


@dataclass(frozen=True)
class RunFolder:
    """A run folder's settings and summary (summary.json) and the tables the figures draw."""

    settings: dict[str, Any]
    summary: dict[str, Any]
    requests: pl.DataFrame
    steps: pl.DataFrame
    tokens: pl.DataFrame | None
    """None when the run was written with --no-tokens."""


def read_summary(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """summary.json's settings and summary, with every value the page uses checked."""
    try:
        raw = json.loads(path.read_text())
    except UnicodeDecodeError:
        raise InputError(f"{str(path)!r} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
                         ) from None
    except RecursionError:
        raise InputError(f"{str(path)!r} nests deeper than any run's summary") from None
    if not isinstance(raw, dict) or not all(isinstance(raw.get(key), dict) for key in ("settings", "summary")):
        raise InputError(f"{str(path)!r} is not a run's summary (it needs the objects \"settings\" and \"summary\")")
    summary = raw["summary"]
    for key in COUNTS:
        value = summary.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{str(path)!r}: summary.{key} must be a count, got {shown(value)}")
    if summary["kv_blocks"] < 1:
        raise InputError(f"{str(path)!r}: summary.kv_blocks must be positive, got {summary['kv_blocks']}")
    for key, value in summary.items():
        if (key in NUMBERS or LATENCY_STAT.fullmatch(key)) and number(value) is None:
            raise InputError(f"{str(path)!r}: summary.{key} must be a number or null, got {shown(value)}")
    if summary.get("kept_up") not in (True, False, None):
        raise InputError(f"{str(path)!r}: summary.kept_up must be true, false or null, got {shown(summary['kept_up'])}")
    for key in ("load", "cost_extrapolated"):
        if not isinstance(summary.get(key, ""), str):
            raise InputError(f"{str(path)!r}: summary.{key} must be a string, got {shown(summary[key])}")
    return raw["settings"], summary


def read_table(path: Path) -> pl.DataFrame:
    """The columns the figures draw from one of the run's Parquet files, their kinds checked."""
    import polars as pl

    columns = COLUMNS[path.name]
    try:
        schema = pl.read_parquet_schema(path)
        columns = columns | {name: kind for name, kind in OPTIONAL_COLUMNS.get(path.name, {}).items()
                             if name in schema}
        missing = [name for name in columns if name not in schema]
        if missing:
            raise InputError(f"{str(path)!r} lacks the column(s) {', '.join(missing)}")
        for name, kind in columns.items():
            dtype = schema[name]
            if not (dtype == pl.Boolean if kind == "boolean" else getattr(dtype, f"is_{kind}")()):
                raise InputError(f"{str(path)!r}: column {name} holds {dtype}, not {kind} values")
        frame = pl.read_parquet(path, columns=list(columns))
    except (OSError, pl.exceptions.PolarsError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{str(path)!r} is not a readable Parquet file ({reason[:120]})") from None
    check_values(path, frame)
    return frame


def check_values(path: Path, frame: pl.DataFrame) -> None:
    """Every number a run writes is finite, from 0 to `LARGEST`, null only where a request's time did
    not happen (`REQUEST_NULLABLE`), and a finished request has its first token, finish, TTFT and
    E2EL: refuse the first value that is not."""
    import polars as pl

    for name, dtype in frame.schema.items():
        column = frame[name]
        bad = column.is_null() & (path.name != "requests.parquet" or name not in REQUEST_NULLABLE)
        if dtype != pl.Boolean:
            out = (column < 0) | (column > LARGEST)
            bad |= (out | ~column.is_finite() if dtype.is_float() else out).fill_null(False)
        if bad.any():
            row = int(bad.arg_true()[0])
            raise InputError(f"{str(path)!r}: column {name} holds {column[row]!r} at row {row}; a run writes "
                             f"times, counts and tokens as numbers from 0 to {LARGEST:g}, and null only where a "
                             "time did not happen")
    if path.name == "requests.parquet":
        for name in ("first_token", "finish", "ttft", "e2el"):
            missing = frame["finished"] & frame[name].is_null()
            if missing.any():
                row = int(missing.arg_true()[0])
                raise InputError(f"{str(path)!r}: the finished request at row {row} has no {name}")


def read_run_folder(folder: Path) -> RunFolder:
    missing = [name for name in ("requests.parquet", "steps.parquet", "summary.json") if not (folder / name).is_file()]
    if missing:
        raise InputError(f"{str(folder)!r} is not a run folder (no {', '.join(missing)})")
    settings, summary = read_summary(folder / "summary.json")
    tokens = folder / "tokens.parquet"  # absent when the run was written with --no-tokens
    return RunFolder(settings, summary, read_table(folder / "requests.parquet"), read_table(folder / "steps.parquet"),
                     read_table(tokens) if tokens.is_file() else None)


def verdict(summary: dict[str, Any], settings: dict[str, Any]) -> tuple[str, str]:
    """(css class, sentence): did the server keep up? Said only when some request completed."""
    limit = f" before --time-limit {settings['time_limit']} s" if settings.get("time_limit") is not None else ""
    if summary["arrived"] == 0:
        return "bad", f"No request arrived{limit}: nothing was measured."
    if summary["completed"] == 0:
        return "bad", (f"No request completed: {summary['arrived']} arrived, none finished{limit}. Throughput and "
                       "latencies are undefined and whether the server keeps up cannot be told.")
    load = summary.get("load", "")
    said = load_verdict(summary.get("kept_up"), load, fmt(summary.get("offered_rate"), ".2f"),
                        fmt(summary.get("queue_growth"), ".2f"))
    return said or ("unsure", f"The run does not record whether the server kept up (load {load!r}).")


def workload(settings: dict[str, Any]) -> str:
    if settings.get("trace") is not None:
        return f"trace {settings['trace']} at speed {settings.get('trace_speed')}"
    if settings.get("concurrency") is not None:
        return f"{settings['concurrency']} concurrent clients"
    return f"open loop at {settings.get('rate')} req/s"


def run_header(folder: Path, run: RunFolder, drawn: list[str]) -> str:
    """The page's opening: the verdict, the settings in a line, the summary and latency tables, and notes."""
    summary, settings = run.summary, run.settings
    kind, sentence = verdict(summary, settings)
    said = (f"{folder}: policy {settings.get('policy')}, {settings.get('model')} on {settings.get('gpu')} "
            f"({settings.get('cost')} cost model), {workload(settings)}, seed {settings.get('seed')}.")
    rows = [["completed / arrived requests", f"{summary['completed']} / {summary['arrived']}"],
            ["duration (s)", fmt(summary.get("duration"), ".3f")],
            ["request throughput (req/s)", fmt(summary.get("request_throughput"), ".3f")],
            ["output token throughput (tok/s)", fmt(summary.get("output_throughput"), ".1f")],
            ["total token throughput (tok/s)", fmt(summary.get("total_token_throughput"), ".1f")]]
    if "request_goodput" in summary:
        rows.append(["request goodput (req/s)", fmt(summary["request_goodput"], ".3f")])
    if number(summary.get("prefix_cache_queried_tokens")):
        rows.append(["prefix cache hit rate", fmt(summary.get("prefix_cache_hit_rate"), ".2%")])
        if "kv_offload_blocks" in summary:
            tiers = [fmt(summary.get(f"prefix_cache_hit_rate_{tier}"), ".2%") for tier in ("gpu", "host")]
            rows.append(["of it on GPU / host (KV offload)", " / ".join(tiers)])
    rows += [["preemptions", str(summary["preemptions"])],
             ["GPU busy (share of the run)", fmt(summary.get("utilisation"), ".1%")],
             ["KV cache (blocks / tokens)", f"{summary['kv_blocks']} / {summary['kv_capacity_tokens']}"]]
    if "kv_offload_blocks" in summary:
        rows.append(["KV host tier (blocks / tokens)",
                     f"{summary['kv_offload_blocks']} / {summary['kv_offload_capacity_tokens']}"])
    percentiles = sorted({m.group(1) for key in summary if (m := LATENCY_STAT.fullmatch(key)) and m.group(1)[0] == "p"},
                         key=lambda p: float(p[1:]))
    stats = ["mean", "median", "std", *percentiles]
    latencies = [[label] + [milliseconds(summary.get(f"{stat}_{name}")) for stat in stats] for name, label in LATENCIES]
    notes = []
    if summary["unfinished"]:
        notes.append(f"{summary['unfinished']} requests were still in flight at --time-limit "
                     f"{settings.get('time_limit')} s and are reported unfinished.")
    if number(summary.get("cost_extrapolations", 0)):
        notes.append(f"The {settings.get('cost')} cost model extrapolated beyond its measured range (operator: "
                     f"steps): {summary.get('cost_extrapolated')}.")
    no_tokens = "the run was written with --no-tokens" if run.tokens is None else "no request received a token"
    for figure, absent in (("latency", "No latency distributions: no request completed."),
                           ("tokens", f"No token times: {no_tokens}."),
                           ("server", "No server panels: no forward pass ran.")):
        if figure not in drawn:
            notes.append(absent)
    from simulator.report.fleet import servers_section

    return (f'<p class="verdict {kind}">{html.escape(sentence)}</p>\n<p>{html.escape(said)}</p>\n'
            + '<div style="display:flex;gap:3em;align-items:flex-start">' + table(["summary", ""], rows)
            + table(["latency (ms)", *stats], latencies) + "</div>\n" + servers_section(summary, folder)
            + "".join(f"<p>{html.escape(note)}</p>" for note in notes))


def write_report(source: Path, out: Path | None = None) -> Path:
    """The report of a run folder, a sweep file or a `simulate compare --out` file; returns the page written."""
    from simulator.report.compare_figures import compare_figures, compare_notes, is_compare_file, read_compare_file
    from simulator.report.figures import sweep_figures, sweep_notes
    from simulator.report.html import write_page
    from simulator.report.run_figures import run_figures

    if not source.exists():
        raise InputError(f"{str(source)!r} does not exist")
    subject = f"--out {str(out)!r}" if out is not None else None
    if source.is_dir() and (source / "plan.parquet").exists():
        from simulator.report.plan import plan_page

        intro, figures = plan_page(source)
        out = out or source / "report.html"
        write_page(out, f"servesim plan {source.name}", intro, figures, subject)
    elif source.is_dir():
        run = read_run_folder(source)
        figures = run_figures(run.requests, run.steps, run.tokens, run.summary["kv_blocks"])
        out = out or source / "report.html"
        write_page(out, f"servesim run {source.name}", run_header(source, run, list(figures)), figures, subject)
    elif is_compare_file(source):
        compared = read_compare_file(source)
        out = out or source.with_suffix(".html")
        write_page(out, f"servesim compare {source.name}", compare_notes(compared), compare_figures(compared), subject)
    else:
        rows, figures = sweep_figures(source)
        out = out or source.with_suffix(".html")
        write_page(out, f"servesim sweep {source.name}", sweep_notes(rows), figures, subject)
    return out
