"""Speculative decoding against hand-computed cases and closed forms: tokens per step at acceptance 1
and 0, the expected accepted length (1 - a^(k+1)) / (1 - a) within sampling error, the step-time
speed-up at batch 1 against the cost model's own step times, draws that do not depend on batching,
and the settings it refuses (tests/test_engines.py holds it to the oracle bit for bit)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from simulator.cli.main import run as simulate_cli
from simulator.config import RunConfig
from simulator.cost import SpeculativeCost, StepShape, build_cost_model
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import DEEPSEEK_V3, LLAMA_3_1_8B, draft_model
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate

SIGMAS = 4.0
"""Sampling bounds: a correct engine falls outside them about once in 16,000 runs."""


def speculative(**settings: Any) -> RunConfig:
    base: dict[str, Any] = dict(policy="chunked", concurrency=4, num_requests=8, input_len=100,
                                speculative_method="eagle", num_speculative_tokens=4, spec_acceptance="1")
    return RunConfig(**(base | settings))


def tokens_per_step(config: RunConfig) -> tuple[dict[int, list[int]], dict[str, Any]]:
    """Each request's tokens per step that emitted any (steps end at distinct times), and the summary."""
    result = simulate(config)
    tables = build_tables(result)
    counts = (tables.tokens.group_by("request_id", "time", maintain_order=True).len()
              .sort("request_id", "time"))
    per_request: dict[int, list[int]] = {}
    for request_id, group in counts.group_by("request_id", maintain_order=True):
        per_request[int(request_id[0])] = group["len"].to_list()  # type: ignore[index]
    return per_request, summarize(result, tables)


def test_acceptance_one_emits_k_plus_one_tokens_every_step() -> None:
    """k = 4: a prefill step's first token, then 5 a step; 103 tokens end on a step of 2."""
    per_request, summary = tokens_per_step(speculative(output_len=103))
    assert per_request == {i: [1] + [5] * 20 + [2] for i in range(8)}
    assert summary["total_output_tokens"] == 8 * 103
    assert summary["spec_num_drafts"] == 8 * 21 and summary["spec_num_draft_tokens"] == 4 * 8 * 21
    assert summary["spec_acceptance_rate"] == 1.0 and summary["spec_mean_acceptance_length"] == 5.0
    assert summary["spec_acceptance_per_position"] == [1.0] * 4


def test_itl_is_timed_per_streamed_chunk() -> None:
    """vllm bench serve times a gap per chunk, and a step's tokens arrive as one: ITL is the gaps
    between a request's distinct token times, none of them 0."""
    result = simulate(speculative(output_len=103, spec_acceptance="0.6"))
    tables = build_tables(result)
    summary = summarize(result, tables)
    gaps = (tables.tokens.select("request_id", "time").unique().sort("request_id", "time")
            .group_by("request_id", maintain_order=True).agg(pl.col("time").diff().drop_nulls())
            .explode("time")["time"].to_numpy())
    assert len(gaps) < 8 * 102 and gaps.min() > 0
    assert summary["mean_itl"] == pytest.approx(gaps.mean(), rel=1e-12)
    assert summary["p99_itl"] == pytest.approx(np.percentile(gaps, 99), rel=1e-12)


def test_acceptance_zero_emits_one_token_every_step() -> None:
    per_request, summary = tokens_per_step(speculative(output_len=40, spec_acceptance="0"))
    assert per_request == {i: [1] * 40 for i in range(8)}
    assert summary["spec_num_drafts"] == 8 * 39 and summary["spec_num_accepted_tokens"] == 0
    assert summary["spec_mean_acceptance_length"] == 1.0 and summary["spec_acceptance_per_position"] == [0.0] * 4


