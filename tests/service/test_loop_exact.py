"""A minimal speculative loop over the two real services reproduces target-only greedy."""

from __future__ import annotations

import threading

import pytest

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.sampling import SamplingParams
from specdec.verify import TokenKind
from tests.service.conftest import evict_at

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42]]
GREEDY = SamplingParams()


@pytest.fixture()
def loop(draft_client, target_client):
    return SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False))


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_speculative_equals_target_only(loop, prompt, k):
    baseline = loop.generate(prompt, 48, GREEDY, num_draft_tokens=0)
    assert set(baseline.kinds) == {TokenKind.TARGET}
    result = loop.generate(prompt, 48, GREEDY, num_draft_tokens=k)
    assert result.token_ids == baseline.token_ids
    assert len(result.token_ids) == 48 and result.finish_reason == "length"
    stats = result.stats
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # the tiny draft half agrees
    assert stats.rounds < 48  # speculation saved target passes
    assert sum(stats.accepted_per_position) == stats.accepted_tokens
    assert result.kinds.count(TokenKind.ACCEPTED) == stats.accepted_tokens


def test_sessions_are_released(loop, draft_server, target_server):
    import time

    loop.generate([9, 8, 7], 12, GREEDY, num_draft_tokens=3)
    # A called-off pre-draft still finishing its step frees its session when it returns
    # (SessionStore.release on a busy session): give it that moment, no more.
    deadline = time.monotonic() + 5
    while len(draft_server[1].model.store) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(draft_server[1].model.store) == 0
    assert len(target_server[1].model.store) == 0


def test_eos_stops_generation(loop):
    baseline = loop.generate([1, 2, 3], 30, GREEDY, num_draft_tokens=0)
    eos = baseline.token_ids[10]
    first = baseline.token_ids.index(eos)
    result = loop.generate([1, 2, 3], 30, GREEDY, num_draft_tokens=4, eos_token_ids=[eos])
    assert result.finish_reason == "eos"
    assert result.token_ids == baseline.token_ids[: first + 1]


def test_lost_sessions_resync_without_changing_output(loop, draft_server, target_server):
    """Evicting both sessions mid-generation costs a re-prefill, never a different token."""
    prompt = [5, 6, 7, 8]
    baseline = loop.generate(prompt, 40, GREEDY, num_draft_tokens=0)
    evict = evict_at((2, 5), draft_server, target_server)
    result = loop.generate(prompt, 40, GREEDY, num_draft_tokens=4, on_tokens=evict)
    assert result.token_ids == baseline.token_ids
    assert result.stats.resyncs >= 4


def test_concurrent_generations_do_not_disturb_each_other(loop):
    expected = {i: loop.generate(p, 32, GREEDY, 0).token_ids for i, p in enumerate(PROMPTS)}
    jobs = list(enumerate(PROMPTS)) * 2
    got: list[tuple[int, list[int]]] = []

    def run(i, prompt):
        got.append((i, loop.generate(prompt, 32, GREEDY, num_draft_tokens=4).token_ids))

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == len(jobs)
    for i, ids in got:
        assert ids == expected[i]
