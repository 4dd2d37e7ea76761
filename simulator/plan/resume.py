"""An interrupted plan resumed: every probe's verdict is kept in the plan folder (`PROBES`, one JSON
line per probe, a file per process), and a plan rerun into the same folder reads them back instead of
simulating again. A probe is deterministic given its settings, SLOs, rate, request count and seeds,
so the rerun finds the same capacities. The files are untrusted: a line that is not a well-formed
probe, or whose numbers no probe measures, is ignored, and so is a kept probe at another rate than
the one its key was asked for (that probe is simulated again)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.plan.capacity import Probe
from simulator.plan.slo import Slos

PROBES = ".probes"
NUMBERS = ("rate", "output_throughput", "request_throughput", "mean_e2el")


def probe_key(settings: dict[str, Any], slos: Slos, rate: float, num_requests: int, seeds: int) -> str:
    from simulator.outputs.run_folder import json_safe

    what = [json_safe(settings), slos.sla_params(), slos.attainment, [list(g) for g in slos.goodput], rate.hex(),
            num_requests, seeds]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def parse_probe(line: str) -> tuple[str, Probe] | None:
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        return None
    numbers = [data.get(name) for name in NUMBERS]
    values = data.get("values")
    flags = [data.get("met"), data.get("overloaded")]
    if (not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)
            or not all(isinstance(x, bool) for x in flags) or not isinstance(values, dict)
            or not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                       for k, v in values.items())):
        return None
    rate, output, request, e2el = (float(x) for x in numbers)  # type: ignore[arg-type]
    # A probe's rate is a positive number; its throughputs, E2EL and SLO values are at least 0 or NaN
    # (a probe stopped early measured none), an SLO's value +inf where nothing finished.
    if not (math.isfinite(rate) and rate > 0) or any(x < 0 or math.isinf(x) for x in (output, request, e2el)) or any(
            v < 0 for v in values.values()):
        return None
    met, overloaded = bool(flags[0]), bool(flags[1])
    return data["key"], Probe(rate, met, overloaded, {k: float(v) for k, v in values.items()}, output, request, e2el)


def known_probes(folder: str) -> dict[str, Probe]:
    """The probes kept in `folder`."""
    found: dict[str, Probe] = {}
    for path in sorted((Path(folder) / PROBES).glob("*.jsonl")):
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            parsed = parse_probe(line)
            if parsed is not None:
                found[parsed[0]] = parsed[1]
    return found


@dataclass(frozen=True)
class ProbeStore:
    """Where a plan keeps its probes, and those it found there when it started."""

    folder: str
    kept: dict[str, Probe]

    @classmethod
    def open(cls, folder: str) -> ProbeStore:
        return cls(folder, known_probes(folder))

    def key(self, settings: dict[str, Any], slos: Slos, rate: float, num_requests: int, seeds: int) -> str:
        return probe_key(settings, slos, rate, num_requests, seeds)

    def keep(self, key: str, probe: Probe) -> None:
        """Append `probe` to this process's file (one writer per file; a torn last line is ignored
        on reading)."""
        record = {"key": key, "rate": probe.rate, "met": probe.met, "overloaded": probe.overloaded,
                  "values": probe.values, "output_throughput": probe.output_throughput,
                  "request_throughput": probe.request_throughput, "mean_e2el": probe.mean_e2el}
        path = Path(self.folder) / PROBES / f"{os.getpid()}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as file:
            file.write(json.dumps(record) + "\n")
