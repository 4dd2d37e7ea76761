"""Requests decoding at once by Little's law (`simulator.sim2real.inflight`): the formula by hand,
against the engine's own closed loops, and the compare report that flags a measured server that
ran fewer at once than its rerun."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from simulator.cli.compare_command import print_in_flight
from simulator.config import RunConfig
from simulator.metrics.summary import build_tables
from simulator.run.simulate import simulate
from simulator.sim2real.inflight import decoding_at_once, fewer_at_once
from tests.helpers import UnitCost
from workloads import Workload


def at_once(concurrency: int, output_len: int, ttft: float, tpot: float) -> float:
    frame = pl.DataFrame({"c": [concurrency], "o": [output_len], "ttft": [ttft], "tpot": [tpot]})
    return float(frame.select(decoding_at_once(pl.col("c"), pl.col("o"), pl.col("ttft"), pl.col("tpot"))).item())


def test_by_hand() -> None:
    # SGLang's TP 1 Qwen3-32B row at 16 clients, 1,024/128 tokens: TTFT 6.776 s, TPOT 25.5 ms; each
    # request decodes 127 x 25.5 ms = 3.2385 s of its 10.0145 s in the loop: 16 x 0.3234 = 5.17 at once.
    assert at_once(16, 128, 6.776, 0.0255) == pytest.approx(16 * 3.2385 / 10.0145, rel=1e-9)
    assert at_once(16, 128, 0.0, 0.02) == pytest.approx(16.0)  # no TTFT: every client is decoding


@pytest.mark.parametrize("max_num_seqs", [4, 16])
def test_the_engines_closed_loop_decodes_what_its_batch_cap_allows(max_num_seqs: int) -> None:
    # 16 clients, 1 s a step, 50-token answers: a request holds its slot for its prefill step and 49
    # decode steps, so max_num_seqs x 49/50 decode at once; Little's law on the run's mean TTFT and
    # TPOT must find that, whether the TTFT is one step or a queue for whole requests.
    total = 400
    workload = Workload(prompt_tokens=np.full(total, 100, np.int64), output_tokens=np.full(total, 50, np.int64),
                        arrival=None, concurrency=16)
    requests = build_tables(simulate(RunConfig(policy="continuous", max_num_seqs=max_num_seqs), workload,
                                     UnitCost())).requests  # type: ignore[arg-type]
    found = at_once(16, 50, float(requests["ttft"].mean()), float(requests["tpot"].mean()))  # type: ignore[arg-type]
    assert found == pytest.approx(max_num_seqs * 49 / 50, rel=0.03)


def rows(point: str, concurrency: int | None, ttft: tuple[float, float], tpot: tuple[float, float],
         rate: float | None = None) -> list[dict]:
    return [{"point": point, "gpu": "h100_sxm_sglang", "concurrency": concurrency, "rate": rate, "output_len": 128.0,
             "statistic": statistic, "measured": measured, "simulated": simulated}
            for statistic, (measured, simulated) in (("ttft_mean", ttft), ("tpot_mean", tpot))]


def test_a_server_that_ran_fewer_at_once_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    table = pl.DataFrame(rows("queued", 16, (6.776, 0.30), (0.0255, 0.030))  # 5.2 at once against 14.8
                         + rows("served", 16, (0.30, 0.32), (0.030, 0.031))  # 14.8 against 14.8
                         + rows("open loop", None, (0.2, 0.2), (0.02, 0.02))
                         # capped at 16 but sent at 1 req/s: few in flight whatever the TTFT, not a closed loop
                         + rows("capped open loop", 16, (6.776, 0.30), (0.0255, 0.030), rate=1.0))
    fewer, checked = fewer_at_once(table)
    assert checked == 2 and fewer["point"].to_list() == ["queued"]
    assert fewer["measured"].item() == pytest.approx(at_once(16, 128, 6.776, 0.0255))
    assert fewer["simulated"].item() == pytest.approx(at_once(16, 128, 0.30, 0.030))
    print_in_flight(table)
    out = capsys.readouterr().out
    assert "1 of 2 closed-loop points ran under 50% as many as their rerun" in out
    assert "queued" in out and "5.2 at once of 16 clients (rerun 14.8)" in out and "served" not in out
