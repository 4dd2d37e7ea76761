"""Multi-turn conversations: sessions of `turns` requests, each turn's prompt the whole conversation
so far (every earlier question and answer) and then a new question.

The workload's requests are session-major (request i is turn i mod turns of session i // turns) and
their lengths are known up front: turn k's prompt is the sum of questions and answers before it plus
its own question. Only the arrivals of later turns are decided while the run goes (the engine sends
turn k + 1 `think_time` seconds after turn k's last token, `simulator.run.sessions`); `arrival` holds,
for every turn of an open-loop session, the session's start.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from workloads.prefixes import UNIQUE, Content, output_segment
from workloads.workload import Workload


def conversations(questions: Workload, turns: int, think_time: float) -> Workload:
    """`questions` (each request's own question and answer lengths, its prefix identity if any: a
    shared prefix then its own question; one arrival per session in its first `ceil(n / turns)`
    entries) as sessions of `turns` turns."""
    n = questions.num_requests
    asked = questions.prompt_tokens.tolist()
    answered = questions.output_tokens.tolist()
    prompts: list[int] = []
    contents: list[Content] = []
    for i in range(n):
        own = questions.content[i] if questions.content is not None else ((UNIQUE + i, asked[i]),)
        if i % turns:
            own = own[-1:]  # a shared prefix (a system prompt) opens the session only
            history = (*contents[-1], output_segment(i - 1, answered[i - 1]))
            prompts.append(prompts[-1] + answered[i - 1] + own[0][1])
        else:
            history = ()
            prompts.append(asked[i])
        contents.append((*history, *own))
    arrival = None
    if questions.arrival is not None:
        arrival = np.repeat(questions.arrival[: -(-n // turns)], turns)[:n]
    return replace(questions, prompt_tokens=np.array(prompts, dtype=np.int64), arrival=arrival,
                   content=tuple(contents), turns=turns, think_time=think_time)
