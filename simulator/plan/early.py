"""Stopping a probe as soon as its verdict is certain: a failure that no request still to finish
could undo.

A probe passes only when every request finishes, so the sample each SLO is judged on is known
before the run: n = the workload's requests (for TPOT those with more than one output token). The
requests are watched as they finish, each one's TTFT, TPOT and E2EL computed as the run's summary
computes them, and the probe stops the moment one of these holds:

- a `pNN` (or median) SLO: the summary's percentile is numpy's linear one, at least the sample's
  value of rank j = floor(q (n - 1)) (0-based, ascending). Once n - j finished requests miss the
  limit, the value of rank j misses it whatever the others are, and so does the percentile;
- a mean SLO: the latencies are not negative, so once the finished requests' sum passes n x limit
  the mean is past the limit;
- goodput: once b requests missed a goodput SLO, at most (n - b) / n of them are good; below the
  attainment, the probe fails.

Each rule fires only on a failure that the full run would also find, so stopping never changes a
verdict; rank j is taken one lower where floating point leaves it in doubt, and a mean's sum needs
a relative 1e-9 beyond the limit, both only later stops. ITL (judged from the step log's gaps) and
sessions (whose turns are sent as earlier ones finish) are never stopped early.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simulator.engine.clock import Clock
from simulator.engine.request import Request
from simulator.plan.slo import Slos
from simulator.run.clients import ClientKind, Clients, Entry, Requests, workload_clients

MEAN_SLACK = 1e-9
"""A mean is certainly past its limit once the sum is this share beyond n x limit (rounding)."""


class VerdictCertain(Exception):
    """Raised from inside the run when the probe is certain to fail (its args rebuild it: simpy raises a copy)."""

    def __init__(self, finished: int, why: str) -> None:
        super().__init__(finished, why)
        self.finished = finished


@dataclass
class Rule:
    """One SLO's count of misses, and the count (or sum, for a mean) that makes the failure certain."""

    name: str
    metric: str
    limit: float
    strict: bool
    """`<`: a value at the limit misses it too."""
    need: float
    mean: bool = False
    seen: float = 0.0

    def misses(self, value: float) -> bool:
        return value >= self.limit if self.strict else value > self.limit


def rules_for(slos: Slos, num_requests: int, multi_token: int) -> list[Rule]:
    """The rules of `slos` for a run of `num_requests`, `multi_token` of them with more than one output token."""
    rules = []
    for slo in slos.limits:
        n = multi_token if slo.metric == "tpot" else num_requests
        if slo.metric == "itl" or n == 0:
            continue
        strict = slo.operator == "<"
        if slo.statistic == "mean":
            rules.append(Rule(slo.name, slo.metric, slo.limit, strict, slo.limit * n * (1 + MEAN_SLACK), mean=True))
            continue
        index = slo.quantile * (n - 1)
        rank = math.floor(index)
        if index - rank < 1e-9 or math.ceil(index) - index < 1e-9:
            rank = max(0, round(index) - 1)  # near an integer: the lower one, a later stop at worst
        rules.append(Rule(slo.name, slo.metric, slo.limit, strict, float(n - rank)))
    return rules


class Watch:
    """Told of every finish; raises `VerdictCertain` once the probe cannot pass."""

    def __init__(self, slos: Slos, requests: Requests) -> None:
        outputs = requests.workload.output_tokens
        total = requests.num_requests
        self.rules = rules_for(slos, total, int((outputs > 1).sum()))
        self.goodput, self.attainment, self.total = slos.goodput, slos.attainment, total
        self.bad = 0
        self.finished = 0

    def __call__(self, request: Request, at: float) -> None:
        self.finished += 1
        e2el = request.finish - request.arrival
        ttft = request.first_token - request.arrival
        values = {"e2el": e2el, "ttft": ttft}
        if request.output_tokens > 1:
            values["tpot"] = (e2el - ttft) / (request.output_tokens - 1)
        for rule in self.rules:
            value = values.get(rule.metric, math.nan)
            if math.isnan(value):
                continue  # not known here: never counted against the probe
            if rule.mean:
                rule.seen += value
                if rule.seen > rule.need:
                    raise VerdictCertain(self.finished, f"{rule.name}: the finished requests' sum passes n x limit")
            elif rule.misses(value):
                rule.seen += 1
                if rule.seen >= rule.need:
                    raise VerdictCertain(self.finished, f"{rule.name}: {rule.seen:.0f} requests past the limit")
        if self.goodput and any(metric in values and values[metric] > limit for metric, limit in self.goodput):
            self.bad += 1
            if (self.total - self.bad) / self.total < self.attainment:  # at most this share can be good
                raise VerdictCertain(self.finished, f"slo_attainment: {self.bad} requests missed a goodput SLO")


class Watched:
    """A run's own clients, with a `Watch` told of every finish after them."""

    def __init__(self, inner: Clients, watch: Watch) -> None:
        self.inner = inner
        self.watch = watch

    @property
    def on_finish(self) -> Callable[[Request, float], None]:
        inner, watch = self.inner.on_finish, self.watch
        if inner is None:
            return watch

        def both(request: Request, at: float) -> None:
            inner(request, at)
            watch(request, at)

        return both

    @property
    def arrivals(self) -> list[float] | None:
        return self.inner.arrivals

    def start(self, entry: Entry) -> None:
        self.inner.start(entry)


def watched_clients(slos: Slos) -> ClientKind:
    """The workload's own clients, watched for a certain failure of `slos` (sessions: not watched)."""

    def clients(env: Clock, requests: Requests) -> Clients:
        inner = workload_clients(env, requests)
        if requests.workload.turns > 1:
            return inner
        return Watched(inner, Watch(slos, requests))

    return clients
