"""Every file servesim reads, read as untrusted input: a model's config.json, measured results and GPU
profiles (traces: test_trace_lines.py). Each bad field is refused in one line that names the file,
the field (and the 1-based line or row a person would see in an editor) and at most ~80 characters
of the value."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from simulator.deploy.hardware import load_gpu, load_profile
from simulator.deploy.model import LLAMA_3_1_8B, load_model
from simulator.errors import InputError
from simulator.sim2real.measured import MeasuredPoint, read_measured
from workloads import read_trace


def read_points(path: Path) -> list[MeasuredPoint]:
    """A results file read strictly: a row servesim cannot express is refused like a malformed one."""
    return read_measured(path, strict=True).points

MODELS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "models"
LLAMA_FILE = MODELS / "meta-llama--Meta-Llama-3.1-8B.config.json"
needs_models = pytest.mark.skipif(not MODELS.exists(), reason=f"reference model configs missing: {MODELS}")


def refused(*fragments: str) -> pytest.RaisesContext[InputError]:
    """Expect an InputError whose one-line message holds every fragment."""
    wanted = "".join(f"(?=.*{re.escape(fragment)})" for fragment in fragments)
    return pytest.raises(InputError, match=rf"(?s)\A{wanted}[^\n]*\Z")


# ---------------------------------------------------------------- model config.json


@needs_models
def test_a_config_under_any_name_is_the_model(tmp_path: Path) -> None:
    """A byte-for-byte copy of the shipped Llama-3.1-8B config saved as llama8b.json is Llama-3.1-8B
    (it was read as its own hf_quant_config.json and refused as "quant_algo null")."""
    copy = tmp_path / "llama8b.json"
    copy.write_bytes(LLAMA_FILE.read_bytes())
    spec = load_model(str(copy))
    assert replace(spec, name=LLAMA_3_1_8B.name) == LLAMA_3_1_8B and spec.weight_dtype is None
    assert spec.name == "llama8b"


@needs_models
def test_a_config_under_any_name_gets_its_own_problem(tmp_path: Path) -> None:
    data = json.loads(LLAMA_FILE.read_text()) | {"num_key_value_heads": 7}
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with refused("32 heads do not divide into 7 KV heads"):
        load_model(str(path))


@needs_models
def test_a_quantization_file_beside_a_config_json_is_its_own_only(tmp_path: Path) -> None:
    """hf_quant_config.json is read beside config.json (and NAME.hf_quant_config.json beside
    NAME.config.json), never beside a config saved under another name."""
    quant = (MODELS / "nvidia--Llama-3.1-70B-Instruct-FP8.hf_quant_config.json").read_bytes()
    (tmp_path / "hf_quant_config.json").write_bytes(quant)
    (tmp_path / "config.json").write_bytes(LLAMA_FILE.read_bytes())
    (tmp_path / "other.json").write_bytes(LLAMA_FILE.read_bytes())
    assert load_model(str(tmp_path)).weight_dtype == "fp8"
    assert load_model(str(tmp_path / "other.json")).weight_dtype is None
    with refused("hf_quant_config.json", "is modelopt's hf_quant_config.json, not a model's config.json"):
        load_model(str(tmp_path / "hf_quant_config.json"))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_hidden_layers", 10**30, "num_hidden_layers 1000000000000000000000000000000 is past 16384"),
    ("vocab_size", 2**63, "vocab_size 9223372036854775808 is past 16777216"),
    ("hidden_size", float("nan"), "hidden_size must be a positive integer, got NaN"),
    ("head_dim", float("inf"), "head_dim must be a positive integer, got Infinity"),
    ("torch_dtype", "x" * 10_000, "torch_dtype 'xxxxxxx"),
    ("hidden_act", "\u00e9" * 500, "hidden_act '\u00e9\u00e9\u00e9"),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [64, 64]},
     "weight_block_size [64, 64]: servesim prices fp8 blocks of 128 x 128 only"),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": "128"}, 'weight_block_size "128"'),
])
def test_config_values_are_range_checked_and_quoted_short(field: str, value: object, message: str,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    data = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    path.write_text(json.dumps(data | {field: value}))
    with pytest.raises(InputError) as error:
        load_model(str(path))
    assert message in str(error.value) and str(path) in str(error.value)
    assert len(str(error.value)) < 80 + 200 and "\n" not in str(error.value)


def test_deeply_nested_json_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with refused("config.json", "is not valid JSON"):
        load_model(str(path))


# ---------------------------------------------------------------- measured results (simulate compare, fit)

SILICON_ROW = {"id": "r1", "backend": "vllm", "backend_version": "0.12.0", "model_path": "Qwen/Qwen3-32B",
               "system": "h100_sxm", "precision": "", "gemm_quant_mode": "", "isl": "1024", "osl": "16",
               "concurrency": "4", "tp_size": "2", "silicon_ttft_ms": "150", "silicon_tpot_ms": "15"}


def silicon_csv(path: Path, *rows: dict[str, str], header: list[str] | None = None) -> Path:
    header = header or list(SILICON_ROW)
    path.write_text("\n".join([",".join(header), *(",".join(row[c] for c in header) for row in rows)]) + "\n")
    return path


def test_trace_and_compare_name_the_same_line(tmp_path: Path) -> None:
    """A bad cell on line 4 of a CSV (its third record) is line 4 to both readers."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival,prompt_tokens,output_tokens\n0,1,1\n1,1,1\n2,-1,1\n")
    with refused("trace.csv", "line 4"):
        read_trace(trace)
    points = silicon_csv(tmp_path / "points.csv", SILICON_ROW, SILICON_ROW, SILICON_ROW | {"isl": "-1"})
    with refused("points.csv line 4", "isl", "'-1'"):
        read_points(points)


