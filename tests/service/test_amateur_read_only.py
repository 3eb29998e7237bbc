"""The read-only Score of pipelined contrastive rounds, on the real draft server: it looks
rows up at a prefix of what the session holds without cropping or feeding, reads them
beside a request that holds the session, waits for that request when the rows are not
there yet, answers exactly what a fresh forward gives, and names the token drawn after
the prefix (a pre-draft's guess at the bonus)."""

from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest
import torch

from specdec import digest
from specdec.contrastive import ContrastiveParams, amateur_values
from specdec.v1 import common_pb2, draft_pb2
from tests.service.conftest import propose_req
from tests.service.test_status_codes import assert_status

PROMPT = [11, 22, 33, 44, 55]
HEADS = [[1, 5, 700], [2], [3, 4]]
CREATED: list[str] = []


def sid() -> str:
    CREATED.append(uuid.uuid4().hex)
    return CREATED[-1]


@pytest.fixture(autouse=True)
def release_sessions(draft_stub):
    """The server is shared with later tests, which count sessions: free every one."""
    yield
    while CREATED:
        draft_stub.Release(common_pb2.ReleaseRequest(session_id=CREATED.pop()))


def read_only(session_id, seq, heads=HEADS, new_tokens=()):
    return draft_pb2.ScoreRequest(session_id=session_id, keep_len=len(seq),
                                  keep_digest=digest.digest(seq), new_tokens=new_tokens,
                                  heads=[common_pb2.HeadValues(token_ids=h) for h in heads],
                                  read_only=True)


def propose(draft_stub, session_id, k=4, keep_logits=True) -> list[int]:
    """PROMPT + K drafts proposed; the session then holds PROMPT + the first K - 1."""
    req = propose_req(session_id, PROMPT, k=k)
    req.keep_logits = keep_logits
    return PROMPT + list(draft_stub.Propose(req).tokens)


def assert_exact(engine, seq, resp, heads=HEADS):
    backend = engine.model.backend
    rows = backend.forward(backend.new_cache(), list(seq), keep_last=len(seq)).float()
    rows = rows[-len(heads):]
    for ids, v, row in zip(heads, resp.values, rows, strict=True):
        want = amateur_values(row, torch.tensor(ids), ContrastiveParams())
        assert torch.allclose(torch.tensor(list(v.values)), want, atol=1e-4)


def held(engine, session_id) -> int:
    return engine.model.store.peek(session_id)[0].cached_len


@pytest.mark.parametrize("keep_logits", [True, False], ids=["kept", "recomputed"])
def test_a_read_only_score_at_a_prefix_changes_nothing(draft_stub, draft_server,
                                                         keep_logits):
    engine, s = draft_server[1], sid()
    seq = propose(draft_stub, s, keep_logits=keep_logits)  # the draft holds seq[:-1]
    prefix = seq[:-2]  # shorter than what the session holds
    resp = draft_stub.Score(read_only(s, prefix))
    assert_exact(engine, prefix, resp)
    assert held(engine, s) == len(seq) - 1  # nothing cropped
    assert resp.next_token == seq[-2]  # the token the session holds after the prefix
    # The rows it kept (or recomputed) stay: a later look-up agrees, and names the token
    # the Propose drew last and did not feed.
    again = draft_stub.Score(read_only(s, seq[:-1]))
    assert_exact(engine, seq[:-1], again)
    assert again.next_token == seq[-1]
    # An ordinary Score says nothing of the kind.
    plain = draft_stub.Score(draft_pb2.ScoreRequest(
        session_id=s, keep_len=len(seq) - 1, keep_digest=digest.digest(seq[:-1]),
        heads=[common_pb2.HeadValues(token_ids=[1])]))
    assert not plain.HasField("next_token")


def test_bad_read_only_requests_get_a_status_and_leave_the_session(draft_stub, draft_server):
    engine, s = draft_server[1], sid()
    seq = propose(draft_stub, s)
    assert_status(lambda: draft_stub.Score(read_only(s, seq[:-1], new_tokens=[seq[-1]])),
                  grpc.StatusCode.INVALID_ARGUMENT, "read_only: new_tokens must be empty")
    assert_status(lambda: draft_stub.Score(read_only(s, [9] * 6)),
                  grpc.StatusCode.FAILED_PRECONDITION, "digest")
    assert_status(lambda: draft_stub.Score(read_only(s, seq + [1, 2])),
                  grpc.StatusCode.FAILED_PRECONDITION, "fewer than keep_len")
    assert_status(lambda: draft_stub.Score(read_only(sid(), seq)),
                  grpc.StatusCode.NOT_FOUND, "keep_len = 0")
    assert held(engine, s) == len(seq) - 1


def hold(engine, session_id, prefix):
    """Check the session out as a request would (a pre-draft in flight); returns a
    function that puts it back."""
    store = engine.model.store
    session = store.checkout(session_id, len(prefix), digest.digest(prefix))
    return lambda: store.put_back(session)


def test_it_reads_beside_the_request_that_holds_the_session(draft_stub, draft_server):
    engine, s = draft_server[1], sid()
    seq = propose(draft_stub, s)
    put_back = hold(engine, s, seq[:-1])
    try:
        resp = draft_stub.Score(read_only(s, seq[:-1]), timeout=10)
        assert_exact(engine, seq[:-1], resp)
        assert resp.next_token == seq[-1]  # drawn by the request, not yet fed
    finally:
        put_back()


def test_it_waits_for_rows_a_busy_session_lacks(draft_stub, draft_server):
    """Rows not kept: the look-up waits for the request holding the session, then
    recomputes them; it neither fails nor answers early."""
    engine, s = draft_server[1], sid()
    seq = propose(draft_stub, s, keep_logits=False)
    put_back = hold(engine, s, seq[:-1])
    answered: list = []
    call = threading.Thread(target=lambda: answered.append(
        draft_stub.Score(read_only(s, seq[:-1]), timeout=20)))
    call.start()
    time.sleep(0.5)
    assert not answered  # still waiting beside the busy session
    put_back()
    call.join(20)
    assert answered and held(engine, s) == len(seq) - 1
    assert_exact(engine, seq[:-1], answered[0])
