"""Pipelined drafting: the draft works on round r+1 while the target verifies round r.

Only verification decides tokens, and the draft is deterministic given its prefix, so a
pipelined generation must emit exactly what the sequential one emits, greedy or sampled.
"""

from __future__ import annotations

import pytest

from coordinator.loop import LoopStats, SpeculativeLoop
from specdec.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42]]


@pytest.fixture()
def loops(draft_client, target_client):
    return (SpeculativeLoop(draft_client, target_client),
            SpeculativeLoop(draft_client, target_client, pipeline=True))


def run(loop, prompt, params, k, n=48):
    stats = LoopStats()
    ids = [t for out in loop.rounds(prompt, n, params, k, stats=stats) for t in out.tokens]
    return ids, stats


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 4])
def test_pipelined_greedy_equals_target_only(loops, prompt, k, draft_server):
    sequential, pipelined = loops
    base, _ = run(sequential, prompt, SamplingParams(), 0)
    ids, stats = run(pipelined, prompt, SamplingParams(), k)
    assert ids == base
    assert stats.pipelined_rounds > 0  # some pre-drafts were used...
    assert stats.predrafts_wasted > 0  # ...and some thrown away (the tiny draft errs)
    # Every round but the first consumed or discarded exactly one pre-draft.
    assert stats.pipelined_rounds + stats.predrafts_wasted == stats.rounds
    assert len(draft_server[1].model.store) == 0  # sessions released after the last one


@pytest.mark.parametrize("seed", range(6))
def test_pipelined_sampled_output_is_the_sequential_output(loops, seed):
    sequential, pipelined = loops
    params = SamplingParams(temperature=1.0, top_k=8, seed=seed)
    a, sa = run(sequential, PROMPTS[seed % 3], params, 3)
    b, sb = run(pipelined, PROMPTS[seed % 3], params, 3)
    assert a == b
    assert (sa.rounds, sa.accepted_tokens) == (sb.rounds, sb.accepted_tokens)
