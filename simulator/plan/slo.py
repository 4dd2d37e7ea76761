"""Latency SLOs as vLLM's `bench sweep serve_sla` writes them: `p99_ttft_ms<=500`, one limit on one
statistic (mean, median or pNN) of one latency (ttft, tpot, itl, e2el), named as in vLLM's result
JSON; and goodput SLOs (`--goodput ttft:500`) with the share of requests that must meet all of them
(`--slo-attainment`, DistServe's attainment).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.config import GOODPUT_METRICS
from simulator.errors import InputError, clip_path
from simulator.ranges import MAX_SECONDS, parse_goodput, quote

METRICS = ("ttft", "tpot", "itl", "e2el")
OPERATORS = ("<=", "<")
"""vLLM's SLA operators that bound a latency from above (`>`, `>=` bound nothing a plan can meet)."""
SLO_PATTERN = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


@dataclass(frozen=True)
class Slo:
    """`statistic` (mean, median, p99, ...) of `metric` held `operator` `limit` seconds."""

    statistic: str
    metric: str
    operator: str
    limit: float

    @property
    def name(self) -> str:
        """vLLM's result-JSON key: `p99_ttft_ms`."""
        return f"{self.statistic}_{self.metric}_ms"

    @property
    def quantile(self) -> float:
        """The share of requests the statistic leaves below it (0.5 for mean and median)."""
        return float(self.statistic[1:]) / 100 if self.statistic.startswith("p") else 0.5

    @property
    def summary_key(self) -> str:
        """The run summary's name for the statistic (`simulator.metrics.summary`): `p99_ttft`."""
        statistic = f"p{float(self.statistic[1:]):g}" if self.statistic.startswith("p") else self.statistic
        return f"{statistic}_{self.metric}"

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.operator == "<=" else value < self.limit

    def text(self) -> str:
        return f"{self.name}{self.operator}{self.limit * 1e3:g}"

    def tightened(self, margin: float) -> Slo:
        """The limit lowered by the share `margin` (a prediction's published error)."""
        return Slo(self.statistic, self.metric, self.operator, self.limit * (1 - margin))


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def parse_slo(text: str, where: str = "--slo") -> Slo:
    """`p99_ttft_ms<=500` (vLLM's key, an operator, milliseconds)."""
    for operator in (">=", "<=", ">", "<"):
        name, found, limit = text.partition(operator)
        if found:
            break
    else:
        raise InputError(f"{where} takes NAME<=MILLISECONDS such as p99_ttft_ms<=500, got {quote(text)}")
    return _slo(name.strip(), operator, limit.strip(), where)


def _slo(name: str, operator: str, limit: str, where: str) -> Slo:
    match = SLO_PATTERN.match(name)
    if match is None:
        raise InputError(f"{where}: unknown metric {quote(name)} (mean_, median_ or pNN_ then ttft, tpot, itl or "
                         "e2el, then _ms, as vLLM's result JSON names them)")
    statistic, metric = match.groups()
    if statistic.startswith("p") and not 0 < float(statistic[1:]) < 100:
        raise InputError(f"{where}: percentile {quote(statistic)} must be between p0 and p100")
    if operator not in OPERATORS:
        raise InputError(f"{where}: {name}{operator}... sets a floor on a latency; a plan meets limits (<= or <)")
    try:
        milliseconds = float(limit)
    except ValueError:
        raise InputError(f"{where}: {name} takes a limit in milliseconds, got {quote(limit)}") from None
    if not 0 < milliseconds <= MAX_SECONDS * 1e3:
        raise InputError(f"{where}: {name} limit must be > 0 and at most {MAX_SECONDS * 1e3:g} ms, got {quote(limit)}")
    return Slo(statistic, metric, operator, milliseconds / 1e3)


def read_sla_params(path: Path) -> list[Slo]:
    """One SLA of `vllm bench sweep serve_sla --sla-params`: a JSON list holding one object of
    `"p99_ttft_ms": "<=500"` entries (or that object alone)."""
    where = f"--sla-params {clip_path(str(path))}"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{where}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{where} is not JSON: {str(exc).splitlines()[0][:80]}") from None
    if isinstance(data, list):
        if len(data) != 1:
            raise InputError(f"{where} lists {len(data)} SLAs; a plan meets one (give a list of one object)")
        data = data[0]
    if not isinstance(data, dict) or not data:
        raise InputError(f"{where} must hold an object of metric: \"<=MILLISECONDS\" entries")
    slos = []
    for name, condition in data.items():
        if not isinstance(condition, str):
            raise InputError(f"{where}: {quote(name)} takes a string such as \"<=500\", got {quote(condition)}")
        operator = next((op for op in (">=", "<=", ">", "<") if condition.startswith(op)), "")
        if not operator:
            raise InputError(f"{where}: {quote(name)} takes <=, <, >= or > then milliseconds, got {quote(condition)}")
        slos.append(_slo(str(name), operator, condition.removeprefix(operator), where))
    return slos


