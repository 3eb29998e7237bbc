"""The wire of contrastive decoding on the real servers: Verify's contrastive option (V_head
with the expert's values) and the draft's Score (the amateur's values on those ids), their
cache-sync behaviour, their answers whatever logits happen to be kept, and their
statuses for bad input."""

from __future__ import annotations

import math
import uuid

import grpc
import pytest
import torch

from specdec import digest, wire
from specdec.contrastive import ContrastiveParams, amateur_values, head
from specdec.sampling import Q_TOTAL
from specdec.v1 import common_pb2, draft_pb2
from tests.service.conftest import GREEDY, SAMPLED, propose_req, verify_req
from tests.service.test_status_codes import assert_status

PROMPT = [11, 22, 33, 44, 55]
LI = common_pb2.ContrastiveParams(formulation=common_pb2.CONTRASTIVE_FORMULATION_LI,
                                  amateur_temperature=0.5)
OBRIEN = common_pb2.ContrastiveParams()  # the defaults: alpha 0.1, beta 0.5


CREATED: list[str] = []


def sid() -> str:
    CREATED.append(uuid.uuid4().hex)
    return CREATED[-1]


@pytest.fixture(autouse=True)
def release_sessions(draft_stub, target_stub):
    """The servers are shared with later tests, which count sessions: free every one."""
    yield
    while CREATED:
        session_id = CREATED.pop()
        for stub in (draft_stub, target_stub):
            stub.Release(common_pb2.ReleaseRequest(session_id=session_id))


def score_req(session_id, new_tokens, heads, keep_len=0, prefix=(), contrastive=OBRIEN):
    return draft_pb2.ScoreRequest(
        session_id=session_id, keep_len=keep_len, keep_digest=digest.digest(prefix[:keep_len]),
        new_tokens=new_tokens, contrastive=contrastive,
        heads=[common_pb2.HeadValues(token_ids=ids) for ids in heads])


def full_logits(engine, ids) -> torch.Tensor:
    """The model's logits after each of `ids`, from one fresh forward (no session)."""
    backend = engine.model.backend
    return backend.forward(backend.new_cache(), list(ids), keep_last=len(ids)).float()


def test_verify_returns_v_head_at_every_position(target_stub, target_server):
    drafts = [7, 8, 9]
    req = verify_req(sid(), PROMPT + drafts, num_draft=3)
    req.contrastive.CopyFrom(LI)
    resp = target_stub.Verify(req)
    assert len(resp.heads) == 4 and not resp.target_probs and resp.cached_len == 8
    rows = full_logits(target_server[1], PROMPT + drafts)[-4:]
    params = ContrastiveParams(alpha=0.1, amateur_temperature=0.5, formulation="li")
    for h, row in zip(resp.heads, rows, strict=True):
        want = head(row, params)
        assert list(h.token_ids) == want.token_ids.tolist()  # ascending, all of V_head
        assert torch.allclose(torch.tensor(list(h.values)), want.values, atol=1e-4)
        assert all(v <= 0 for v in h.values)  # log-probabilities


def test_score_after_propose_uses_kept_logits_and_equals_a_fresh_forward(draft_stub,
                                                                         draft_server):
    """Propose keeps its rows; a feed-only Score adds the row after x_K; a look-up Score
    (no new tokens) answers from them, equal to a fresh forward over the sequence."""
    engine = draft_server[1]
    s = sid()
    req = propose_req(s, PROMPT, k=3)
    req.keep_logits = True
    drafts = list(draft_stub.Propose(req).tokens)
    seq = PROMPT + drafts
    fed = draft_stub.Score(score_req(s, [drafts[-1]], [], keep_len=len(seq) - 1, prefix=seq))
    assert fed.cached_len == len(seq) and not fed.values
    heads = [[1, 5, 700], [2], [3, 4], [9, 10, 11, 12]]
    resp = draft_stub.Score(score_req(s, [], heads, keep_len=len(seq), prefix=seq))
    assert resp.cached_len == len(seq)
    rows = full_logits(engine, seq)[-4:]
    for ids, v, row in zip(heads, resp.values, rows, strict=True):
        want = amateur_values(row, torch.tensor(ids), ContrastiveParams())
        assert torch.allclose(torch.tensor(list(v.values)), want, atol=1e-4)


