"""ProposeBatch and VerifyBatch over gRPC: each item answers exactly as a call of its own
would, in one forward pass per position for all of them, and an item that fails (even
one that does not parse) never harms the others."""

from __future__ import annotations

import grpc
import pytest

from specdec import digest
from specdec.grpc_server import MAX_BATCH_ITEMS
from specdec.v1 import common_pb2, draft_pb2, target_pb2
from tests.service.conftest import SAMPLED, propose_req, verify_req

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
PREFIXES = [[31, 415, 92, 65], [7, 8, 9], [600, 1, 2, 3, 4, 5], [42]]


def release(stub, *sessions):
    for s in sessions:
        stub.Release(common_pb2.ReleaseRequest(session_id=s), timeout=30)


def test_propose_batch_items_equal_single_proposes(draft_stub):
    singles = [draft_stub.Propose(propose_req(f"pb-one-{i}", p, k=5), timeout=30)
               for i, p in enumerate(PREFIXES)]
    batch = draft_stub.ProposeBatch(draft_pb2.ProposeBatchRequest(items=[
        propose_req(f"pb-many-{i}", p, k=5) for i, p in enumerate(PREFIXES)]), timeout=30)
    release(draft_stub, *[f"pb-{w}-{i}" for w in ("one", "many") for i in range(4)])
    assert [item.WhichOneof("outcome") for item in batch.items] == ["result"] * 4
    for one, item in zip(singles, batch.items, strict=True):
        assert list(item.result.tokens) == list(one.tokens)
        assert item.result.cached_len == one.cached_len


def test_verify_batch_items_equal_single_verifies_sampled(target_stub):
    def req(name, i, p):
        return verify_req(f"vb-{name}-{i}", p, num_draft=1, sampling=SAMPLED,
                          dists=[common_pb2.SparseDist(token_ids=[p[-1]], probs=[1.0])],
                          round_seed=100 + i)

    singles = [target_stub.Verify(req("one", i, p), timeout=30)
               for i, p in enumerate(PREFIXES) if len(p) > 1]
    items = [req("many", i, p) for i, p in enumerate(PREFIXES) if len(p) > 1]
    batch = target_stub.VerifyBatch(target_pb2.VerifyBatchRequest(items=items), timeout=30)
    release(target_stub, *[f"vb-{w}-{i}" for w in ("one", "many") for i in range(4)])
    assert len(batch.items) == len(singles) == 3
    for one, item in zip(singles, batch.items, strict=True):
        r = item.result
        assert (list(r.recovered_tokens), r.bonus_token, r.cached_len) == \
            (list(one.recovered_tokens), one.bonus_token, one.cached_len)
        assert list(r.target_probs) == pytest.approx(list(one.target_probs), abs=1e-5)
    assert batch.items[0].result.pass_sessions == 3  # one pass for the three


def test_a_failing_item_gets_its_own_status_and_the_others_their_results(target_stub):
    good = verify_req("vb-good", [5, 6, 7])
    stale = verify_req("vb-stale", [9], keep_len=3, prefix=[1, 2, 3])  # never held
    bad_ids = verify_req("vb-bad", [5, 10_000])
    twice = verify_req("vb-good", [5, 6, 7])  # the same session again
    bad_dist = verify_req("vb-dist", [5, 6], num_draft=1, sampling=SAMPLED,
                          dists=[common_pb2.SparseDist(token_ids=[6, 7], probs=[1.0])])
    batch = target_stub.VerifyBatch(target_pb2.VerifyBatchRequest(
        items=[good, stale, bad_ids, twice, bad_dist]), timeout=30)
    release(target_stub, "vb-good")
    outcome = [item.WhichOneof("outcome") for item in batch.items]
    assert outcome == ["result", "error", "error", "error", "error"]
    assert batch.items[0].result.cached_len == 3
    stale_error = batch.items[1].error
    assert stale_error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert stale_error.HasField("cached_len") and stale_error.cached_len == 0
    assert batch.items[2].error.code == INVALID_ARGUMENT
    assert "outside the vocabulary" in batch.items[2].error.message
    assert batch.items[3].error.code == INVALID_ARGUMENT
    assert "twice" in batch.items[3].error.message
    assert batch.items[4].error.code == INVALID_ARGUMENT
    assert batch.items[4].error.message.startswith("items[4]: ")


def test_a_resync_item_carries_what_the_session_holds(draft_stub):
    first = draft_stub.ProposeBatch(draft_pb2.ProposeBatchRequest(
        items=[propose_req("pb-held", [3, 4, 5], k=2)]), timeout=30)
    held = first.items[0].result.cached_len
    wrong = propose_req("pb-held", [9], keep_len=3, keep_digest=digest.digest([3, 4, 6]))
    again = draft_stub.ProposeBatch(draft_pb2.ProposeBatchRequest(items=[wrong]), timeout=30)
    release(draft_stub, "pb-held")
    error = again.items[0].error
    assert error.code == FAILED_PRECONDITION and error.cached_len == held


def test_an_oversized_batch_is_refused_whole(draft_stub):
    items = [propose_req(f"pb-big-{i}", [1]) for i in range(MAX_BATCH_ITEMS + 1)]
    with pytest.raises(grpc.RpcError) as err:
        draft_stub.ProposeBatch(draft_pb2.ProposeBatchRequest(items=items), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "split it" in err.value.details()
