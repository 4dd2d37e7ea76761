"""The files servesim reads, fuzzed through the command line (hypothesis): traces (CSV, JSONL,
Parquet, Mooncake, Azure), model config.json files, GPU profile folders (profile.json, roofline.json,
Parquet tables), measured results (silicon CSV, vLLM JSON) and sweep files, each malformed at random.
Each call holds fuzz_surface.check; a refusal names the file, and where it blames a line or row of a
trace with one bad cell, it is the changed one (the readers' own property, test_trace_lines.py, here
through the command line and over more layouts)."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from fuzz_surface import Huge, Outcome, check, fuzz_settings, in_folder, leftovers, simulate
from hypothesis import example, given
from hypothesis import strategies as st
from test_readers import LLAMA_FILE, SILICON_ROW, needs_models
from test_trace_lines import BAD_CELLS

from simulator.deploy.hardware import load_profile

JSON_EDGES: list[Any] = [None, True, False, 0, -1, 2**63, 2**64, -(2**63), 1e308, -1e308, 1e-300, math.nan,
                         math.inf, -math.inf, "", " ", Huge("x" * 10**5), "\u202e\u05e9", "a\u0301", [], {}, [1, "a"],
                         {"a": [None]}, "1e3", "٣"]
"""JSON values no field should take on faith (nan and inf as Python's json writes them: NaN, Infinity)."""
ODD_NAMES = [value for value in JSON_EDGES if isinstance(value, str)]
"""Column and field names no reader knows."""
GARBAGE = st.one_of(st.just(b""), st.just(b"\xff\xfe\x00garbage\x80"), st.binary(max_size=300),
                    st.just(b"\n\n\n"), st.just(("[" * 10**5).encode()))
"""Whole files that are no file of any kind: empty, binary, deeply nested."""


def outcome_in(folder: Path, args: list[str], echoes: tuple[str, ...] = ()) -> Outcome:
    outcome = simulate(args)
    check(outcome, echoes)
    assert not leftovers(folder), leftovers(folder)
    return outcome


@st.composite
def mutated_json(draw: st.DrawFn, record: dict[str, Any]) -> bytes:
    """`record` with a few fields changed to edge values, dropped or added, or a file of garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(GARBAGE)
    changed = dict(record)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(changed)) | st.sampled_from(ODD_NAMES))
        if draw(st.booleans()) and key in changed:
            del changed[key]
        else:
            changed[key] = draw(st.sampled_from(JSON_EDGES))
        if not changed:
            break
    text = json.dumps(changed)
    return text[: draw(st.integers(0, len(text)))].encode() if draw(st.integers(0, 9)) == 0 else text.encode()


def rows_as(layout: str, table: dict[str, list[Any]], path: Path) -> None:
    """Write `table` as a trace file of `layout` (its values as given, however wrong)."""
    rows = range(len(next(iter(table.values()))))
    if layout in ("csv", "azure"):
        path.write_text(",".join(table) + "\n" + "".join(",".join(str(table[c][i]) for c in table) + "\n"
                                                        for i in rows))
    elif layout == "parquet":
        pl.DataFrame(table, strict=False).write_parquet(path)
    else:
        path.write_text("".join(json.dumps({c: table[c][i] for c in table}) + "\n" for i in rows))


LAYOUTS = {
    # layout: the file's suffix, its arrival, prompt and output columns, and extra columns of its own
    "csv": (".csv", ("arrival", "prompt_tokens", "output_tokens"), {}),
    "jsonl": (".jsonl", ("arrival", "prompt_tokens", "output_tokens"), {}),
    "parquet": (".parquet", ("arrival", "prompt_tokens", "output_tokens"), {}),
    "mooncake": (".jsonl", ("timestamp", "input_length", "output_length"), {"hash_ids": [[1, 2]]}),
    "azure": (".csv", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), {}),
}


@fuzz_settings(ci_examples=40)
@given(layout=st.sampled_from(sorted(LAYOUTS)), rows=st.integers(1, 8), data=st.data())
def test_malformed_traces(layout: str, rows: int, data: st.DataObject) -> None:
    """A trace with one cell changed, a column dropped, duplicated or renamed, or whole garbage: the
    run goes or is refused in one line naming the file; a one-cell change is blamed on its line."""
    suffix, columns, extra = LAYOUTS[layout]
    arrivals: list[Any] = ([f"2024-01-01 00:00:{i:02d}.5" for i in range(rows)] if layout == "azure"
                           else [i * (1000 if layout == "mooncake" else 1) for i in range(rows)])
    table: dict[str, list[Any]] = {columns[0]: arrivals, columns[1]: [30] * rows, columns[2]: [3] * rows}
    table |= {name: values * rows for name, values in extra.items()}
    change = data.draw(st.sampled_from(["cell", "drop", "duplicate", "rename", "garbage"]))
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        path = folder / f"trace{suffix}"
        blamed = None
        if change == "cell":
            role = data.draw(st.sampled_from(sorted(BAD_CELLS)))
            column, row = columns[sorted(BAD_CELLS).index(role)], data.draw(st.integers(0, rows - 1))
            value = data.draw(st.sampled_from(BAD_CELLS[role]))
            if suffix == ".parquet" and (isinstance(value, str) or (isinstance(value, int) and value > 2**62)):
                value = None  # a Parquet column has one type: a word among numbers cannot be written
            table[column][row] = value
            blamed = f"row {row + 1}" if suffix == ".parquet" else f"line {row + (2 if suffix == '.csv' else 1)}"
        elif change == "drop":
            del table[data.draw(st.sampled_from(sorted(table)))]
        elif change == "rename":
            table[data.draw(st.sampled_from(ODD_NAMES))] = table.pop(data.draw(st.sampled_from(sorted(table))))
        if change == "garbage":
            path.write_bytes(data.draw(GARBAGE))
        elif change == "duplicate" and suffix == ".csv":  # a JSON record or a Parquet file holds a name once
            name = data.draw(st.sampled_from(sorted(table)))
            rows_as(layout, table | {f"{name} ": table[name]}, path)
            path.write_text(path.read_text().replace(f"{name} ,", f"{name},", 1))
        elif table:
            rows_as(layout, table, path)
        else:
            path.write_text("")
        outcome = outcome_in(folder, ["run", "--trace", str(path), "--num-requests", "3", "--quiet"])
        if outcome.code:
            assert path.name in outcome.err, outcome
            if blamed is not None and re.search(r"\b(line|row) \d+", outcome.err):
                assert re.search(rf"\b{blamed}\b", outcome.err), (table, outcome.err)


CONFIG_CASES = [(LLAMA_FILE, "1"), (LLAMA_FILE.parent / "MiniMaxAI--MiniMax-M2.5.config.json", "8")]
"""Configs mutated, each with a tensor parallel size its weights fit on an H100 at, in bf16 too (MiniMax's
per-layer q/k norm fields among what is mutated)."""


@needs_models
@fuzz_settings(ci_examples=30)
@given(case=st.sampled_from(CONFIG_CASES).flatmap(
    lambda case: mutated_json(json.loads(case[0].read_text())).map(lambda text: (text, case[1]))))
def test_malformed_model_configs(case: tuple[bytes, str]) -> None:
    text, tensor_parallel = case
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        (folder / "model.json").write_bytes(text)
        outcome = outcome_in(folder, ["batch-table", "--model", "model.json", "--batch", "1,4",
                                      "--tensor-parallel-size", tensor_parallel])
        assert outcome.code == 0 or "model.json" in outcome.err, outcome


PROFILE = load_profile("h100_sxm_vllm").path


@fuzz_settings(ci_examples=30)
@given(name=st.sampled_from(["profile.json", "roofline.json"]), data=st.data())
def test_malformed_gpu_profiles(name: str, data: st.DataObject) -> None:
    gpu_profile(name, data.draw(mutated_json(json.loads((PROFILE / name).read_text()))))


@pytest.mark.parametrize("model", [True, {"name": "tiny", "x" * 300: 1}])
def test_a_profile_model_of_the_wrong_shape_is_one_short_line(model: object) -> None:
    """The message listed every field a model has: past 300 characters."""
    gpu_profile("profile.json", json.dumps(json.loads((PROFILE / "profile.json").read_text()) | {"model": model}
                                           ).encode())


def gpu_profile(name: str, text: bytes) -> None:
    """A copy of the shipped profile with file `name` holding `text`, priced by batch-table."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        shutil.copytree(PROFILE, folder / "gpu")
        (folder / "gpu" / name).write_bytes(text)
        outcome = outcome_in(folder, ["batch-table", "--gpu", "gpu", "--cost", "measured", "--batch", "1,4"])
        assert outcome.code == 0 or name in outcome.err, outcome


@fuzz_settings(ci_examples=20)
@given(table=st.sampled_from(["gemm", "decode_attention", "prefill_attention_window", "collectives", "collectives_nccl",
                               "elementwise"]),
       data=st.data())
def test_malformed_profile_tables(table: str, data: st.DataObject) -> None:
    """One cell of a kernel table changed to null or an edge of its type, or the file garbage."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        shutil.copytree(PROFILE, folder / "gpu")
        path = folder / "gpu" / f"{table}.parquet"
        if data.draw(st.integers(0, 5)) == 0:
            path.write_bytes(data.draw(GARBAGE))
        else:
            frame = pl.read_parquet(path)
            column = data.draw(st.sampled_from(frame.columns))
            cells = frame[column].to_list()
            edges = ([None, 0, -1, 2**30, -(2**30)] if frame[column].dtype.is_integer()
                     else [None, 0.0, -1.0, math.nan, math.inf, 1e308, 1e-300] if frame[column].dtype.is_float()
                     else [None, "", "\u202e", Huge("x" * 10**5)])
            cells[data.draw(st.integers(0, len(cells) - 1))] = data.draw(st.sampled_from(edges))
            frame.with_columns(pl.Series(column, cells, dtype=frame[column].dtype)).write_parquet(path)
        outcome = outcome_in(folder, ["batch-table", "--gpu", "gpu", "--cost", "measured", "--batch", "1,4"])
        assert outcome.code == 0 or f"{table}.parquet" in outcome.err, outcome


COMPARE_ROWS = {"point": ["a", "a", "b", "b"], "group": ["g"] * 4,
                "statistic": ["ttft_mean", "tpot_mean", "ttft_mean", "tpot_mean"],
                "measured": [0.2, 0.01, 0.3, 0.02], "simulated": [0.25, 0.011, 0.2, 0.03],
                "error": [0.25, 0.1, -0.33, 0.5], "bandwidth_share": [0.4, 0.4, 1.3, 1.3]}
"""A `simulate compare --out` file, as `simulate report` reads it."""


@fuzz_settings(ci_examples=20)
@given(data=st.data())
def test_malformed_compare_files(data: st.DataObject) -> None:
    """One cell of a compare file changed to null or an edge of its type, a column retyped, or the
    file garbage: `simulate report` draws it or refuses in one line naming the file."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        path = folder / "rows.parquet"
        frame = pl.DataFrame(COMPARE_ROWS)
        choice = data.draw(st.integers(0, 5))
        if choice == 0:
            path.write_bytes(data.draw(GARBAGE))
        else:
            column = data.draw(st.sampled_from(frame.columns))
            if choice == 1:  # the column as text
                frame = frame.with_columns(pl.col(column).cast(pl.String))
            else:
                cells = frame[column].to_list()
                edges = ([None, 0.0, -1.0, math.nan, math.inf, -math.inf, 1e308, 1e-300]
                         if frame[column].dtype.is_float() else [None, "", "\u202e<script>alert(1)", Huge("x" * 10**5)])
                cells[data.draw(st.integers(0, len(cells) - 1))] = data.draw(st.sampled_from(edges))
                frame = frame.with_columns(pl.Series(column, cells, dtype=frame[column].dtype))
            frame.write_parquet(path)
        outcome = outcome_in(folder, ["report", "rows.parquet"])
        assert outcome.code == 0 or "rows.parquet" in outcome.err, outcome
        if outcome.code == 0:
            assert "<script>alert(1)" not in (folder / "rows.html").read_text()


@functools.cache
def small_run_folder() -> Path:
    """One short run's folder, written once per process and copied by each example."""
    folder = Path(tempfile.mkdtemp(prefix="servesim-fuzz-run-")) / "run"
    outcome = simulate(["--rate", "8", "--num-requests", "20", "--out", str(folder)])
    assert outcome.code == 0, outcome
    return folder


@fuzz_settings(ci_examples=20)
@given(table=st.sampled_from(["requests", "steps", "tokens"]), data=st.data())
def test_malformed_run_folder_tables(table: str, data: st.DataObject) -> None:
    """One cell of a run folder's table changed to null or an edge of its type: `simulate report`
    draws the run or refuses in one line naming the file, and writes no page when it refuses."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        run = Path(shutil.copytree(small_run_folder(), folder / "run"))
        path = run / f"{table}.parquet"
        frame = pl.read_parquet(path)
        column = data.draw(st.sampled_from([name for name, dtype in frame.schema.items()
                                            if dtype.is_numeric() or dtype == pl.Boolean]))
        dtype = frame[column].dtype
        edges: list[Any] = ([None, 0.0, -1.0, math.nan, math.inf, -math.inf, 1e308, 1e-300] if dtype.is_float()
                            else [None, True, False] if dtype == pl.Boolean else [None, 0, -1, 2**62])
        cells = frame[column].to_list()
        cells[data.draw(st.integers(0, len(cells) - 1))] = data.draw(st.sampled_from(edges))
        frame.with_columns(pl.Series(column, cells, dtype=dtype)).write_parquet(path)
        outcome = outcome_in(folder, ["report", "run"])
        assert outcome.code == 0 or f"{table}.parquet" in outcome.err, outcome
        assert (run / "report.html").exists() == (outcome.code == 0)


@fuzz_settings(ci_examples=30)
@given(part=st.sampled_from(["summary", "settings"]), data=st.data())
def test_malformed_run_summaries(part: str, data: st.DataObject) -> None:
    """A run folder's summary.json with fields of its summary or settings changed to edge values,
    dropped or added: `simulate report` draws the run or refuses in one line naming the file."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        run = Path(shutil.copytree(small_run_folder(), folder / "run"))
        path = run / "summary.json"
        record = json.loads(path.read_text())
        text = data.draw(mutated_json(record[part]))
        try:
            changed = json.loads(text)
        except (ValueError, RecursionError):
            path.write_bytes(text)
        else:
            path.write_text(json.dumps(record | {part: changed}))
        outcome = outcome_in(folder, ["report", "run"])
        assert outcome.code == 0 or "summary.json" in outcome.err, outcome
        assert (run / "report.html").exists() == (outcome.code == 0)


@functools.cache
def small_sweep_file() -> Path:
    """One short sweep's file (two rates, one with SLO counts), written once per process."""
    path = Path(tempfile.mkdtemp(prefix="servesim-fuzz-sweep-")) / "sweep.parquet"
    outcome = simulate(["sweep", "--rate", "2,4,40", "--num-requests", "30", "--goodput", "ttft:300",
                        "--out", str(path)])
    assert outcome.code == 0, outcome
    return path


@fuzz_settings(ci_examples=30)
@given(data=st.data())
def test_malformed_sweep_result_files(data: st.DataObject) -> None:
    """One cell of a sweep's file changed to null or an edge of its type, a column retyped or dropped,
    or the file garbage: `simulate report` draws it or refuses in one line naming the file."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        path = folder / "sweep.parquet"
        frame = pl.read_parquet(small_sweep_file())
        choice = data.draw(st.integers(0, 6))
        column = data.draw(st.sampled_from(frame.columns))
        dtype = frame[column].dtype
        if choice == 0:
            path.write_bytes(data.draw(GARBAGE))
        else:
            if choice == 1:  # the column as text
                frame = frame.with_columns(pl.col(column).cast(pl.String))
            elif choice == 2:
                frame = frame.drop(column)
            elif choice == 3:  # the column as integers
                frame = frame.with_columns(pl.Series(column, list(range(frame.height))))
            else:
                cells = frame[column].to_list()
                edges: list[Any] = ([None, 0.0, -1.0, math.nan, math.inf, -math.inf, 1e308, 1e-300]
                                    if dtype.is_float() else [None, True, False] if dtype == pl.Boolean
                                    else [None, 0, -1, 2**62] if dtype.is_integer()
                                    else [None, "", "\u202e<script>alert(1)", Huge("x" * 10**5)])
                cells[data.draw(st.integers(0, len(cells) - 1))] = data.draw(st.sampled_from(edges))
                frame = frame.with_columns(pl.Series(column, cells, dtype=dtype))
            frame.write_parquet(path)
        outcome = outcome_in(folder, ["report", "sweep.parquet"])
        assert outcome.code == 0 or "sweep.parquet" in outcome.err, outcome
        if outcome.code == 0:
            assert "<script>alert(1)" not in (folder / "sweep.html").read_text()


KEPT_PROBE = {"key": "0" * 64, "rate": 4.0, "met": True, "overloaded": False, "values": {"p99_ttft": 0.2},
              "output_throughput": 900.0, "request_throughput": 3.9, "mean_e2el": 2.5}
"""A line of a plan folder's kept probes (`simulator.plan.resume`)."""


@fuzz_settings(ci_examples=60)
@given(text=mutated_json(KEPT_PROBE))
def test_malformed_kept_probes(text: bytes) -> None:
    """A kept probe's line changed at random is read as a probe a plan could have measured, or not
    at all (that probe is simulated again); it never raises."""
    from simulator.plan.resume import parse_probe

    parsed = parse_probe(text.decode(errors="replace"))
    if parsed is not None:
        probe = parsed[1]
        assert math.isfinite(probe.rate) and probe.rate > 0
        assert all(not x < 0 and not math.isinf(x)
                   for x in (probe.output_throughput, probe.request_throughput, probe.mean_e2el))
        assert all(not v < 0 for v in probe.values.values())


VLLM = {"model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 4, "request_rate": "inf", "burstiness": 1.0,
        "max_concurrency": 2, "completed": 4, "total_input_tokens": 400, "total_output_tokens": 40,
        "request_throughput": 4.0, "output_throughput": 40.0, "mean_ttft_ms": 20.0, "mean_tpot_ms": 9.0}


@fuzz_settings(ci_examples=25)
@given(text=mutated_json(VLLM))
@example(text=json.dumps(VLLM | {"mean_tpot_ms": 1e-300}).encode())  # a 300-digit error
@example(text=json.dumps(VLLM | {"request_throughput": 1e-300}).encode())  # the same
@example(text=json.dumps(VLLM | {"mean_tpot_ms": 0}).encode())  # printed '+nan%'
@example(text=json.dumps(VLLM | {"model_id": "no/such-model-" + "x" * 200}).encode())  # a list past 300 characters
def test_malformed_vllm_results(text: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        (folder / "result.json").write_bytes(text)
        outcome = outcome_in(folder, ["compare", "result.json", "--gpu", "h100_sxm"])
        assert outcome.code == 0 or "result.json" in outcome.err, outcome


QUOTED = ("id", "backend", "system", "model_path", "precision", "gemm_quant_mode", "moe_quant_mode")
"""Cells a row's skip reason quotes (a backend 'nan' is the file's word, not a computed nan)."""


@fuzz_settings(ci_examples=25)
@given(field=st.sampled_from(sorted(SILICON_ROW)), value=st.sampled_from([str(v) for v in JSON_EDGES]),
       row=st.integers(0, 2))
def test_malformed_silicon_rows(field: str, value: str, row: int) -> None:
    """One field of one of three rows changed: refused naming that row's line, or run."""
    rows = [dict(SILICON_ROW, isl="64", osl="4", concurrency="2", model_path="meta-llama/Llama-3.1-8B",
                 tp_size="1") for _ in range(3)]
    rows[row][field] = value
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        (folder / "points.csv").write_text("\n".join([",".join(SILICON_ROW), *(",".join(r.values()) for r in rows)]))
        outcome = outcome_in(folder, ["compare", "points.csv"], echoes=(value,) if field in QUOTED else ())
        if outcome.code and re.search(r"points\.csv line \d+", outcome.err):
            assert f"points.csv line {row + 2}" in outcome.err, outcome


@fuzz_settings(ci_examples=25)
@given(data=st.data(), suffix=st.sampled_from([".yaml", ".toml"]))
def test_malformed_sweep_files(data: st.DataObject, suffix: str) -> None:
    """Axes and fixed settings of edge values (YAML, TOML), or a file of garbage."""
    names = ["rate", "policy", "num_requests", "input_len", "gpu_memory_utilization", "seed", "duration",
             "percentiles", "unknown-setting", "max_num_seqs", "router"]
    values = st.sampled_from([v for v in JSON_EDGES if not isinstance(v, float) or math.isfinite(v)])
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        path = folder / f"sweep{suffix}"
        if data.draw(st.integers(0, 5)) == 0:
            path.write_bytes(data.draw(GARBAGE))
        else:
            axis = data.draw(st.sampled_from(names))
            axis_values = data.draw(st.lists(values, min_size=0, max_size=2))
            fixed = {"num_requests": 3, "input_len": 40, "output_len": 4}
            fixed[data.draw(st.sampled_from(names))] = data.draw(values)
            path.write_text(sweep_text(suffix, {axis: axis_values}, fixed))
        outcome_in(folder, ["sweep", "--file", str(path), "--jobs", "1", "--out", "s.parquet"])


def sweep_text(suffix: str, axes: dict[str, list[Any]], fixed: dict[str, Any]) -> str:
    if suffix == ".yaml":
        return json.dumps({"axes": axes, "fixed": fixed})  # JSON is YAML
    def toml(value: Any) -> str:
        return json.dumps(value) if not isinstance(value, dict) else "{}"
    lines = ["[axes]", *(f"{k} = {toml(v)}" for k, v in axes.items()),
             "[fixed]", *(f"{k} = {toml(v)}" for k, v in fixed.items() if v is not None)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [b"\xff\xfe\x00garbage\x80", ("[" * 10**5).encode()])
def test_a_sweep_file_not_utf8_or_nested_past_recursion_is_one_line(text: bytes) -> None:
    """Both were tracebacks (UnicodeDecodeError, RecursionError from the YAML reader)."""
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        (folder / "sweep.yaml").write_bytes(text)
        outcome = outcome_in(folder, ["sweep", "--file", "sweep.yaml", "--jobs", "1", "--out", "s.parquet"])
        assert outcome.code == 2 and "sweep.yaml" in outcome.err, outcome


AIPERF_EXPORT = json.loads((Path(__file__).resolve().parent / "data" / "aiperf" / "profile_export_aiperf.json")
                           .read_text())
AIPERF_SMALL = AIPERF_EXPORT | {
    "request_count": {"unit": "requests", "avg": 4.0},
    "input_sequence_length": AIPERF_EXPORT["input_sequence_length"] | {"avg": 64.0},
    "output_sequence_length": AIPERF_EXPORT["output_sequence_length"] | {"avg": 4.0},
    "input_config": AIPERF_EXPORT["input_config"] | {"loadgen": {"concurrency": 2, "warmup_request_count": 2}}}
"""aiperf's JSON export (tests/data/aiperf) cut to a rerun of a fraction of a second."""


@fuzz_settings(ci_examples=25)
@given(text=mutated_json(AIPERF_SMALL), section=st.sampled_from(["", "loadgen", "endpoint", "time_to_first_token"]))
def test_malformed_aiperf_exports(text: bytes, section: str) -> None:
    """A few fields of the export, or of one of its sections, changed: refused naming the file, or run."""
    if section:
        try:
            inner = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            inner = None
        settings = dict(AIPERF_SMALL["input_config"])
        if section == "time_to_first_token":
            text = json.dumps(AIPERF_SMALL | {section: inner}).encode()
        else:
            text = json.dumps(AIPERF_SMALL | {"input_config": settings | {section: inner}}).encode()
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        (folder / "profile_export_aiperf.json").write_bytes(text)
        outcome = outcome_in(folder, ["compare", "profile_export_aiperf.json", "--gpu", "h100_sxm"])
        assert outcome.code == 0 or "profile_export_aiperf.json" in outcome.err, outcome


UPSTREAM_ROW = {"id": "u1", "silicon_data_source": "silicon_concurrency=2", "backend": "vllm", "backend_version": "",
                "model_path": "meta-llama/Llama-3.1-8B", "system": "h100_sxm", "precision": "", "mode": "agg",
                "isl": "64", "osl": "4", "gemm_quant_mode": "", "moe_quant_mode": "", "batch_size": "2", "tp_size": "1",
                "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "", "moe_ep_size": "",
                "prefill_num_workers": "1", "prefill_tp_size": "1", "decode_num_workers": "1", "decode_tp_size": "1",
                "decode_batch_size": "2", "silicon_ttft_ms": "20", "silicon_tpot_ms": "5"}


@fuzz_settings(ci_examples=25)
@given(field=st.sampled_from(sorted(UPSTREAM_ROW)), value=st.sampled_from([str(v) for v in JSON_EDGES]),
       row=st.integers(0, 2), mode=st.sampled_from(["agg", "disagg"]))
def test_malformed_upstream_silicon_rows(field: str, value: str, row: int, mode: str) -> None:
    """One field of one of three rows of aiconfigurator's upstream layout changed: refused naming that
    row's line, skipped with a reason, or run."""
    rows = [dict(UPSTREAM_ROW, mode=mode) for _ in range(3)]
    rows[row][field] = value
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        (folder / "points.csv").write_text("\n".join([",".join(UPSTREAM_ROW),
                                                      *(",".join(r.values()) for r in rows)]))
        outcome = outcome_in(folder, ["compare", "points.csv"], echoes=(value,) if field in QUOTED else ())
        if outcome.code and re.search(r"points\.csv line \d+", outcome.err):
            assert f"points.csv line {row + 2}" in outcome.err, outcome