def test_score_recomputes_rows_it_did_not_keep(draft_stub, draft_server):
    """A Propose without keep_logits keeps nothing: Score still answers, exactly."""
    s = sid()
    drafts = list(draft_stub.Propose(propose_req(s, PROMPT, k=4)).tokens)
    seq = PROMPT + drafts
    heads = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    resp = draft_stub.Score(score_req(s, [drafts[-1]], heads, keep_len=len(seq) - 1,
                                      prefix=seq, contrastive=LI))
    rows = full_logits(draft_server[1], seq)[-5:]
    params = ContrastiveParams(amateur_temperature=0.5, formulation="li")
    for ids, v, row in zip(heads, resp.values, rows, strict=True):
        want = amateur_values(row, torch.tensor(ids), params)
        assert torch.allclose(torch.tensor(list(v.values)), want, atol=1e-4)
        # Li et al.: normalised over the whole vocabulary at the amateur's temperature.
        assert all(x < 0 for x in v.values)
    assert math.isclose(sum(math.exp(x) for x in
                            amateur_values(rows[0], torch.arange(768), params).tolist()), 1,
                        rel_tol=1e-4)


def test_score_keeps_the_cache_sync_rule(draft_stub):
    s = sid()
    draft_stub.Score(score_req(s, PROMPT, [[1]]))
    assert_status(lambda: draft_stub.Score(score_req(s, [], [[1]], keep_len=5, prefix=[9] * 5)),
                  grpc.StatusCode.FAILED_PRECONDITION, "digest")
    assert_status(lambda: draft_stub.Score(score_req(sid(), [], [[1]], keep_len=3,
                                                     prefix=PROMPT)),
                  grpc.StatusCode.NOT_FOUND, "keep_len = 0")
    # The session is unharmed by the refused requests.
    ok = draft_stub.Score(score_req(s, [], [[1, 2]], keep_len=5, prefix=PROMPT))
    assert ok.cached_len == 5 and len(ok.values[0].values) == 2


def test_bad_score_requests_get_invalid_argument(draft_stub):
    bad = common_pb2.ContrastiveParams(alpha=0.0)
    cases = [
        (score_req(sid(), PROMPT, [[]]), "heads[0].token_ids must not be empty"),
        (score_req(sid(), PROMPT, [[1, 1]]), "duplicates"),
        (score_req(sid(), PROMPT, [[10**6]]), "outside the vocabulary"),
        (score_req(sid(), list(range(1, 60)), [[1]] * 50), "at most"),
        (score_req(sid(), [1, 2], [[1]] * 3), "positions before the first token"),
        (score_req(sid(), [], [[1]]), "nothing to score"),
        (score_req(sid(), PROMPT, [[1]], contrastive=bad), "alpha must be in (0, 1]"),
        (score_req(sid(), PROMPT, [[1]], contrastive=common_pb2.ContrastiveParams(
            formulation=7)), "formulation"),
    ]
    for req, fragment in cases:
        assert_status(lambda r=req: draft_stub.Score(r), grpc.StatusCode.INVALID_ARGUMENT,
                      fragment)


def test_bad_contrastive_verify_gets_invalid_argument(target_stub, draft_stub):
    s = sid()
    proposal = draft_stub.Propose(propose_req(s, PROMPT, k=2, sampling=SAMPLED))
    req = verify_req(sid(), PROMPT + list(proposal.tokens), num_draft=2,
                     dists=proposal.dists, sampling=SAMPLED)
    req.contrastive.CopyFrom(OBRIEN)
    assert_status(lambda: target_stub.Verify(req), grpc.StatusCode.INVALID_ARGUMENT,
                  "draft_dists must be empty with contrastive")
    req = verify_req(sid(), PROMPT, sampling=GREEDY)
    req.contrastive.beta = -1.0
    assert_status(lambda: target_stub.Verify(req), grpc.StatusCode.INVALID_ARGUMENT,
                  "beta must be a finite number >= 0")


def test_propose_min_p_keeps_the_amateurs_plausible_set(draft_stub):
    """min_p cuts each q to {x : q(x) >= min_p * max q}, renormalised: the dists sent
    are exactly what was sampled from."""
    plain = draft_stub.Propose(propose_req(sid(), PROMPT, k=3, sampling=SAMPLED))
    req = propose_req(sid(), PROMPT, k=3, sampling=SAMPLED)
    req.min_p = 0.1
    cut = draft_stub.Propose(req)
    for d, full in zip(cut.dists, plain.dists, strict=False):
        counts = list(d.counts)  # quantised after the cut: each within a count of it
        assert min(counts) >= 0.1 * max(counts) - 2 and sum(counts) == Q_TOTAL
        assert len(counts) < len(full.counts)
    for i, (x, d) in enumerate(zip(cut.tokens, cut.dists, strict=True)):
        assert wire.dist_from_proto(d).prob_of(x) > 0, i
    req.min_p = 1.5
    assert_status(lambda: draft_stub.Propose(req), grpc.StatusCode.INVALID_ARGUMENT,
                  "min_p must be in [0, 1]")
