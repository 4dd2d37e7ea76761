"""The client as it ran: aiperf's prompt pool, its warm-up barrier, a sweep's levels back to back
against one server with its prefix cache kept, and clients that stay in lockstep or come apart; on
hand-counted cases (1 s per step) and what a closed loop must do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import UnitCost

from simulator.config import RunConfig
from simulator.cost.contract import StepShape
from simulator.errors import InputError
from simulator.metrics.summary import build_tables
from simulator.run.clients import ClientRun
from simulator.sim2real.measured import MeasuredPoint
from simulator.sim2real.replay import Replay, replay_sweep, replay_workload
from simulator.sim2real.sweeps import Hypothesis, server_key, spread_outputs, sweep_units
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


def test_an_output_spread_draws_each_requests_length_within_it() -> None:
    row = point(8)  # 8 warm-up and 80 measured requests of 128 output tokens
    spread = spread_outputs(row, 0.1, seed=3)
    lengths = np.array(spread.output_lens)
    assert len(lengths) == 88 and lengths.min() >= 115 and lengths.max() <= 141  # 128 x (1 -+ 0.1), rounded
    assert abs(lengths.mean() - 128) < 0.02 * 128 and len(set(lengths.tolist())) > 10
    assert spread_outputs(row, 0.1, seed=3) == spread and spread_outputs(row, 0.1, seed=4) != spread
    assert spread_outputs(row, 0.0) is row and spread_outputs(spread, 0.1) is spread  # own lengths kept
    with pytest.raises(ValueError, match="output_spread"):
        Hypothesis(output_spread=1.0)


class PrefillCost(UnitCost):
    """20 s for a step that computes prompt tokens, 1 s for a decode-only step."""

    def step_time(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return 20.0 if shape.prefill_tokens else 1.0


def prompts_while_decoding(run: Replay) -> np.ndarray:
    """Per measured request, how many steps computing prompt tokens ended inside its decode."""
    tables = build_tables(run.result, tokens=False)
    prefills = tables.steps.filter(pl.col("prefill_tokens") > 0)
    ends = np.sort((prefills["start"] + prefills["duration"]).to_numpy())
    measured = tables.requests.filter(pl.col("request_id") >= run.warmup)
    first, finish = measured["first_token"].to_numpy(), measured["finish"].to_numpy()
    return np.searchsorted(ends, finish, "right") - np.searchsorted(ends, first, "right")


def test_clients_in_lockstep_see_fewer_prompts_while_they_decode_than_clients_apart() -> None:
    # 4 clients, 512-token prompts one per step (a 600-token budget), 100 output tokens; a prompt's
    # step takes 20 s, a decode step 1 s. Clients that come apart send their requests at unrelated
    # times, so while one request decodes each of the 3 others computes its next prompt about once:
    # 3 x (its decode) / (the whole cycle, decode + its own wait for a prompt step) prompts, between
    # 2.5 and 3 here. Clients that start together and ask for equal lengths stay in waves whose
    # prompts queue behind one another at the start of a cycle: fewer prompts land inside a decode
    # and more of each TTFT is the wait for another's prompt.
    clients, measured = 4, 160
    config = RunConfig(policy="chunked", max_num_batched_tokens=600, max_num_seqs=16)
    runs = {}
    for spread in (0.0, 0.1):
        row = MeasuredPoint("p", "g", "m", "h100_sxm", 1, None, measured, clients, clients, None, 1.0, (512,), (100,))
        sent = spread_outputs(row, spread)
        workload = Workload(np.full(clients + measured, 512, np.int64),
                            np.resize(np.asarray(sent.output_lens, np.int64), clients + measured), None, clients)
        runs[spread] = replay_workload(config, ClientRun(clients, clients, measured), workload, PrefillCost())  # type: ignore[arg-type]
    apart, lockstep = prompts_while_decoding(runs[0.1]).mean(), prompts_while_decoding(runs[0.0]).mean()
    assert 2.5 <= apart <= 3.0
    assert lockstep < 2.5
    assert runs[0.1].ttft.mean() < 0.8 * runs[0.0].ttft.mean()


def test_the_ttft_counted_at_a_later_token_adds_its_decode_steps() -> None:
    # 1 client, 2 measured requests of 10 prompt and 5 output tokens, 1 s per step: each request's
    # token k reaches the client k + 1 s after its send; a request of 2 output tokens has no token 3,
    # so its TTFT at token 3 is its last token's (2 s).
    outputs = np.array([5, 5, 2], np.int64)
    run = replay_workload(RunConfig(policy="chunked"), ClientRun(1, 1, 2),
                          Workload(np.full(3, 10, np.int64), outputs, None, 1), UnitCost())  # type: ignore[arg-type]
    assert run.ttft.tolist() == [1.0, 1.0]
    assert run.ttft_at(0) is run.ttft
    assert run.ttft_at(3).tolist() == [4.0, 2.0]
    assert run.ttft_at(1).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="token -1"):
        run.ttft_at(-1)
