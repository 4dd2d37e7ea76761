"""The calibration script end to end on the CPU: measure the tiny model, load the profile, validate.

The round trip is the check: the profile's own whole forward passes (timed as whole passes, never
fed to the tables) against the sum of its per-operator measurements. Its bounds catch a round trip
that is broken (an operator missing or timed in the wrong unit), not a noisy machine. On a shared,
loaded machine the timings of one calibration can be off together (load comes in bursts longer than
a timing, so more trials or the minimum of them do not help: the spread is between calibrations),
so the check calibrates again, up to `ATTEMPTS` times, until one calibration is within the bounds:
a broken round trip misses them every time.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from calibration.measure import calibrate
from calibration.validate import validation_errors
from simulator.cli.main import run
from simulator.config import RunConfig
from simulator.cost import MeasuredCost, StepShape, build_cost_model
from simulator.deploy.hardware import TABLE_COLUMNS, load_gpu, load_profile
from simulator.deploy.model import TINY
from simulator.run.simulate import simulate

ATTEMPTS = 5
MEDIAN_BOUND, MAX_BOUND = 0.30, 1.0
"""Of |predicted - measured| / measured over the calibration's whole passes."""


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The tiny model calibrated on the CPU, and the CPU seconds that took (this process's, which
    other processes' load does not add to, as it does to the wall clock's)."""
    out = tmp_path_factory.mktemp("calibrated") / "cpu_tiny"
    began = time.process_time()
    calibrate("tiny", out, "cpu", echo=lambda line: None)
    return out, time.process_time() - began


def test_calibration_writes_a_profile_in_the_documented_format(profile: tuple[Path, float]) -> None:
    out, cpu_seconds = profile
    assert cpu_seconds < 60
    loaded = load_profile(str(out))
    for family, columns in TABLE_COLUMNS.items():
        assert tuple(loaded.tables[family].columns) == columns
    assert loaded.tables["gemm"].height == 4 * 10  # qkv, attn_out, gate_up (= lm_head's shape), down
    assert loaded.meta["model"]["name"] == "tiny" and loaded.meta["libraries"]["torch"]
    assert loaded.validation is not None and set(loaded.validation["kind"]) == {"prefill", "decode"}
    assert loaded.step_overhead >= 0


def round_trip(folder: Path) -> tuple[int, float, float]:
    """A profile's whole passes against its operators: how many, the median and the max |error|."""
    errors = validation_errors(str(folder))["error"].abs()
    return errors.len(), float(errors.median()), float(errors.max())  # type: ignore[arg-type]


def test_round_trip_validation_within_stated_error(profile: tuple[Path, float], tmp_path: Path) -> None:
    attempts = [round_trip(profile[0])]
    while not (attempts[-1][1] < MEDIAN_BOUND and attempts[-1][2] < MAX_BOUND) and len(attempts) < ATTEMPTS:
        again = tmp_path / f"cpu_tiny_{len(attempts)}"
        calibrate("tiny", again, "cpu", echo=lambda line: None)
        attempts.append(round_trip(again))
    passes, median, largest = attempts[-1]
    assert passes == 7
    assert median < MEDIAN_BOUND and largest < MAX_BOUND, f"every calibration missed: (passes, median, max) {attempts}"


def test_the_simulator_runs_on_a_calibrated_profile(profile: tuple[Path, float]) -> None:
    config = RunConfig(model="tiny", gpu=str(profile[0]), cost="measured", rate=50.0, num_requests=30,
                       input_len=200, output_len=20, max_num_seqs=64, max_num_batched_tokens=512)
    cost = build_cost_model(config, TINY, load_gpu(config.gpu))
    assert isinstance(cost, MeasuredCost)
    decode = cost.step_time(StepShape.from_rows([(1, 220)]))
    result = simulate(config)
    assert len(result.requests) == 30 and not np.isnan(result.requests.finish).any()
    assert result.end_time > 20 * decode  # each request's 20 tokens took a step each, none cheaper than this


def test_validate_command_prints_both_tables(profile: tuple[Path, float], capsys: pytest.CaptureFixture[str]) -> None:
    codes: list[int] = []
    run(["validate", "--gpu", str(profile[0])], exit=codes.append)
    out = capsys.readouterr().out
    assert codes == [0] and "median |error|" in out and "no chapter table" in out
    run(["validate", "--gpu", "h100_sxm"], exit=codes.append)
    out = capsys.readouterr().out
    assert codes[-1] == 0 and "decode batch 128" in out and "prefill 2000 tokens" in out


@pytest.mark.parametrize("device", ["tpu", "cuda0", "cuda:x", "cudax" * 100])
def test_calibrate_rejects_a_bad_device(device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    codes: list[int] = []
    run(["calibrate", "--model", "tiny", "--device", device, "--out", str(tmp_path / "x")], exit=codes.append)
    err = capsys.readouterr().err
    assert codes == [2] and err.startswith("error: --device must be cpu or cuda[:N], got ")
    assert err.count("\n") == 1 and len(err) <= 301  # one line, the value cut as every message cuts it
    assert not (tmp_path / "x").exists()