@pytest.mark.parametrize(("field", "value", "named"), [
    ("isl", "\u00b2", "isl must be an integer in [1, 2147483648], got '\u00b2'"),  # a digit to str.isdigit
    ("concurrency", "1000000000", "concurrency must be an integer in [1, 100000], got '1000000000'"),
    ("tp_size", "9" * 400, "tp_size must be an integer in [1, 1024], got '9999"),
    ("silicon_ttft_ms", "1e400", "silicon_ttft_ms must be a number in [0.001, 8.64e+07], got '1e400'"),
    ("silicon_tpot_ms", "-0.0", "got '-0.0'"),
    ("model_path", "\u00e9" * 1000, "model '\u00e9\u00e9"),
])
def test_silicon_fields_are_range_checked(field: str, value: str, named: str, tmp_path: Path) -> None:
    path = silicon_csv(tmp_path / "points.csv", SILICON_ROW | {field: value})
    with pytest.raises(InputError) as error:
        read_points(path)
    assert "points.csv line 2" in str(error.value) and named in str(error.value)
    assert value[:81] not in str(error.value) or len(value) <= 80  # at most 80 characters of it quoted
    assert "\n" not in str(error.value)


def test_silicon_rows_that_do_not_fit_the_header_name_their_line(tmp_path: Path) -> None:
    path = silicon_csv(tmp_path / "points.csv", SILICON_ROW, SILICON_ROW | {"id": '"two\nlines"'}, SILICON_ROW)
    with path.open("a") as file:
        file.write("r9,vllm\n")
    with refused("points.csv line 6: 2 fields where the header has 13"):
        read_points(path)
    doubled = silicon_csv(tmp_path / "doubled.csv", SILICON_ROW | {"isl": "5"}, header=[*SILICON_ROW, "isl"])
    with refused("doubled.csv line 1: column(s) isl given twice"):
        read_points(doubled)
    huge = silicon_csv(tmp_path / "huge.csv", SILICON_ROW, SILICON_ROW | {"id": "x" * 200_000})
    with refused("huge.csv line 3", "field larger than field limit"):
        read_points(huge)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(silicon_csv(tmp_path / "ok.csv", SILICON_ROW).read_bytes() + b"\xff\n")
    with refused("binary.csv line 3: not UTF-8 text"):
        read_points(binary)


def vllm_result(**changes: Any) -> dict[str, Any]:
    n = 20
    return {"model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": n, "request_rate": "inf",
            "burstiness": 1.0, "max_concurrency": 4, "completed": n, "total_input_tokens": 1000 * n,
            "total_output_tokens": 100 * n, "request_throughput": 4.0, "output_throughput": 400.0,
            "mean_ttft_ms": 60.0, "mean_tpot_ms": 9.0} | changes


@pytest.mark.parametrize(("changes", "named"), [
    ({"num_prompts": 10**12}, "num_prompts must be an integer in [1, 1000000], got 1000000000000"),
    ({"completed": 21}, "completed must be an integer in [1, 20], got 21"),
    ({"max_concurrency": 2**63}, "max_concurrency must be an integer in [1, 100000]"),
    ({"mean_ttft_ms": math.nan}, "mean_ttft_ms must be 0 or a number of ms in [0.001, 8.64e+07], got nan"),
    ({"mean_tpot_ms": 1e308}, "mean_tpot_ms must be 0 or a number of ms in [0.001, 8.64e+07], got 1e+308"),
    ({"burstiness": 1e-300}, "burstiness must be a number in [0.001, 1000], got 1e-300"),
    ({"request_rate": "x" * 1000}, "request_rate must be a number, got 'xxxx"),
    ({"model_id": ["a"] * 1000}, "model_id must be a string, got ['a', 'a'"),
    ({"input_lens": [1000] * 19 + [2**40], "output_lens": [100] * 20, "ttfts": [], "itls": []},
     "input_lens must be an integer in [1, 2147483648], got 1099511627776"),
    ({"input_lens": [1000] * 20, "output_lens": [0] * 20, "ttfts": [], "itls": []},
     "output_lens are all 0, yet 20 requests completed"),
])
def test_vllm_result_fields_are_range_checked(changes: dict[str, Any], named: str, tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(vllm_result(**changes)))
    with pytest.raises(InputError) as error:
        read_points(path)
    assert "result.json" in str(error.value) and named in str(error.value)
    assert len(str(error.value)) < 300 and "\n" not in str(error.value)


