"""Measured serving results read as points to rerun, whichever tool wrote them.

Read: aiconfigurator's silicon CSV (its upstream layout and the renamed one, `silicon`), `vllm bench
serve --save-result` JSON with or without per-request detail (`vllm_json`), and aiperf's
`profile_export_aiperf.json`/`.csv` (`aiperf`). Everything read is untrusted: a malformed value is
refused with one line naming it; a row servesim cannot express is skipped with its reason
(`Reading.skipped`), and `strict` makes the first such skip the error.
"""

from __future__ import annotations

from pathlib import Path

from simulator.deploy.resolve import ModelResolver
from simulator.errors import InputError
from simulator.sim2real.aiperf import is_aiperf_json, read_aiperf_csv, read_aiperf_json
from simulator.sim2real.points import MeasuredPoint, PoolShape, Reading, read_json_object, read_text
from simulator.sim2real.silicon import read_silicon_csv
from simulator.sim2real.vllm_json import VLLM_REQUIRED, read_vllm_result

__all__ = ["MeasuredPoint", "PoolShape", "Reading", "read_measured", "read_points"]


def read_measured(path: Path, model: str | None = None, resolver: ModelResolver | None = None,
                  strict: bool = False) -> Reading:
    """The points of one measured-results file and the rows skipped; a one-point file (vLLM, aiperf)
    has `model` (a servesim model) if given, else its own resolved. `strict`: a skip is an error."""
    if not path.is_file():
        raise InputError(f"no such result file {str(path)!r}")
    resolver = ModelResolver() if resolver is None else resolver
    suffix = path.suffix.lower()
    if suffix == ".csv":
        text = read_text(path)
        first = text.lstrip("\ufeff").split(",", 1)[0].strip()
        reading = (read_aiperf_csv(path, text, resolver, model) if first == "Metric"
                   else read_silicon_csv(path, resolver))
    elif suffix == ".json":
        data = read_json_object(path)
        if "model_id" in data:
            reading = read_vllm_result(path, data, resolver, model)
        elif is_aiperf_json(data):
            reading = read_aiperf_json(path, data, resolver, model)
        else:
            lacking = ", ".join(key for key in VLLM_REQUIRED if key not in data)
            raise InputError(f"{path.name} is neither a vllm bench serve result (it lacks {lacking}) nor an aiperf "
                             "export (it lacks input_config)")
    else:
        raise InputError(f"{str(path)!r} is neither a measured-points CSV nor a vllm bench serve or aiperf JSON")
    if strict and reading.skipped:
        where, reason = reading.skipped[0]
        raise InputError(f"{where}: cannot be rerun (--strict): {reason}")
    return reading


def read_points(path: Path, model: str | None = None) -> list[MeasuredPoint]:
    """The points of one file that servesim can rerun (the skipped rows dropped)."""
    return read_measured(path, model).points