@dataclass(frozen=True)
class Slos:
    """Every SLO a deployment must meet at its capacity."""

    limits: tuple[Slo, ...] = ()
    goodput: tuple[tuple[str, float], ...] = ()
    """(metric, seconds) each request must meet to count as good."""
    attainment: float = 0.99
    """The share of requests that must be good."""

    def __post_init__(self) -> None:
        names = [slo.name for slo in self.limits]
        for name in names:
            if names.count(name) > 1:
                raise InputError(f"--slo gives {name} twice")
        if not self.limits and not self.goodput:
            raise InputError("a plan needs an SLO: --slo 'p99_ttft_ms<=500', --sla-params FILE or --goodput")
        if not 0 < self.attainment <= 1:
            raise InputError(f"--slo-attainment must be in (0, 1], got {quote(self.attainment)}")

    @property
    def needs_itl(self) -> bool:
        return any(slo.metric == "itl" for slo in self.limits)

    @property
    def tail(self) -> float:
        """The highest share of requests any SLO leaves below it: the tail the run must resolve."""
        return max([slo.quantile for slo in self.limits] + ([self.attainment] if self.goodput else []))

    def percentiles(self) -> tuple[float, ...]:
        """The percentiles a run's summary must hold for these SLOs."""
        found = sorted({float(slo.statistic[1:]) for slo in self.limits if slo.statistic.startswith("p")})
        return tuple(found) or (50.0,)

    def measure(self, summary: dict[str, Any]) -> dict[str, float]:
        """Each SLO's statistic (seconds) and the goodput attainment, from a run's summary (run with
        `percentiles()` and `goodput`)."""
        values = {slo.name: _number(summary[slo.summary_key]) for slo in self.limits}
        if self.goodput:
            completed = summary["completed"]
            values["slo_attainment"] = summary["good_requests"] / completed if completed else math.nan
        return values

    def measure_names(self) -> list[str]:
        """The names `measure` gives its values."""
        return [slo.name for slo in self.limits] + (["slo_attainment"] if self.goodput else [])

    def met(self, values: dict[str, float]) -> bool:
        ok = all(slo.holds(values[slo.name]) for slo in self.limits)
        return ok and (not self.goodput or values["slo_attainment"] >= self.attainment)

    def close(self, values: dict[str, float], share: float) -> bool:
        """Whether some statistic is within `share` of its limit (attainment: of the share allowed to fail)."""
        near = any(values[slo.name] >= slo.limit * (1 - share) for slo in self.limits)
        allowed = 1 - self.attainment
        return near or (bool(self.goodput) and values["slo_attainment"] <= self.attainment + allowed * share)

    def tightened(self, margin: float | dict[str, float]) -> Slos:
        """Every limit lowered by the share `margin`, or by its metric's share of it (`METRICS`: a
        metric it does not name is not tightened)."""
        def share(metric: str) -> float:
            return margin.get(metric, 0.0) if isinstance(margin, dict) else margin

        return Slos(tuple(slo.tightened(share(slo.metric)) for slo in self.limits),
                    tuple((metric, limit * (1 - share(metric))) for metric, limit in self.goodput), self.attainment)

    def sla_params(self) -> list[dict[str, str]]:
        """vLLM serve_sla's --sla-params: one SLA of every limit. serve_sla has no joint attainment, so a
        goodput SLO is written as its own percentile at the attainment (p99 TTFT for 99% within the TTFT
        limit): each request meeting every SLO implies these, not the other way round."""
        record = {slo.name: f"{slo.operator}{slo.limit * 1e3:g}" for slo in self.limits}
        quantile = f"p{self.attainment * 100:g}"
        for metric, limit in self.goodput:
            record.setdefault(f"{quantile}_{metric}_ms", f"<={limit * 1e3:g}")
        return [record]


def build_slos(texts: tuple[str, ...], sla_file: Path | None, goodput: tuple[str, ...], attainment: float | None
               ) -> Slos:
    limits = [parse_slo(text) for text in texts]
    if sla_file is not None:
        limits += read_sla_params(sla_file)
    good = parse_goodput(goodput)
    for metric, limit in good:
        if metric not in GOODPUT_METRICS or not 0 < limit <= MAX_SECONDS:
            raise InputError(f"--goodput {metric}:{limit * 1e3:g}: metrics are {', '.join(GOODPUT_METRICS)}, limits "
                             "> 0 ms")
    if attainment is not None and not good:
        raise InputError("--slo-attainment is the share of requests meeting --goodput's SLOs: give --goodput")
    return Slos(tuple(limits), good, 0.99 if attainment is None else attainment)
