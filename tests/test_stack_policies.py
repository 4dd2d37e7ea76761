"""SGLang's prefill-first and TensorRT-LLM's in-flight policies keep every invariant of a run
(`test_properties.check_invariants`: tokens emitted once and in order, KV and batch limits, work
conserved) on the hypothesis workloads of the policies they derive from."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import SETTINGS, cases, check_invariants, run


@pytest.mark.parametrize(("policy", "like"), [("prefill-first", "chunked"), ("inflight", "continuous")])
@settings(SETTINGS, max_examples=120)
@given(data=st.data())
def test_stack_policies_keep_the_invariants(policy: str, like: str, data: st.DataObject) -> None:
    # `like`'s cases fit `policy`'s settings: the chunked budgets for prefill-first; for in-flight,
    # which computes a prompt whole, continuous batching's (a budget that holds a recomputed request).
    case = data.draw(cases(like))
    case = replace(case, config=replace(case.config, policy=policy))
    check_invariants(case, *run(case))
