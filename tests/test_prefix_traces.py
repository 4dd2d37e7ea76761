"""Traces that carry prefix identity: Mooncake's hash_ids (checked as untrusted input) and a session
column; the Mooncake trace replayed with the prefix cache on and off."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import MOONCAKE, needs_mooncake
from test_cli import simulate_cli

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.metrics.summary import build_tables, summarize
from simulator.run.simulate import simulate
from workloads import read_trace
from workloads.prefixes import output_segment


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_hash_ids_become_512_token_segments(tmp_path: Path) -> None:
    """Equal ids are equal blocks; the last id holds what is left of the prompt; rows sorted by time."""
    trace = read_trace(write_jsonl(tmp_path / "t.jsonl", [
        {"timestamp": 5, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 4]},
    ]))
    assert trace.content is not None
    first, second = trace.content
    assert [length for _, length in first] == [512, 88] and [length for _, length in second] == [512, 512, 76]
    assert first[0] == second[0] and first[1] != second[1]


@pytest.mark.parametrize(("ids", "named"), [
    ([7], "has 1 ids in line 1, where 600 prompt tokens make 2 blocks"),
    ([7, -1], "has id -1.0 in line 1"),
    ([7, 2 ** 41], "in line 1; ids must be integers in [0, 2**40)"),
    ("7,8", 't.jsonl line 1: hash_ids is "7,8" (a string); expected a list of numbers or an empty list'),
    ([7.5, 8], "expected lists of integer block ids"),
])
def test_bad_hash_ids_are_refused_by_row(ids: object, named: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 600, "output_length": 3,
                                              "hash_ids": ids}])
    with pytest.raises(InputError, match=re.escape(named)):
        read_trace(path)


def test_bad_hash_ids_exit_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 600, "output_length": 3,
                                              "hash_ids": [1]}])
    code, _, err = simulate_cli(["--trace", str(path), "--out", str(tmp_path / "run")], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0 and "hash_ids has 1 ids in line 1" in err
    assert not (tmp_path / "run").exists()


def test_session_column_shares_the_previous_turn(tmp_path: Path) -> None:
    """A session's second turn (1,000 tokens, arriving after the first is done) starts with the first
    turn's 300 prompt + 100 answer tokens: the first turn computed 399 of them (its last answer
    token has no KV), 24 full blocks of 16; the other session shares nothing."""
    path = tmp_path / "sessions.csv"
    pl.DataFrame({"arrival": [0.0, 0.1, 30.0], "session_id": ["a", "b", "a"], "prompt_tokens": [300, 500, 1000],
                  "output_tokens": [100, 10, 5]}).write_csv(path)
    trace = read_trace(path)
    assert trace.content is not None and trace.content[2][:2] == (trace.content[0][0], output_segment(0, 100))
    result = simulate(RunConfig(policy="chunked", trace=str(path)))
    assert result.requests.cached_tokens.tolist() == [0, 0, 399 // 16 * 16]


@needs_mooncake
def test_mooncake_replay_caching_on_and_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first 300 requests at a fifth of their pace (a load one H100 keeps up with): every prompt
    starts with the same block, and some continue a conversation; caching skips that prefill, so
    TTFT is lower with it on, and the hit rate is printed."""
    args = ["--policy", "chunked", "--trace", str(MOONCAKE), "--num-requests", "300", "--trace-speed", "0.2",
            "--no-tokens", "--quiet"]
    summaries = {}
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        out = tmp_path / flag
        code, stdout, _ = simulate_cli([*args, flag, "--out", str(out)], capsys)
        assert code == 0
        summaries[flag] = json.loads((out / "summary.json").read_text())["summary"]
        assert ("prefix cache hit rate" in stdout) is (flag == "--enable-prefix-caching")
    on, off = summaries["--enable-prefix-caching"], summaries["--no-enable-prefix-caching"]
    assert on["prefix_cache_hit_rate"] > 0.03 and off["prefix_cache_hit_rate"] is None
    assert on["mean_ttft"] < off["mean_ttft"] and on["median_ttft"] < off["median_ttft"]
    assert on["completed"] == off["completed"] == 300


@needs_mooncake
def test_mooncake_hits_never_exceed_an_infinite_cache() -> None:
    """Hits are bounded by what an unbounded cache would find: the longest prefix of ids seen
    before, in 512-token blocks (less the last token)."""
    trace = read_trace(MOONCAKE, limit=300)
    result = simulate(RunConfig(policy="chunked", trace=str(MOONCAKE), num_requests=300, trace_speed=0.2))
    summary = summarize(result, build_tables(result, tokens=False))
    records = [json.loads(line) for line in MOONCAKE.read_text().splitlines()[:300]]
    seen: set[tuple[int, ...]] = set()
    bound = 0
    for record in records:
        ids = record["hash_ids"]
        k = 0
        while k < len(ids) and tuple(ids[:k + 1]) in seen:
            k += 1
        bound += min(512 * k, record["input_length"] - 1)
        seen.update(tuple(ids[:j + 1]) for j in range(len(ids)))
    assert summary["preemptions"] == 0
    assert 0 < summary["prefix_cache_hit_tokens"] <= bound
    assert summary["prefix_cache_queried_tokens"] == int(np.sum(trace.prompt_tokens))
