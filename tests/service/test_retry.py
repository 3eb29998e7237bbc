"""Every stateful call is safe to retry: same request, same state -> same answer."""

from __future__ import annotations

import uuid

from tests.service.conftest import SAMPLED, propose_req, verify_req

PROMPT = [101, 202, 303, 404]


def test_propose_retry_same_answer_and_state(draft_stub):
    s = uuid.uuid4().hex
    first = draft_stub.Propose(propose_req(s, PROMPT, k=4, sampling=SAMPLED))
    committed = PROMPT + list(first.tokens[:2])  # two drafts accepted, then a recovered one
    committed.append(5)
    keep = len(PROMPT) + 2  # the cache holds PROMPT + x1..x3: common prefix with committed
    req = propose_req(s, committed[keep:], keep_len=keep, prefix=committed, k=4,
                      sampling=SAMPLED)
    a = draft_stub.Propose(req)
    b = draft_stub.Propose(req)  # e.g. the first reply was lost
    assert list(a.tokens) == list(b.tokens)
    assert len(a.dists) == 4 and list(a.dists) == list(b.dists)  # the same ids and counts
    assert a.cached_len == b.cached_len == len(committed) + 3


def test_verify_retry_same_answer_and_state(target_stub, draft_stub):
    s = uuid.uuid4().hex
    proposal = draft_stub.Propose(propose_req(s, PROMPT, k=3, sampling=SAMPLED))
    req = verify_req(s, PROMPT + list(proposal.tokens), num_draft=3, dists=proposal.dists,
                     sampling=SAMPLED, round_seed=99)
    a = target_stub.Verify(req)
    b = target_stub.Verify(req)
    for response in (a, b):  # how long the pass took is a measurement, not an answer
        assert response.pass_sessions >= 1 and response.pass_seconds > 0
        response.ClearField("pass_seconds")
    assert a == b
    assert a.cached_len == len(PROMPT) + 3
    # Different round seeds draw recovered/bonus tokens independently (not a constant).
    bonuses = {target_stub.Verify(verify_req(s, PROMPT + list(proposal.tokens), num_draft=3,
                                             dists=proposal.dists, sampling=SAMPLED,
                                             round_seed=seed)).bonus_token
               for seed in range(12)}
    assert len(bonuses) > 1
