"""The client as it ran: aiperf's prompt pool, its warm-up barrier, and a sweep's levels back to back
against one server with its prefix cache kept; on hand-counted cases (1 s per step)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import UnitCost

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.run.clients import ClientRun
from simulator.sim2real.measured import MeasuredPoint
from simulator.sim2real.replay import replay_sweep
from simulator.sim2real.sweeps import server_key, sweep_units
from workloads import Workload


def fixed(n: int, prompt: int, output: int) -> Workload:
    return Workload(np.full(n, prompt, np.int64), np.full(n, output, np.int64), None, 1)


def test_a_sweep_keeps_the_cache_and_waits_for_each_level_to_finish() -> None:
    # Two levels of 1 client, each 1 warm-up + 2 measured requests of 64 prompt tokens and 2 output
    # tokens, all from a pool of 1 entry. Only the very first prompt is computed whole (64 tokens);
    # every later one finds 48 cached (the hit stops short of the last token) and computes 16; the
    # second level's warm-up too: the cache outlived the first level.
    cost = UnitCost()
    config = RunConfig(policy="chunked", num_dataset_entries=1)
    runs = replay_sweep(config, [ClientRun(1, 1, 2), ClientRun(1, 1, 2)], fixed(6, 64, 2), cost)  # type: ignore[arg-type]
    prefills = [s.prefill_tokens for s in cost.shapes if s.prefill_tokens]
    assert prefills == [64, 16, 16, 16, 16, 16]
    # Each request takes 2 steps (prefill with its first token, then one decode), one after another:
    # level 2's warm-up is sent when level 1's last reply is back (t = 6), its first measured at 8.
    reqs = runs[0].result.requests
    assert reqs.arrival.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert [r.ttft.tolist() for r in runs] == [[1.0, 1.0], [1.0, 1.0]]
    assert (runs[0].warmup, runs[0].end, runs[1].warmup, runs[1].end) == (1, 3, 4, 6)


def test_without_a_pool_every_prompt_is_its_own() -> None:
    cost = UnitCost()
    replay_sweep(RunConfig(policy="chunked"), [ClientRun(1, 1, 2)], fixed(3, 64, 2), cost)  # type: ignore[arg-type]
    assert [s.prefill_tokens for s in cost.shapes if s.prefill_tokens] == [64, 64, 64]


def test_the_warm_up_is_answered_whole_before_the_measured_clients_start() -> None:
    # 4 clients, 4 warm-up requests sent at once; one step each of prefill (batch of 4), 3 decodes:
    # the measured 4 start together when the last warm-up reply is back.
    cost = UnitCost()
    runs = replay_sweep(RunConfig(policy="chunked"), [ClientRun(4, 4, 4)], fixed(8, 10, 4), cost)  # type: ignore[arg-type]
    arrivals = runs[0].result.requests.arrival
    assert arrivals[:4].tolist() == [0.0] * 4 and arrivals[4:].tolist() == [4.0] * 4


def point(concurrency: int, tp: int = 2, backend: str = "vllm") -> MeasuredPoint:
    return MeasuredPoint(f"c{concurrency}tp{tp}{backend}", "g", "qwen3-32b", "h100_sxm", tp, None, 10 * concurrency,
                         concurrency, concurrency, None, 1.0, (1024,), (128,), {"ttft_mean": 0.1}, backend)


def test_sweep_units_group_one_server_in_ascending_concurrency() -> None:
    points = [point(64), point(8), point(8, tp=4), point(16, backend="sglang"), point(16)]
    units = sweep_units(points)
    assert [[p.concurrency for p in u.points] for u in units] == [[8, 16, 64], [8], [16]]
    assert all(len({server_key(p) for p in u.points}) == 1 for u in units)
    assert len(sweep_units(points, together=False)) == 5


@pytest.mark.parametrize("args", [["--num-dataset-entries", "10", "--prefix-len", "100"],
                                  ["--num-dataset-entries", "0"], ["--backend", "tgi"]])
def test_bad_client_and_backend_flags_are_one_line(args: list[str], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from test_cli import simulate_cli

    code, _, err = simulate_cli(["run", *args, "--out", str(tmp_path / "r")], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("--num-dataset-entries" in err) or ("--backend" in err)
    with pytest.raises(InputError):
        RunConfig(num_dataset_entries=5, num_turns=2)