def accepted_length_moments(a: float, k: int) -> tuple[float, float]:
    """Mean and variance of the tokens a verify step emits (1 + drafts accepted), P(L = l) =
    a^(l-1) (1 - a) for l <= k and a^k for l = k + 1, summed by hand."""
    probabilities = [a ** (length - 1) * (1 - a) for length in range(1, k + 1)] + [a**k]
    mean = sum(length * p for length, p in enumerate(probabilities, start=1))
    square = sum(length**2 * p for length, p in enumerate(probabilities, start=1))
    return mean, square - mean**2


@pytest.mark.parametrize(("a", "k"), [(0.6, 4), (0.85, 2), (0.3, 7)])
def test_mean_accepted_length_is_the_closed_form(a: float, k: int) -> None:
    """Over many verify steps the mean tokens per step is (1 - a^(k+1)) / (1 - a) within 4 standard
    errors, and each position's acceptance rate a^i within 4 binomial standard errors."""
    config = speculative(num_requests=40, concurrency=16, output_len=200, num_speculative_tokens=k,
                         spec_acceptance=f"{a}", seed=7)
    result = simulate(config)
    summary = summarize(result, build_tables(result, tokens=False))
    drafts = summary["spec_num_drafts"]
    expected = (1 - a ** (k + 1)) / (1 - a)
    mean, variance = accepted_length_moments(a, k)
    assert mean == pytest.approx(expected, rel=1e-12)  # the two hand computations agree
    assert abs(summary["spec_mean_acceptance_length"] - expected) < SIGMAS * math.sqrt(variance / drafts)
    for i, rate in enumerate(summary["spec_acceptance_per_position"], start=1):
        p = a**i
        assert abs(rate - p) < SIGMAS * math.sqrt(p * (1 - p) / drafts), i
    # The tokens emitted are the tokens asked for: a step near an output's end emits what is left.
    assert summary["total_output_tokens"] == 40 * 200


def test_draws_do_not_depend_on_batching() -> None:
    """Each request's tokens per step come from its own stream: alone or among 16, the same."""
    alone, _ = tokens_per_step(speculative(concurrency=1, output_len=60, spec_acceptance="0.9,0.7,0.5,0.3"))
    batched, _ = tokens_per_step(speculative(concurrency=8, output_len=60, spec_acceptance="0.9,0.7,0.5,0.3",
                                             policy="continuous"))
    assert alone == batched
    assert len({tuple(steps) for steps in alone.values()}) > 1  # and the requests' streams differ


def test_zero_draft_tokens_is_the_run_without_speculation() -> None:
    """k = 0 (a sweep's baseline row) drafts nothing: the tables of the run without it."""
    plain = RunConfig(policy="chunked", rate=12.0, num_requests=100, input_len=500, output_len=80)
    without = build_tables(simulate(plain))
    with_zero = build_tables(simulate(replace(plain, speculative_method="eagle", num_speculative_tokens=0,
                                              spec_acceptance="0.7")))
    for name in ("requests", "tokens", "steps"):
        assert getattr(with_zero, name).equals(getattr(without, name)), name


def tpot(config: RunConfig) -> float:
    result = simulate(config)
    return float(build_tables(result, tokens=False).requests["tpot"][0])


