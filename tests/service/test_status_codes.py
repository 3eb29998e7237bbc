"""Bad input gets a clear status, and no session (the caller's or another's) is harmed."""

from __future__ import annotations

import uuid

import grpc
import pytest

from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from specdec import digest
from specdec.sampling import Q_TOTAL
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig
from tests.service.conftest import GREEDY, SAMPLED, propose_req, verify_req

PROMPT = [11, 22, 33, 44, 55]
VOCAB = 768


def sid() -> str:
    return uuid.uuid4().hex


def assert_status(call, code: grpc.StatusCode, *fragments: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    assert err.code() == code, (err.code(), err.details())
    for fragment in fragments:
        assert fragment in err.details(), err.details()
    return err


def trailing(err: grpc.RpcError, key: str) -> str | None:
    return dict(err.trailing_metadata() or ()).get(key)


# -- cache-sync errors ----------------------------------------------------------------


def test_unknown_session_with_keep_len_is_not_found(draft_stub, target_stub):
    assert_status(lambda: draft_stub.Propose(propose_req(sid(), [1], keep_len=3, prefix=PROMPT)),
                  grpc.StatusCode.NOT_FOUND, "keep_len = 0")
    assert_status(lambda: target_stub.Verify(verify_req(sid(), [1], keep_len=3, prefix=PROMPT)),
                  grpc.StatusCode.NOT_FOUND, "keep_len = 0")


@pytest.mark.parametrize("service", ["draft", "target"])
def test_keep_len_beyond_cache_and_digest_mismatch(service, draft_stub, target_stub):
    s = sid()
    if service == "draft":
        def call(**kw):
            return draft_stub.Propose(propose_req(s, k=2, **kw))
        held = len(PROMPT) + 1  # the prompt and one of the two drafts
    else:
        def call(**kw):
            return target_stub.Verify(verify_req(s, **kw))
        held = len(PROMPT)
    first = call(new_tokens=PROMPT)
    assert first.cached_len == held

    err = assert_status(lambda: call(new_tokens=[1], keep_len=held + 1,
                                     keep_digest=digest.digest(PROMPT)),
                        grpc.StatusCode.FAILED_PRECONDITION, f"holds {held} tokens")
    assert trailing(err, "specdec-cached-len") == str(held)

    wrong = digest.digest([9, 9, 9])
    err = assert_status(lambda: call(new_tokens=[1], keep_len=3, keep_digest=wrong),
                        grpc.StatusCode.FAILED_PRECONDITION, "digest")
    assert trailing(err, "specdec-cached-len") == str(held)

    # Nothing was harmed: the same session continues from its real prefix.
    again = call(new_tokens=PROMPT[3:], keep_len=3, prefix=PROMPT)
    assert again.cached_len == held


# -- INVALID_ARGUMENT -------------------------------------------------------------------

BAD_SAMPLING = [
    (common_pb2.SamplingParams(temperature=-0.5), "temperature"),
    (common_pb2.SamplingParams(temperature=float("nan")), "temperature"),
    (common_pb2.SamplingParams(temperature=float("inf")), "temperature"),
    (common_pb2.SamplingParams(temperature=1.0, top_p=1.5), "top_p"),
    (common_pb2.SamplingParams(temperature=1.0, top_p=-0.1), "top_p"),
    (common_pb2.SamplingParams(temperature=1.0, top_k=-1), "top_k"),
]


@pytest.mark.parametrize(("sampling", "field"), BAD_SAMPLING)
def test_bad_sampling_params(sampling, field, draft_stub, target_stub):
    assert_status(lambda: draft_stub.Propose(propose_req(sid(), PROMPT, sampling=sampling)),
                  grpc.StatusCode.INVALID_ARGUMENT, field)
    assert_status(lambda: target_stub.Verify(verify_req(sid(), PROMPT, sampling=sampling)),
                  grpc.StatusCode.INVALID_ARGUMENT, field)


@pytest.mark.parametrize("tokens", [[1, VOCAB], [-1, 2], [2**31 - 1]])
def test_token_outside_vocabulary(tokens, draft_stub, target_stub):
    assert_status(lambda: draft_stub.Propose(propose_req(sid(), tokens)),
                  grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary")
    assert_status(lambda: target_stub.Verify(verify_req(sid(), tokens)),
                  grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary")


def test_empty_session_id_and_empty_new_tokens(draft_stub, target_stub):
    assert_status(lambda: draft_stub.Propose(propose_req("", PROMPT)),
                  grpc.StatusCode.INVALID_ARGUMENT, "session_id")
    assert_status(lambda: target_stub.Verify(verify_req("", PROMPT)),
                  grpc.StatusCode.INVALID_ARGUMENT, "session_id")
    assert_status(lambda: draft_stub.Release(common_pb2.ReleaseRequest(session_id="")),
                  grpc.StatusCode.INVALID_ARGUMENT, "session_id")
    assert_status(lambda: draft_stub.Propose(propose_req(sid(), [])),
                  grpc.StatusCode.INVALID_ARGUMENT, "new_tokens")


@pytest.mark.parametrize("k", [0, -1, 17])
def test_num_tokens_out_of_range(k, draft_stub):
    assert_status(lambda: draft_stub.Propose(propose_req(sid(), PROMPT, k=k)),
                  grpc.StatusCode.INVALID_ARGUMENT, "num_tokens", "[1, 16]")


def test_num_draft_out_of_range(target_stub):
    assert_status(lambda: target_stub.Verify(verify_req(sid(), [1, 2, 3], num_draft=3)),
                  grpc.StatusCode.INVALID_ARGUMENT, "num_draft")
    assert_status(lambda: target_stub.Verify(verify_req(sid(), [1, 2, 3], num_draft=5)),
                  grpc.StatusCode.INVALID_ARGUMENT, "num_draft")
    assert_status(lambda: target_stub.Verify(verify_req(sid(), [1, 2, 3], num_draft=-1)),
                  grpc.StatusCode.INVALID_ARGUMENT, "num_draft")


def dist(ids, probs):
    return common_pb2.SparseDist(token_ids=ids, probs=probs)


def compact(id_deltas, counts):
    return common_pb2.SparseDist(id_deltas=id_deltas, counts=counts)


BAD_DISTS = [
    ([dist([7, 8], [0.5])], "same, non-zero length"),
    ([dist([], [])], "same, non-zero length"),
    ([dist([7, 8], [1.2, -0.2])], "finite and >= 0"),
    ([dist([7, 8], [float("nan"), 0.5])], "finite and >= 0"),
    ([dist([7, 8], [float("inf"), 0.5])], "finite and >= 0"),
    ([dist([7, 7], [0.5, 0.5])], "duplicates"),
    ([dist([7, VOCAB], [0.5, 0.5])], "outside the vocabulary"),
    ([dist([7, 8], [0.5, 0.2])], "sum to 1"),
    ([dist([8, 9], [0.5, 0.5])], "probability 0 to its own draft token"),
    ([], "one draft_dist per draft"),
    ([dist([7], [1.0]), dist([7], [1.0])], "one draft_dist per draft"),
    # the compact form (Quantize-Sample-Verify): ids delta-coded, counts sum to Q_TOTAL
    ([compact([7, 1], [Q_TOTAL - 1])], "id_deltas and counts must have the same"),
    ([compact([], [Q_TOTAL])], "id_deltas and counts must have the same"),
    ([compact([7, 0], [Q_TOTAL - 1, 1])], "strictly ascending"),
    ([compact([7, VOCAB - 7], [Q_TOTAL - 1, 1])], "outside the vocabulary"),
    ([compact([6, 1], [Q_TOTAL, 0])], "counts must be >= 1"),
    ([compact([6, 1], [Q_TOTAL - 2, 1])], f"counts must sum to {Q_TOTAL}, got"),
    ([compact([6, 1], [Q_TOTAL, 1])], f"counts must sum to {Q_TOTAL}, got"),
    ([compact([8, 1], [Q_TOTAL - 1, 1])], "probability 0 to its own draft token"),
    ([common_pb2.SparseDist(id_deltas=[7], counts=[Q_TOTAL], token_ids=[7], probs=[1.0])],
     "not both"),
]


@pytest.mark.parametrize(("dists", "fragment"), BAD_DISTS)
def test_bad_draft_dists(dists, fragment, target_stub):
    req = verify_req(sid(), [1, 2, 7], num_draft=1, dists=dists, sampling=SAMPLED)
    assert_status(lambda: target_stub.Verify(req), grpc.StatusCode.INVALID_ARGUMENT, fragment)


@pytest.mark.parametrize("dists", [[compact([7], [Q_TOTAL])], [compact([0, 7], [9, Q_TOTAL - 9])],
                                   [dist([7, 8], [0.75, 0.25])]],
                         ids=["compact one token", "compact id 0", "float form"])
def test_good_draft_dists(dists, target_stub):
    req = verify_req(sid(), [1, 2, 7], num_draft=1, dists=dists, sampling=SAMPLED)
    assert len(target_stub.Verify(req).target_probs) == 1


def test_greedy_verify_refuses_dists(target_stub):
    req = verify_req(sid(), [1, 2, 7], num_draft=1, dists=[dist([7], [1.0])], sampling=GREEDY)
    assert_status(lambda: target_stub.Verify(req), grpc.StatusCode.INVALID_ARGUMENT, "greedy")


def test_context_beyond_max_context(draft_stub, target_stub, target_server):
    max_context = target_server[1].model.max_context
    long = [1] * (max_context + 1)
    assert_status(lambda: target_stub.Verify(verify_req(sid(), long)),
                  grpc.StatusCode.INVALID_ARGUMENT, "max_context")
    # The draft also counts the K - 1 drafts it will cache.
    assert_status(lambda: draft_stub.Propose(propose_req(sid(), [1] * (max_context - 2), k=4)),
                  grpc.StatusCode.INVALID_ARGUMENT, "max_context")


def test_failed_request_leaves_the_session_as_it_was(draft_stub):
    s = sid()
    first = draft_stub.Propose(propose_req(s, PROMPT, k=3))
    keep = len(PROMPT)
    bad = propose_req(s, [VOCAB + 5], keep_len=keep, prefix=PROMPT)
    assert_status(lambda: draft_stub.Propose(bad), grpc.StatusCode.INVALID_ARGUMENT)
    # The cache still holds the prompt and two drafts: ask again for round 1's answer.
    again = draft_stub.Propose(propose_req(s, PROMPT[-1:], keep_len=keep - 1, prefix=PROMPT, k=3))
    assert list(again.tokens) == list(first.tokens)


# -- RESOURCE_EXHAUSTED -----------------------------------------------------------------


@pytest.fixture(scope="module")
def small_servers():
    draft, dport, _ = create_draft(DraftConfig(model="tiny-random-draft", port=0, max_sessions=2))
    target, tport, _ = create_target(TargetConfig(model="tiny-random", port=0, max_sessions=2))
    draft.start()
    target.start()
    with grpc.insecure_channel(f"127.0.0.1:{dport}") as dc, \
            grpc.insecure_channel(f"127.0.0.1:{tport}") as tc:
        yield draft_pb2_grpc.DraftServiceStub(dc), target_pb2_grpc.TargetServiceStub(tc)
    draft.stop(0)
    target.stop(0)


@pytest.mark.parametrize("service", ["draft", "target"])
def test_session_cap(service, small_servers):
    draft_stub, target_stub = small_servers
    if service == "draft":
        def call(s, **kw):
            return draft_stub.Propose(propose_req(s, PROMPT, **kw))
        stub = draft_stub
    else:
        def call(s, **kw):
            return target_stub.Verify(verify_req(s, PROMPT, **kw))
        stub = target_stub
    a, b = sid(), sid()
    call(a)
    call(b)
    assert_status(lambda: call(sid()), grpc.StatusCode.RESOURCE_EXHAUSTED, "session cap")
    # Existing sessions still work, and a release makes room.
    call(a)
    assert stub.Release(common_pb2.ReleaseRequest(session_id=b)).released
    assert not stub.Release(common_pb2.ReleaseRequest(session_id=b)).released
    call(sid())
    stub.Release(common_pb2.ReleaseRequest(session_id=a))


def test_kv_budget_evicts_idle_sessions_then_refuses():
    server, port, engine = create_target(
        TargetConfig(model="tiny-random", port=0, max_cached_tokens=16))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = target_pb2_grpc.TargetServiceStub(channel)
            a, b = sid(), sid()
            stub.Verify(verify_req(a, list(range(10))))
            stub.Verify(verify_req(b, list(range(10))))  # 20 > 16: "a" is evicted
            assert_status(lambda: stub.Verify(verify_req(a, [1], keep_len=10,
                                                         prefix=list(range(10)))),
                          grpc.StatusCode.NOT_FOUND, "evicted")
            assert_status(lambda: stub.Verify(verify_req(sid(), list(range(17)))),
                          grpc.StatusCode.RESOURCE_EXHAUSTED, "max_cached_tokens = 16")
            # "b" survived and continues.
            stub.Verify(verify_req(b, [5], keep_len=10, prefix=list(range(10))))
            assert engine.model.store.stats().evicted_for_memory == 1
    finally:
        server.stop(0)
