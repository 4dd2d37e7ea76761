"""Each policy's semantics on tiny scenarios computed by hand.

The cost model is replaced by one that charges exactly 1 s per step and records what it was asked
to cost, so every timestamp below is a step count that can be checked on paper.
"""

from __future__ import annotations

import pytest
from helpers import run, token_times

from simulator.errors import InputError
from simulator.metrics.summary import build_tables


def test_static_holds_finished_rows_and_admits_nobody_mid_batch() -> None:
    # A (10 prompt, 2 out) and B (20, 5) form a batch at t=0; C arrives at 0.5 and must wait until
    # the batch's longest member B is done at t=5, although A finished at t=2.
    result, cost = run("static", [0.0, 0.0, 0.5], [10, 20, 5], [2, 5, 1], max_batch_size=2, block_size=16)
    a, b, c = result.requests
    assert token_times(result, 0) == [1.0, 2.0]
    assert token_times(result, 1) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert (a.finish, b.finish) == (2.0, 5.0)
    assert c.scheduled == 5.0 and c.finish == 6.0
    # The prefill is padded to the longest prompt: 2 rows of 20 tokens, not 10 + 20.
    assert cost.shapes[0].prefill_tokens == 40
    # After A finished it is still a row of every decode step (padding) ...
    assert [s.num_seqs for s in cost.shapes] == [2, 2, 2, 2, 2, 1]
    steps = build_tables(result).steps
    assert steps["num_seqs"].to_list() == [2, 2, 1, 1, 1, 1]
    assert steps["padded_tokens"].to_list() == [10, 0, 1, 1, 1, 0]
    # ... and its KV, reserved in full (20 + 5 tokens = 2 blocks a row), is held until B is done.
    assert steps["kv_blocks_used"].to_list() == [4, 4, 4, 4, 0, 0]


def test_static_waits_for_the_batch_to_fill_at_most_max_queue_delay() -> None:
    # With room for 3 and a 2 s delay, the two early requests start at 0.2 + 2 = 2.2 and the late
    # one, alone, at 5 + 2.
    result, _ = run("static", [0.2, 1.0, 5.0], [4, 4, 4], [1, 1, 1], max_batch_size=3, max_queue_delay=2.0)
    assert [r.scheduled for r in result.requests] == [2.2, 2.2, 7.0]
    # A full batch does not wait.
    result, _ = run("static", [0.0, 0.1], [4, 4], [1, 1], max_batch_size=2, max_queue_delay=10.0)
    assert [r.scheduled for r in result.requests] == [0.1, 0.1]


def test_continuous_runs_prefill_only_and_decode_only_steps() -> None:
    # A (4 prompt, 3 out) at 0; B (6, 2) arrives at 1.5, mid-step. Step 2 prefills B alone, so A's
    # third token waits: a prefill stall of 2 s between A's tokens 2 and 3.
    result, _ = run("continuous", [0.0, 1.5], [4, 6], [3, 2])
    steps = build_tables(result).steps
    assert steps["prefill_tokens"].to_list() == [4, 0, 6, 0]
    assert steps["decode_tokens"].to_list() == [0, 1, 0, 2]
    assert token_times(result, 0) == [1.0, 2.0, 4.0]
    assert token_times(result, 1) == [3.0, 4.0]
    assert result.requests[1].scheduled == 2.0


def test_chunked_keeps_its_budget_and_spreads_a_long_prompt_over_steps() -> None:
    # Budget 8. A (2, 6) decodes every step while B's 20-token prompt goes in chunks 7, 7, 6.
    result, cost = run("chunked", [0.0, 0.5], [2, 20], [6, 2], max_num_batched_tokens=8,
                      max_num_seqs=8)
    steps = build_tables(result).steps
    assert (steps["prefill_tokens"] + steps["decode_tokens"]).max() <= 8
    assert steps["prefill_tokens"].to_list() == [2, 7, 7, 6, 0, 0]
    assert steps["decode_tokens"].to_list() == [0, 1, 1, 1, 2, 1]
    assert token_times(result, 0) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # no stall for A
    assert token_times(result, 1) == [4.0, 5.0]
    # B's chunks attend to what came before: context after each chunk is 7, 14, 20.
    assert [s.prefill_context for s in cost.shapes[1:4]] == [7, 14, 20]


def test_chunked_long_prefill_threshold_caps_each_chunk() -> None:
    result, _ = run("chunked", [0.0], [20], [1], max_num_batched_tokens=64, max_num_seqs=64,
                   long_prefill_token_threshold=8)
    assert build_tables(result).steps["prefill_tokens"].to_list() == [8, 8, 4]


def test_preemption_by_recompute_when_kv_is_short() -> None:
    # 4 blocks of 4 tokens. A and B (4 prompt, 6 out each) both fit at first; when both need a third
    # block at step 5, B (admitted last) is preempted, loses its KV, and later recomputes its
    # prompt plus the 5 tokens it had emitted, which emits its sixth token.
    result, cost = run("continuous", [0.0, 0.0], [4, 4], [6, 6], block_size=4, num_gpu_blocks_override=4)
    a, b = result.requests
    steps = build_tables(result).steps
    assert steps["num_preempted"].to_list() == [0, 0, 0, 0, 0, 1, 0]
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert token_times(result, 0) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert token_times(result, 1) == [1.0, 2.0, 3.0, 4.0, 5.0, 7.0]
    assert cost.shapes[6].prefill_tokens == 4 + 5
    assert steps["kv_blocks_used"].max() <= 4
    assert b.emitted == b.output_tokens


def test_a_budget_below_a_recompute_is_refused_at_the_start() -> None:
    # Same squeeze, but without chunking B's recompute (4 prompt + 5 emitted = 9 tokens) would exceed
    # the 8-token budget, so nothing could ever run it again: refused before the run, not stalled in it.
    with pytest.raises(InputError, match=r"recompute 9 tokens after a preemption \(4 prompt \+ 5 emitted\)"):
        run("continuous", [0.0, 0.0], [4, 4], [6, 6], block_size=4, num_gpu_blocks_override=4,
            max_num_batched_tokens=8, max_num_seqs=2)


def test_max_num_seqs_limits_admission() -> None:
    result, _ = run("chunked", [0.0, 0.0, 0.0], [2, 2, 2], [3, 3, 3], max_num_seqs=2)
    assert build_tables(result).steps["num_seqs"].max() == 2
    assert result.requests[2].scheduled == 3.0  # after A and B finished their three tokens