@pytest.mark.parametrize("method", ["eagle", "ngram", "draft"])
def test_speed_up_at_batch_one_is_the_cost_models_ratio(method: str) -> None:
    """One request at a time, acceptance 1 (k + 1 tokens every verify step): TPOT without / with
    speculation is (k + 1) x decode step / verify step, each from the cost model's step times for
    one sequence. The context grows by 100 tokens over the output, and both step times grow with it,
    so the simulated ratio lies between the ratio's values at its ends."""
    k, prompt, output = 4, 2000, 101
    model = "llama-3.1-70b" if method == "draft" else "llama-3.1-8b"
    extra: dict[str, Any] = dict(tensor_parallel_size=4, draft_model="llama-3.1-8b") if method == "draft" else {}
    plain = RunConfig(policy="chunked", concurrency=1, num_requests=1, input_len=prompt, output_len=output,
                      model=model, **{key: value for key, value in extra.items() if key != "draft_model"})
    speculating = replace(plain, speculative_method=method, num_speculative_tokens=k, spec_acceptance="1", **extra)
    simulated = tpot(plain) / tpot(speculating)
    gpu, spec = load_gpu(plain.gpu), load_gpu(plain.gpu)
    from simulator.deploy.model import load_model
    decode = build_cost_model(plain, load_model(model), gpu)
    verify = build_cost_model(speculating, load_model(model), spec)
    assert isinstance(verify, SpeculativeCost)

    def ratio(decode_context: int, verify_context: int) -> float:
        one_token = decode.step_time(StepShape(1, 1, decode_context))
        verifying = verify.step_time(StepShape(1, 1, verify_context + k, spec_tokens=k))
        return (k + 1) * one_token / verifying

    # Decode contexts run prompt + 1 .. prompt + output - 1; a verify step's, before its k + 1
    # tokens, prompt + 1 .. prompt + output - k - 1.
    low = ratio(prompt + 1, prompt + output - k - 1)
    high = ratio(prompt + output - 1, prompt + 1)
    assert low <= simulated <= high
    assert high / low < 1.02  # the bracket is tight: the check has teeth
    assert simulated > 1  # at batch 1 speculation pays


def test_draft_costs_by_method() -> None:
    """n-gram drafts cost no GPU time; an EAGLE head (one layer) costs less than a draft model (all
    of its layers); verifying k tokens costs more than one decode step and less than k + 1."""
    shape = StepShape(8, 8, 8 * 2005, spec_tokens=8 * 4)
    plain = build_cost_model(RunConfig(), LLAMA_3_1_8B, load_gpu("h100_sxm"))
    costs = {method: build_cost_model(RunConfig(speculative_method=method, num_speculative_tokens=4,
                                                spec_acceptance="0.5",
                                                draft_model="llama-3.1-8b" if method == "draft" else None),
                                      LLAMA_3_1_8B, load_gpu("h100_sxm"))
             for method in ("ngram", "eagle", "draft")}
    drafts = {method: cost.draft_time(shape) for method, cost in costs.items()}  # type: ignore[attr-defined]
    assert drafts["ngram"] == 0.0 < drafts["eagle"] < drafts["draft"]
    verify = costs["ngram"].step_time(shape)
    assert plain.step_time(StepShape(8, 8, 8 * 2001)) < verify < 5 * plain.step_time(StepShape(8, 8, 8 * 2001))


def test_mtp_drafts_with_one_layer_of_the_model() -> None:
    layer = draft_model("mtp", DEEPSEEK_V3, None)
    assert layer is not None and layer.num_layers == 1 and layer.is_moe and layer.hidden_size == DEEPSEEK_V3.hidden_size
    with pytest.raises(InputError, match=r"llama-3\.1-8b has none"):
        draft_model("mtp", LLAMA_3_1_8B, None)