def test_a_vllm_result_nested_past_recursion_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with refused("result.json", "cannot read"):
        read_points(path)


# ---------------------------------------------------------------- GPU profile folders


def profile_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "gpu"
    shutil.copytree(load_profile("h100_sxm_vllm").path, folder)
    return folder


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.mark.parametrize(("changes", "named"), [
    ({"mem_bw": math.inf}, "mem_bw must be a number in [1e+06, 1e+15], got inf"),
    ({"gemm_flops": 1e-300}, "gemm_flops must be a number in [1e+06, 1e+18], got 1e-300"),  # overflowed
    ({"memory_bytes": 2**63}, "memory_bytes must be a number in [1.04858e+06, 1.1259e+15], got 9223372036854775808"),
    ({"kernel_latency": "fast"}, "kernel_latency must be a number in (0, 1], got 'fast'"),
    ({"step_overhead": -1e-6}, "step_overhead must be a number in [0, 1], got -1e-06"),
    ({"name": ["h100"]}, "name must be a string, got ['h100']"),
])
def test_roofline_values_are_range_checked(changes: dict[str, object], named: str, tmp_path: Path) -> None:
    folder = profile_copy(tmp_path)
    edit_json(folder / "roofline.json", **changes)
    with refused(named, str(folder / "roofline.json")):
        load_gpu(str(folder))


@pytest.mark.parametrize(("changes", "named"), [
    ({"dtype": "int4"}, "dtype 'int4' is not one of"),
    ({"families": "all"}, 'families must be a JSON dict, got "all"'),
    ({"datasheet_flops": math.nan}, "datasheet_flops must be a number in [1e+06, 1e+18], got nan"),
    ({"model": {"name": "tiny"}}, "model ModelSpec.__init__() missing"),
    ({"model": {"name": "tiny", "layers": 2}}, 'model must be an object of'),
    ({"host_overhead_fit": {"values": {}}}, "host_overhead_fit must hold values of step_overhead"),
])
def test_profile_json_fields_are_checked(changes: dict[str, object], named: str, tmp_path: Path) -> None:
    """A model missing a field was a TypeError traceback in `simulate validate`; a fit without its
    values a KeyError in `simulate compare`."""
    folder = profile_copy(tmp_path)
    edit_json(folder / "profile.json", **changes)
    with refused(named, str(folder / "profile.json")):
        load_profile(str(folder))


@pytest.mark.parametrize(("table", "column", "values", "named"), [
    ("gemm", "latency", {2: math.nan}, "row 3 has latency nan; expected seconds in [1e-09, 3600]"),
    ("gemm", "latency", {2: 5e-324}, "row 3 has latency 5e-324; expected seconds in [1e-09, 3600]"),
    ("gemm", "latency", {0: -1.0}, "row 1 has latency -1.0"),
    ("decode_attention", "context", {4: -5}, "row 5 has context -5; expected integers in [0, 2**50]"),
    ("collectives", "op", {1: None}, "row 2 has op None; expected text"),
])
def test_profile_tables_name_the_bad_row(table: str, column: str, values: dict[int, object], named: str,
                                         tmp_path: Path) -> None:
    folder = profile_copy(tmp_path)
    frame = pl.read_parquet(folder / f"{table}.parquet")
    cells = frame[column].to_list()
    for row, value in values.items():
        cells[row] = value
    frame.with_columns(pl.Series(column, cells, dtype=frame[column].dtype)).write_parquet(folder / f"{table}.parquet")
    with refused(f"{table}.parquet", named):
        load_profile(str(folder))


def test_a_profile_column_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    folder = profile_copy(tmp_path)
    frame = pl.read_parquet(folder / "gemm.parquet")
    frame.with_columns(pl.col("m").cast(pl.Float64)).write_parquet(folder / "gemm.parquet")
    with refused("gemm.parquet", "column m has type Float64; expected integers"):
        load_profile(str(folder))


@pytest.mark.parametrize("name", ["x" * 5000, "a\x00b"])
def test_a_gpu_name_no_path_can_hold_is_one_line(name: str) -> None:
    with refused("unknown GPU"):
        load_gpu(name)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_config_that_is_a_pipe_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Reading a FIFO blocks until someone writes to it: the run hung."""
    os.mkfifo(tmp_path / "config.json")
    script = "import sys; from simulator.cli.main import run; run(['batch-table', '--model', sys.argv[1]])"
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "config.json")], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "is not a file of JSON settings" in done.stderr
