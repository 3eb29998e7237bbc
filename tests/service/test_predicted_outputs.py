"""Predicted Outputs over the real services: a prediction equal to the answer is
accepted almost whole, an edited one leaves the output unchanged (and has rejections),
and the output is the target's whatever the prediction says, greedy or with a draft
model beside it."""

from __future__ import annotations

import pytest

from coordinator.loop import LoopStats, SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.sampling import SamplingParams

PROMPT = [31, 415, 92, 65, 7, 300]
N = 48
GREEDY = SamplingParams(prompt_len=len(PROMPT))


def run(loop, prediction=(), k=4):
    stats, tokens = LoopStats(), []
    for out in loop.rounds(PROMPT, N, GREEDY, k, stats=stats, prediction=prediction):
        tokens += out.tokens
    return tokens, stats


@pytest.fixture(params=["hybrid", "lookup"])
def loop(request, draft_client, target_client):
    draft = draft_client if request.param == "hybrid" else None  # lookup: no draft model
    return SpeculativeLoop(draft, target_client, LoopPolicy(drafter=request.param))


def test_a_prediction_equal_to_the_answer_is_accepted(loop):
    answer, _ = run(loop, k=0)
    tokens, stats = run(loop, answer)
    assert tokens == answer
    assert stats.prediction_tokens == N
    assert stats.prediction_accepted_tokens >= 0.8 * N - 2  # the first round may be a model one
    assert stats.rounds <= N // 4  # long runs of predicted drafts per round


def test_an_edited_prediction_changes_nothing_but_the_counts(loop):
    answer, _ = run(loop, k=0)
    edited = answer[:10] + [5, 6, 7] + answer[10:20] + answer[25:]  # insert, then delete
    tokens, stats = run(loop, edited)
    assert tokens == answer
    assert stats.prediction_drafted_tokens > stats.prediction_accepted_tokens > 20
    unrelated, stats = run(loop, list(range(100, 160)))
    assert unrelated == answer


def test_without_a_prediction_its_counts_are_zero(loop):
    _, stats = run(loop)
    assert (stats.prediction_tokens, stats.prediction_drafted_tokens,
            stats.prediction_accepted_tokens) == (0, 0, 0)


def test_a_model_only_coordinator_still_drafts_from_a_prediction(draft_client, target_client):
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(drafter="model"))
    answer, _ = run(loop, k=0)
    tokens, stats = run(loop, answer)
    assert tokens == answer and stats.prediction_accepted_tokens > N // 2