@pytest.mark.parametrize(("settings", "message"), [
    (dict(policy="static"), "does not apply to --policy static"),
    (dict(num_speculative_tokens=-1), "--num-speculative-tokens must be an integer in [0, 32] tokens, got -1"),
    (dict(num_speculative_tokens=33), "--num-speculative-tokens must be an integer in [0, 32] tokens, got 33"),
    (dict(spec_acceptance="1.2"), "--spec-acceptance 1.2 is not a probability in [0, 1]"),
    (dict(spec_acceptance="0.5,0.5"), "gives 2 probabilities for --num-speculative-tokens 4"),
    (dict(spec_acceptance="high"), "--spec-acceptance takes probabilities separated by commas, got 'high'"),
    (dict(num_speculative_tokens=None), "needs --num-speculative-tokens"),
    (dict(speculative_method="medusa"), "unknown --speculative-method 'medusa'"),
    (dict(speculative_method="draft"), "--speculative-method draft needs --draft-model"),
    (dict(draft_model="llama-3.1-8b"), "--draft-model applies only to --speculative-method draft"),
    (dict(speculative_method=None, spec_acceptance="0.5"), "--num-speculative-tokens applies only with"),
    (dict(num_replicas=2, policy="static"), "does not apply to --policy static"),
])
def test_bad_settings_are_refused_in_one_line(settings: dict[str, Any], message: str) -> None:
    base = dict(speculative_method="eagle", num_speculative_tokens=4, spec_acceptance="0.7")
    with pytest.raises(InputError) as refused:
        RunConfig(**(base | settings))
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("settings", "message"), [
    (dict(model="llama-3.1-8b", speculative_method="mtp"), "llama-3.1-8b has none"),
    (dict(speculative_method="draft", draft_model="tiny"), "has a vocabulary of 1024 tokens"),
    (dict(speculative_method="draft", draft_model="llama-3.1-70b"), "does not fit beside llama-3.1-8b"),
    (dict(speculative_method="draft", draft_model="llama-9"), "--draft-model: unknown model 'llama-9'"),
])
def test_drafters_that_cannot_run_are_refused_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             settings: dict[str, Any], message: str) -> None:
    args = ["run", "--num-speculative-tokens", "3", "--spec-acceptance", "0.7", "--num-requests", "5",
            "--out", str(tmp_path / "run")]
    for name, value in settings.items():
        args += [f"--{name.replace('_', '-')}", value]
    codes: list[int] = []
    simulate_cli(args, exit=codes.append)
    _, err = capsys.readouterr()
    assert codes == [2] and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_the_printed_summary_and_summary_json_carry_vllms_metrics(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    codes: list[int] = []
    simulate_cli(["run", "--speculative-method", "ngram", "--num-speculative-tokens", "2", "--spec-acceptance",
                  "1,0", "--num-requests", "4", "--output-len", "21", "--input-len", "50", "--out",
                  str(tmp_path / "run")], exit=codes.append)
    out, _ = capsys.readouterr()
    assert codes == [0]
    # Position 1 always accepted, position 2 never: 2 tokens a step, 10 verify steps a request.
    assert "40 drafts, 80 draft tokens, 40 accepted" in out and "50.0%" in out and "1.000, 0.000" in out
    steps = pl.read_parquet(tmp_path / "run" / "tokens.parquet").group_by("request_id", "time").len()
    assert np.array_equal(np.sort(steps["len"].unique().to_numpy()), [1, 2])


def test_speculation_settings_are_sweep_axes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep over method and k: the k = 0 rows are the run without speculation (no drafts, one
    TPOT for both methods), and an EAGLE head's passes make its steps longer than n-gram lookups."""
    out = tmp_path / "sweep.parquet"
    codes: list[int] = []
    simulate_cli(["sweep", "--speculative-method", "ngram,eagle", "--num-speculative-tokens", "0,3",
                  "--spec-acceptance", "0.7", "--concurrency", "4", "--num-requests", "12", "--input-len", "300",
                  "--output-len", "60", "--jobs", "1", "--out", str(out)], exit=codes.append)
    capsys.readouterr()
    assert codes == [0]
    rows = {(r["speculative_method"], r["num_speculative_tokens"]): r
            for r in pl.read_parquet(out).iter_rows(named=True)}
    assert len(rows) == 4 and all(row["error"] is None for row in rows.values())
    assert rows[("ngram", 0)]["spec_num_drafts"] is None and rows[("ngram", 3)]["spec_num_drafts"] > 0
    assert rows[("ngram", 0)]["mean_tpot"] == rows[("eagle", 0)]["mean_tpot"]
    assert rows[("ngram", 3)]["mean_tpot"] < rows[("eagle", 3)]["mean_tpot"] < rows[("eagle", 0)]["mean_tpot"]
