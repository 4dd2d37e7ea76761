"""`simulate plan`'s options fuzzed as test_fuzz.py fuzzes the other verbs' (fuzz_surface): each call
exits 0 with sane output or non-zero with one line starting 'error:', never a traceback, a warning or
a half-written folder. The space is pinned small (one server shape, the tiny model) so an example is quick."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fuzz_surface import Huge, check, command_lines, fuzz_settings, in_folder, leftovers, simulate
from hypothesis import example, given

SMALL = ["--model", "tiny", "--input-len", "40", "--output-len", "4", "--policy", "chunked", "--max-num-seqs", "8",
         "--max-num-batched-tokens", "64", "--quantization", "none", "--max-gpus", "1", "--jobs", "1",
         "--slo", "p99_ttft_ms<=50"]
HELD = frozenset({"--jobs"})
"""Worker processes would make each example seconds long."""


@fuzz_settings(ci_examples=20)
@given(drawn=command_lines("plan", HELD, at_most=3))
@example(drawn=["--policy", Huge("x" * 10**5)])
@example(drawn=["--gpu-hourly-cost", "tiny=nan"])
@example(drawn=["--margin", "auto"])
@example(drawn=["--max-num-batched-tokens", "1"])  # every server refused: nothing to write a plan of
def test_plan_options(drawn: list[str]) -> None:
    with tempfile.TemporaryDirectory() as scratch, in_folder(Path(scratch)) as folder:
        outcome = simulate(["plan", *SMALL, "--out", "plan", *drawn])
        check(outcome)
        assert not leftovers(folder)
        if outcome.code != 0:
            assert not (folder / "plan" / "plan.parquet").exists()
