"""Planning regret on hand-made compare rows: every number below is worked out by hand."""

from __future__ import annotations

import math

import polars as pl
import pytest

from simulator.sim2real.compare import ROW_SCHEMA
from simulator.sim2real.regret import not_as_stated, planning_regret, points, regret_lines, regret_summary


def rows(deployments: list[tuple[int, float, float, float, float]], group: str = "m gpu") -> pl.DataFrame:
    """Compare rows of closed-loop points: (concurrency, measured TTFT, TPOT, simulated TTFT, TPOT), TP 1,
    11 output tokens (so tokens/s/GPU = c x 11 / (TTFT + 10 TPOT))."""
    found = []
    for i, (concurrency, ttft, tpot, sim_ttft, sim_tpot) in enumerate(deployments):
        base = {"point": f"{group}-{i}", "group": group, "backend": "vllm", "mode": "agg",
                "gpu": "h100_sxm", "model": "m", "tensor_parallel_size": 1,
                "quantization": "", "concurrency": concurrency, "rate": None, "input_len": 100.0,
                "output_len": 11.0}
        for statistic, measured, simulated in (("ttft_mean", ttft, sim_ttft), ("tpot_mean", tpot, sim_tpot)):
            found.append(base | {"statistic": statistic, "measured": measured, "simulated": simulated,
                                 "error": simulated / measured - 1 if measured else math.nan})
    return pl.DataFrame(found, schema=ROW_SCHEMA)


# Three deployments, TTFT 0 to keep the arithmetic plain: tokens/s/GPU = c * 11 / (10 tpot).
THREE = [(1, 0.0, 0.010, 0.0, 0.010),   # 11 / 0.10 = 110 tokens/s
         (4, 0.0, 0.020, 0.0, 0.015),   # 44 / 0.20 = 220 (predicted 44 / 0.15 = 293.3)
         (8, 0.0, 0.040, 0.0, 0.018)]   # 88 / 0.40 = 220 (predicted 88 / 0.18 = 488.9)


def test_tokens_per_gpu_of_a_closed_loop() -> None:
    table = points(rows(THREE)).sort("concurrency")
    assert table["measured_tokens"].to_list() == pytest.approx([110.0, 220.0, 220.0])
    assert table["predicted_tokens"].to_list() == pytest.approx([110.0, 44 / 0.15, 88 / 0.18])


def test_regret_at_each_quantile_and_its_baselines() -> None:
    regrets = planning_regret(rows(THREE)).sort("quantile")
    # Measured TPOTs 10, 20, 40 ms: limits at the 25th/50th/75th percentile are 15, 20, 30 ms.
    assert regrets["limit"].to_list() == pytest.approx([0.015, 0.020, 0.030])
    # 15 ms: really feasible {c1}; predicted to fit {c1 (10), c4 (15)}: picks c4, which misses -> 1.
    # 20 ms: feasible {c1, c4}, best 220; predicted fits all three, picks c8 (488.9), which misses -> 1.
    # 30 ms: feasible {c1, c4}; the pick is again c8 -> 1.
    assert regrets["regret"].to_list() == [1.0, 1.0, 1.0]
    assert regrets["missed"].to_list() == [True, True, True]
    # Random: 15 ms: (0 + 1 + 1) / 3; 20 and 30 ms: (0.5 + 0 + 1) / 3. Among feasible: 0; (0.5 + 0) / 2.
    assert regrets["random"].to_list() == pytest.approx([2 / 3, 0.5, 0.5])
    assert regrets["random_feasible"].to_list() == pytest.approx([0.0, 0.25, 0.25])


def test_perfect_predictions_have_no_regret_and_no_pick_counts_one() -> None:
    perfect = [(c, ttft, tpot, ttft, tpot) for c, ttft, tpot, _, _ in THREE]
    assert planning_regret(rows(perfect))["regret"].to_list() == [0.0, 0.0, 0.0]
    pessimist = [(c, ttft, tpot, ttft, tpot * 10) for c, ttft, tpot, _, _ in THREE]
    regrets = planning_regret(rows(pessimist))
    assert regrets["no_pick"].all() and regrets["regret"].to_list() == [1.0, 1.0, 1.0]
    summary = regret_summary(regrets).row(0, named=True)
    assert summary["cases"] == 3 and summary["no_pick"] == 1.0 and summary["missed"] == 0.0


def test_a_workload_with_one_deployment_is_not_judged() -> None:
    assert planning_regret(rows(THREE[:1])).is_empty()
    assert regret_lines(rows(THREE[:1])) == ["planning regret: no workload has two or more measured deployments"]
    lines = regret_lines(pl.concat([rows(THREE), rows(THREE[:1], group="other")]))
    assert "100% of 4 points predicted" in lines[0]
    assert "100.0% mean regret over 3 cases" in lines[1] and "random pick 55.6%" in lines[1], lines
    assert not math.isnan(planning_regret(rows(THREE))["random"].sum())


