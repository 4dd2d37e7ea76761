"""The chapter's two side effects, visible in the simulated data at the same load.

1. A first token waits behind strangers' work: static batching makes an arrival wait for the
   running batch, so its TTFT is far above continuous batching's.
2. Unchunked prefill stalls everyone decoding: continuous batching's ITL tail holds whole-prompt
   prefill steps, which chunked prefill (512-token chunks, as in the chapter) removes.
"""

from __future__ import annotations

import pytest

from simulator.config import RunConfig
from simulator.cost import StepShape, build_cost_model
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import LLAMA_3_1_8B
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate


def summary(policy: str, **settings: object) -> dict[str, object]:
    result = simulate(RunConfig(policy=policy, rate=6, num_requests=600, seed=3, **settings))  # type: ignore[arg-type]
    return summarize(result, build_tables(result))


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, object]]:
    return {"static": summary("static"), "continuous": summary("continuous"),
            "chunked": summary("chunked", max_num_batched_tokens=512, max_num_seqs=256)}


def test_all_three_keep_up_at_this_rate(runs) -> None:  # type: ignore[no-untyped-def]
    assert all(run["kept_up"] for run in runs.values())


def test_static_ttft_far_above_continuous(runs) -> None:  # type: ignore[no-untyped-def]
    assert runs["static"]["mean_ttft"] > 10 * runs["continuous"]["mean_ttft"]
    assert runs["static"]["p99_ttft"] > 10 * runs["continuous"]["p99_ttft"]


def test_prefill_stalls_in_continuous_itl_removed_by_chunking(runs) -> None:  # type: ignore[no-untyped-def]
    cost = build_cost_model(RunConfig(), LLAMA_3_1_8B, load_gpu("h100_sxm"))  # as the runs above
    prefill_2000 = cost.step_time(StepShape.from_rows([(2000, 2000)]))
    # Continuous: the ITL tail is at least a whole 2,000-token prefill step.
    assert runs["continuous"]["p99_itl"] >= prefill_2000
    # Chunked: the tail shrinks to a fraction of that, and the median gap barely moves.
    assert runs["chunked"]["p99_itl"] < 0.5 * runs["continuous"]["p99_itl"]
    assert runs["chunked"]["p50_itl"] == pytest.approx(runs["continuous"]["p50_itl"], rel=0.25)
