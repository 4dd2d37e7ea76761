"""The house rules as tests: ruff and mypy clean, so `pytest` alone is the whole check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_clean() -> None:
    packages = ["simulator", "policies", "workloads", "calibration", "benchmarks"]
    done = subprocess.run([sys.executable, "-m", "mypy", *packages],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