def test_disaggregated_rows_are_left_out() -> None:
    """Their GPUs are two pools' worth, not the tensor-parallel size: they make no tokens/s/GPU here."""
    table = rows(THREE).with_columns(mode=pl.when(pl.col("concurrency") == 8).then(pl.lit("disagg"))
                                     .otherwise(pl.col("mode")))
    assert points(table).sort("concurrency")["concurrency"].to_list() == [1, 4]


def test_regret_is_per_stack() -> None:
    """The same workload measured on two stacks is two workloads: each judged on its own rows. On
    SGLang the predictions are perfect (regret 0); on vLLM they are THREE's (regret 1 at each limit)."""
    perfect = [(c, ttft, tpot, ttft, tpot) for c, ttft, tpot, _, _ in THREE]
    table = pl.concat([rows(THREE), rows(perfect).with_columns(backend=pl.lit("sglang"),
                                                                point=pl.col("point") + "-sglang")])
    summary = {r["stack"]: r for r in regret_summary(planning_regret(table)).iter_rows(named=True)}
    assert set(summary) == {"vllm", "sglang"}
    assert summary["vllm"]["cases"] == summary["sglang"]["cases"] == 3
    assert summary["vllm"]["regret"] == 1.0 and summary["sglang"]["regret"] == 0.0
    lines = regret_lines(table)
    assert any(line.startswith("  vllm") and "100.0% mean regret" in line for line in lines), lines
    assert any(line.startswith("  sglang") and " 0.0% mean regret" in line for line in lines), lines


def test_a_deployments_gpus_are_tensor_times_data_parallel() -> None:
    """A row of 2 data-parallel ranks of TP 1 takes 2 GPUs: c4's 220 tokens/s are 110 per GPU. At the
    20 ms limit c8 (488.9 predicted, 40 ms measured) is still the pick and misses; with perfect
    predictions c1 and c4 are the feasible ones, both 110 per GPU, so either pick has regret 0."""
    table = rows(THREE).with_columns(data_parallel_size=pl.when(pl.col("concurrency") == 4).then(2).otherwise(1))
    per_gpu = points(table).sort("concurrency")
    assert per_gpu["gpus"].to_list() == [1, 2, 1]
    assert per_gpu["measured_tokens"].to_list() == pytest.approx([110.0, 110.0, 220.0])
    at_median = planning_regret(table).filter(pl.col("quantile") == 0.5).row(0, named=True)
    assert at_median["pick_concurrency"] == 8 and at_median["missed"]  # c8 (488.9 predicted) still wins
    perfect = [(c, ttft, tpot, ttft, tpot) for c, ttft, tpot, _, _ in THREE]
    honest = rows(perfect).with_columns(data_parallel_size=pl.when(pl.col("concurrency") == 4).then(2).otherwise(1))
    at_median = planning_regret(honest).filter(pl.col("quantile") == 0.5).row(0, named=True)
    # Feasible at 20 ms: c1 (110) and c4 (110 per GPU): best 110, the pick one of them, regret 0.
    assert at_median["regret"] == 0.0 and at_median["best_gpus"] in (1, 2)


def test_the_regret_again_without_the_points_that_did_not_run_as_stated() -> None:
    # C measures twice B's tokens/s/GPU at B's TPOT, which its GPU's bandwidth could not have served
    # (bandwidth_share 1.5). Measured TPOTs 10, 20, 20 ms: limits 15, 20, 20 ms. At 15 ms only A is
    # feasible and predicted to fit: regret 0. At 20 ms C is the best (440 tokens/s), A and B are
    # predicted to fit, the pick B (220): regret 0.5, twice; mean 1/3. Without C, the limits are
    # 12.5, 15, 17.5 ms: A alone feasible and predicted to fit each time: 0.
    three = rows([(1, 0.0, 0.010, 0.0, 0.010), (4, 0.0, 0.020, 0.0, 0.020), (8, 0.0, 0.020, 0.0, 0.040)])
    three = three.with_columns(bandwidth_share=pl.when(pl.col("point") == "m gpu-2").then(1.5).otherwise(0.5))
    assert planning_regret(three)["regret"].mean() == pytest.approx(1 / 3)
    lines = regret_lines(three)
    assert "33.3% mean regret over 3 cases" in lines[1]
    assert lines[2].startswith("and without the 1 points that did not run as stated")
    assert "0.0% mean regret over 3 cases" in lines[3]
    # A closed loop whose measured TTFT is a queue for whole requests decoded ~0.7 requests at once
    # where its rerun decoded all 8 (Little's law): it did not run as stated either.
    queued = rows([(8, 1.0, 0.010, 0.0, 0.010), (4, 0.0, 0.020, 0.0, 0.020)])
    assert not_as_stated(queued) == {"m gpu-0"}
    assert not_as_stated(rows(THREE)) == set()
