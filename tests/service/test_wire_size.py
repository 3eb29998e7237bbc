"""Few bytes on the wire: replies stay small, greedy replies carry no distributions."""

from __future__ import annotations

import uuid

from specdec.v1 import common_pb2
from tests.service.conftest import GREEDY, propose_req, verify_req

PROMPT = [12, 34, 56, 78, 90]
SAMPLED = common_pb2.SamplingParams(temperature=1.5, seed=3)  # flat: q fills all top_n slots


def test_sampled_k4_top_n64_replies_under_2kb(draft_stub, target_stub):
    s = uuid.uuid4().hex
    proposal = draft_stub.Propose(propose_req(s, PROMPT, k=4, sampling=SAMPLED, top_n=64))
    assert len(proposal.dists) == 4
    assert all(len(d.token_ids) == 64 for d in proposal.dists)
    assert proposal.ByteSize() < 2048, proposal.ByteSize()
    verdict = target_stub.Verify(verify_req(s, PROMPT + list(proposal.tokens), num_draft=4,
                                            dists=proposal.dists, sampling=SAMPLED))
    assert len(verdict.target_probs) == len(verdict.recovered_tokens) == 4
    assert verdict.ByteSize() < 2048, verdict.ByteSize()


def test_greedy_replies_carry_no_distributions(draft_stub, target_stub):
    s = uuid.uuid4().hex
    proposal = draft_stub.Propose(propose_req(s, PROMPT, k=4, sampling=GREEDY))
    assert len(proposal.dists) == 0
    assert proposal.ByteSize() < 64
    verdict = target_stub.Verify(verify_req(s, PROMPT + list(proposal.tokens), num_draft=4))
    assert set(verdict.target_probs) <= {0.0, 1.0}
    assert verdict.ByteSize() < 64
