"""Shared test scaffolding: a 1-second-per-step cost model and a tiny-scenario runner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from simulator.config import RunConfig
from simulator.cost import StepShape
from simulator.metrics.summary import build_tables
from simulator.run.result import RunResult
from simulator.run.simulate import simulate
from workloads import Workload

TRACES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "traces"
AZURE = TRACES / "azure_conv_2023.csv"
MOONCAKE = TRACES / "mooncake_conversation.jsonl"
# The reference data lives beside the checkout (../shared), never in it; without it these skip, naming it.
needs_azure = pytest.mark.skipif(not AZURE.exists(), reason=f"reference trace missing: {AZURE}")
needs_mooncake = pytest.mark.skipif(not MOONCAKE.exists(), reason=f"reference trace missing: {MOONCAKE}")


class UnitCost:
    """1 s per step; keeps every shape it was asked about."""

    def __init__(self) -> None:
        self.shapes: list[StepShape] = []

    pure = False  # it records every shape it prices
    extrapolated: dict[str, int] = {}  # noqa: RUF012 (never written)
    notes: tuple[str, ...] = ()

    def step_time(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return 1.0

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        return np.array([self.step_time(StepShape(num_seqs, num_seqs, int(c))) for c in contexts])


def run(policy: str, arrivals: list[float], prompts: list[int], outputs: list[int], **settings: object
        ) -> tuple[RunResult, UnitCost]:
    workload = Workload(prompt_tokens=np.array(prompts, dtype=np.int64),
                        output_tokens=np.array(outputs, dtype=np.int64),
                        arrival=np.array(arrivals, dtype=np.float64), concurrency=None)
    cost = UnitCost()
    return simulate(RunConfig(policy=policy, **settings), workload, cost), cost  # type: ignore[arg-type]


def token_times(result: RunResult, request_id: int) -> list[float]:
    tokens = build_tables(result).tokens.filter(pl.col("request_id") == request_id).sort("index")
    return tokens["time"].to_list()
