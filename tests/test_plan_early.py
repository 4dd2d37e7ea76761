"""A probe stopped as soon as its failure is certain (simulator.plan.early): the rule's rank checked
against numpy's percentile itself, and early-stopped probes against full runs of the same stream:
the same verdict for every seed and rate, the same values where they pass, and fewer requests run
where they fail."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config import DEFAULTS
from simulator.plan.capacity import probe_seed, requests_for
from simulator.plan.early import rules_for
from simulator.plan.slo import build_slos
from simulator.plan.space import WORKLOAD_SETTINGS

BASE = {k: v for k, v in DEFAULTS.items() if k not in WORKLOAD_SETTINGS} | {
    "policy": "chunked", "max_num_batched_tokens": 512, "max_num_seqs": 64, "input_len": 1000, "output_len": 100}


@pytest.mark.parametrize("n", [1, 2, 7, 400, 1000, 1001, 4321])
@pytest.mark.parametrize("quantile", ["median", "p50", "p90", "p99", "p99.9", "p1"])
def test_the_count_that_makes_a_miss_certain_is_numpys_own(n: int, quantile: str) -> None:
    """With `need` requests past the limit numpy's percentile is past it, however small the rest;
    with one fewer (each just past the limit, the rest 0) it can still be within it, so the rule
    stops no later than it must, except where the rank q (n - 1) is a whole number: numpy's floating
    point may put it either side, and the rule takes the lower (one more miss)."""
    slos = build_slos((f"{quantile}_ttft_ms<=100",), None, (), None)
    [rule] = rules_for(slos, n, n)
    need = int(rule.need)
    assert 1 <= need <= n
    q = 50.0 if quantile == "median" else float(quantile[1:])
    limit = 0.1
    whole = abs(q / 100 * (n - 1) - round(q / 100 * (n - 1))) < 1e-9
    for misses, above in ((need, True), (max(0, need - 1 - whole), False)):
        sample = np.concatenate([np.zeros(n - misses), np.full(misses, limit * 1.001)])
        assert (float(np.percentile(sample, q, method="linear")) > limit) is above, (misses, need)
    # The p99 of 1,000 by hand: rank floor(0.99 x 999) = 989, so 1000 - 989 = 11 misses.
    if quantile == "p99" and n == 1000:
        assert need == 11


CASES = [({}, [24.0, 29.0, 30.0, 36.0]),
         ({"num_replicas": 2, "router": "round-robin"}, [55.0, 62.0, 75.0]),
         ({"prefill_replicas": 1, "decode_replicas": 1}, [35.0, 41.0, 50.0])]


@pytest.mark.parametrize(("fleet", "rates"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_early_stop_never_changes_a_verdict(fleet: dict[str, object], rates: list[float], seed: int) -> None:
    settings = BASE | fleet | {"seed": seed}
    slos = build_slos(("p99_ttft_ms<=400", "p90_tpot_ms<=25"), None, (), None)
    servers = 2 if fleet else 1
    n = requests_for(slos, servers)
    stopped = 0
    for rate in rates:
        early = probe_seed(settings, slos, rate, n)
        full = probe_seed(settings, slos, rate, n, early=False)
        assert early.met == full.met, (rate, early, full)
        assert full.stopped_at == 0
        if early.met:
            assert early.values == full.values and early.stopped_at == 0
        elif early.stopped_at:
            stopped += 1
            assert early.stopped_at < n
    assert stopped >= 1  # the highest rate fails, and stops before its last request


def test_goodput_and_mean_slos_stop_exactly() -> None:
    """An attainment the goodput SLOs cannot reach, and a mean TTFT past its limit: the same verdicts."""
    for texts, goodput in (((), ("ttft:300",)), (("mean_ttft_ms<=150",), ()), (("median_e2el_ms<1500",), ())):
        slos = build_slos(texts, None, goodput, 0.95 if goodput else None)
        n = requests_for(slos, 1)
        verdicts = []
        for rate in (22.0, 30.0, 40.0):
            early, full = probe_seed(BASE, slos, rate, n), probe_seed(BASE, slos, rate, n, early=False)
            assert early.met == full.met, (texts, goodput, rate)
            verdicts.append((early.met, early.stopped_at > 0))
        assert verdicts[0][0] and verdicts[-1] == (False, True), (texts, goodput, verdicts)
