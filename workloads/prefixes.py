"""Prefix identity of prompts: each prompt as segments (segment id, tokens), for the prefix cache.

Tokens of equal segments at equal offsets are equal tokens (`simulator.engine.kv` hashes blocks of them).
Segment ids are integers in separate ranges per kind, so a shared prefix never equals a question:
shared prefixes (`--prefix-len`), unique prompt tokens, a trace's 512-token blocks (Mooncake
`hash_ids`) and output tokens (each request's answer, which a conversation's next turn repeats).
"""

from __future__ import annotations

import numpy as np

Content = tuple[tuple[int, int], ...]
"""One prompt's (segment id, tokens) pieces, in order."""

_KIND = 1 << 40
SHARED_PREFIX, UNIQUE, TRACE_BLOCK, OUTPUT = (kind * _KIND for kind in range(1, 5))
TRACE_BLOCK_TOKENS = 512
"""Tokens per Mooncake hash id."""


def shared_prefix_content(question_tokens: np.ndarray, prefix_len: int, num_prefixes: int,
                          rng: np.random.Generator) -> tuple[np.ndarray, tuple[Content, ...]]:
    """Each prompt one of `num_prefixes` shared `prefix_len`-token prefixes (uniform by `rng`) and
    then its own `question_tokens`: the prompts' lengths and content."""
    choice = rng.integers(0, num_prefixes, len(question_tokens)).tolist()
    content = tuple(((SHARED_PREFIX + k, prefix_len), (UNIQUE + i, q))
                    for i, (k, q) in enumerate(zip(choice, question_tokens.tolist(), strict=True)))
    return question_tokens + prefix_len, content


def output_segment(index: int, output_tokens: int) -> tuple[int, int]:
    """The answer of the workload's request `index`."""
    return (OUTPUT + index, output_tokens)


def request_content(contents: tuple[Content, ...] | None, index: int, output_tokens: int) -> Content | None:
    """What request `index` computes, prompt then answer (None for a workload without prefix identity)."""
    return None if contents is None else (*contents[index], output_segment(index, output_tokens))


def trace_block_content(hash_ids: list[int], prompt_tokens: int) -> Content:
    """A Mooncake prompt: one segment per 512-token block id, the last one holding the rest."""
    last = prompt_tokens - TRACE_BLOCK_TOKENS * (len(hash_ids) - 1)
    return tuple((TRACE_BLOCK + h, TRACE_BLOCK_TOKENS if i < len(hash_ids) - 1 else last)
                 for i, h in enumerate(hash_ids))


def leading(content: Content, tokens: int) -> Content:
    """The first `tokens` tokens of `content`."""
    kept: list[tuple[int, int]] = []
    for segment, length in content:
        if tokens <= 0:
            break
        kept.append((segment, min(length, tokens)))
        tokens -= length
    return tuple(kept)


def session_content(sessions: list[object], prompt_tokens: list[int], output_tokens: list[int]) -> tuple[Content, ...]:
    """Requests in arrival order, grouped by session: each prompt starts with as much of its
    session's previous turn (that turn's prompt, then its answer) as it is long; the rest is its own."""
    previous: dict[object, Content] = {}
    contents = []
    for i, (session, prompt, output) in enumerate(zip(sessions, prompt_tokens, output_tokens, strict=True)):
        history = leading(previous.get(session, ()), prompt)
        own = prompt - sum(length for _, length in history)
        content = history + (((UNIQUE + i, own),) if own else ())
        contents.append(content)
        previous[session] = (*content, output_segment(i, output))
    return tuple(contents)
