"""Fuzzing the draft and target services' RPCs over real gRPC on loopback.

Every field of ProposeRequest, VerifyRequest and ReleaseRequest (and, in
test_fuzz_contrastive_services, ScoreRequest and Verify's contrastive option) gets
random and boundary
values (int32 and uint64 extremes, negative and huge token and session ids, NaN, inf,
subnormal and huge floats, empty everything, repeated fields far past max_context, up
to messages beyond the 8 MiB receive limit), alone and on top of a session that holds a
real prefix (so keep_len and keep_digest hit the cache-sync paths), and raw bytes that
are no protobuf at all or carry strings that are not UTF-8. Each answer is OK with a
well-formed reply, or a client error (INVALID_ARGUMENT, OUT_OF_RANGE, RESOURCE_EXHAUSTED,
NOT_FOUND, FAILED_PRECONDITION) with a message; never INTERNAL or UNKNOWN. After each
test, normal requests give exactly their recorded answers and no session is left.
"""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from specdec import digest, wire
from specdec.sampling import Q_TOTAL
from specdec.v1 import common_pb2, draft_pb2, target_pb2
from tests.fuzz._fuzz_stack import (
    CLIENT_ERRORS,
    PROMPT,
    RPC_TIMEOUT_S,
    VOCAB,
    examples,
)

INT32 = st.integers(-2**31, 2**31 - 1)
UINT64 = st.integers(0, 2**64 - 1)
BOUNDARY_INT32 = st.sampled_from([0, 1, -1, 2, 15, 16, 17, VOCAB - 1, VOCAB, 2047, 2048,
                                  2049, 2**31 - 1, -2**31])


def ints(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly valid values, often boundaries, sometimes any int32."""
    return st.one_of(valid, BOUNDARY_INT32, INT32)


FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 0.5, -1.0, 2.0, math.nan, math.inf, -math.inf,
                     1e-45, 5e-324, 1e-30, 3.4e38, 1e39, 1.0000001, 0.9999999]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(0.0, 2.0, width=32),
)
TOKENS = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), max_size=24),
    st.lists(ints(st.integers(0, VOCAB - 1)), max_size=24),
    st.sampled_from([[], [VOCAB], [-1], [2**31 - 1], [-2**31], [0] * 2049, [1] * 5000]),
)
SESSION_IDS = st.one_of(
    st.sampled_from(["", "a", "fuzz", "x" * 256, "x" * 257, "é" * 200, "\x00", "🙂" * 64,
                     " ", "\n"]),
    st.text(max_size=300),
)
SAMPLING = st.builds(common_pb2.SamplingParams, temperature=FLOATS,
                     top_k=ints(st.integers(0, 100)), top_p=FLOATS, seed=UINT64)


UINT32 = st.one_of(st.sampled_from([0, 1, 2, VOCAB - 1, VOCAB, Q_TOTAL - 1, Q_TOTAL,
                                     Q_TOTAL + 1, 2**31, 2**32 - 1]),
                   st.integers(0, 2**32 - 1))


def dists(draws: int) -> st.SearchStrategy:
    """Either form of SparseDist (float: token_ids + probs; compact: id_deltas + counts),
    sometimes both at once."""
    old = st.builds(common_pb2.SparseDist,
                    token_ids=st.lists(ints(st.integers(0, VOCAB - 1)), max_size=8),
                    probs=st.lists(FLOATS, max_size=8))
    compact = st.builds(common_pb2.SparseDist,
                        id_deltas=st.lists(st.one_of(st.integers(0, 40), UINT32), max_size=8),
                        counts=st.lists(st.one_of(st.integers(1, Q_TOTAL), UINT32),
                                        max_size=8))
    both = st.builds(common_pb2.SparseDist, token_ids=st.lists(INT32, max_size=2),
                     probs=st.lists(FLOATS, max_size=2), id_deltas=st.lists(UINT32, max_size=2),
                     counts=st.lists(UINT32, max_size=2))
    return st.lists(st.one_of(old, compact, both), max_size=draws)


def assert_client_error(err: grpc.RpcError) -> None:
    assert err.code() in CLIENT_ERRORS, (err.code(), err.details())
    assert err.details(), err.code()
    event(err.code().name)  # --hypothesis-show-statistics: how the examples ended


# -- requests: mostly valid, with a few fields mutated (or all of them wild) -------------

VALID_SAMPLING = st.one_of(
    st.just(common_pb2.SamplingParams()),
    st.builds(common_pb2.SamplingParams, temperature=st.floats(0.0625, 2.0, width=32),
              top_k=st.integers(0, 100), top_p=st.floats(0.0, 1.0, width=32), seed=UINT64))
VALID_TOKENS = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)
SYNC_FIELDS = ("session_id", "keep_len", "keep_digest")


@st.composite
def fields(draw, valid: dict, wild: dict):
    """Values for every field: all wild one time in eight, else valid but for up to
    three mutated fields (so most examples get past validation and run for real)."""
    names = sorted(valid)
    mutated = set(names) if draw(st.integers(0, 7)) == 0 else \
        draw(st.sets(st.sampled_from(names), max_size=3))
    return {n: draw(wild[n] if n in mutated else valid[n]) for n in names}, mutated


@st.composite
def sync_request(draw, service: str, valid: dict, wild: dict):
    """(request fields, prefix to hold first or None): with a prefix the session is
    started on it before the request, whose keep_len is around its length and whose
    digest is right unless mutated."""
    prefix = draw(st.one_of(st.none(), VALID_TOKENS.map(lambda p: p[:12])))
    sync_valid = {"session_id": st.text("abcdef0123", min_size=1, max_size=16).map(
                      lambda s: f"{service}-{s}"),
                  "keep_len": st.just(0) if prefix is None else
                  st.integers(0, len(prefix)),
                  "keep_digest": st.just(digest.EMPTY)}
    sync_wild = {"session_id": SESSION_IDS, "keep_len": ints(st.integers(0, 14)),
                 "keep_digest": st.one_of(st.just(digest.EMPTY), UINT64)}
    values, mutated = draw(fields({**sync_valid, **valid}, {**sync_wild, **wild}))
    if prefix is not None and "keep_digest" not in mutated and \
            0 <= values["keep_len"] <= len(prefix):
        values["keep_digest"] = digest.digest(prefix[:values["keep_len"]])
    return values, prefix


def start_session(stack, service: str, session_id: str, prefix: list[int]) -> None:
    """Hold `prefix` in a session (a draft's one proposed token is not fed)."""
    try:
        if service == "draft":
            stack.draft.Propose(draft_pb2.ProposeRequest(
                session_id=session_id, keep_digest=digest.EMPTY, new_tokens=prefix,
                num_tokens=1), timeout=RPC_TIMEOUT_S)
        else:
            stack.target.Verify(target_pb2.VerifyRequest(
                session_id=session_id, keep_digest=digest.EMPTY, new_tokens=prefix),
                timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as err:  # a mutated session id the server refuses
        assert_client_error(err)


def fuzz_call(stack, service: str, case, rpc, make_request, check) -> None:
    """One fuzz case: hold its prefix in a session (if any), send the request, and check
    the answer: a well-formed reply (`check(req, resp)`) or a client error with a message.
    Every session is released after."""
    values, prefix = case
    if prefix is not None:
        start_session(stack, service, values["session_id"], prefix)
    req = make_request(values)
    try:
        resp = rpc(req, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as err:
        assert_client_error(err)
    else:
        event("OK")
        check(req, resp)
    finally:
        stack.release_all()


# -- Propose ------------------------------------------------------------------------------

PROPOSE = sync_request(
    "draft",
    valid={"new_tokens": VALID_TOKENS, "num_tokens": st.integers(1, 16),
           "sampling": VALID_SAMPLING, "top_n": st.integers(0, 64),
           "exit_below": st.one_of(st.just(0.0), st.floats(0.0, 1.0, width=32)),
           "top_mass": st.one_of(st.just(0.0), st.floats(0.0, 1.0, width=32))},
    wild={"new_tokens": TOKENS, "num_tokens": ints(st.integers(1, 16)),
          "sampling": SAMPLING, "top_n": ints(st.integers(0, 64)), "exit_below": FLOATS,
          "top_mass": FLOATS})


def check_propose(req: draft_pb2.ProposeRequest, resp: draft_pb2.ProposeResponse) -> None:
    k = req.num_tokens
    assert 1 <= len(resp.tokens) <= k
    assert all(0 <= t < VOCAB for t in resp.tokens)
    assert resp.cached_len == req.keep_len + len(req.new_tokens) + len(resp.tokens) - 1
    if req.sampling.temperature == 0:
        assert not resp.dists
    else:
        assert len(resp.dists) == len(resp.tokens)
        for tok, d in zip(resp.tokens, resp.dists, strict=True):
            assert not d.token_ids and not d.probs  # the compact form only
            assert len(d.id_deltas) == len(d.counts) >= 1
            q = wire.dist_from_proto(d)
            assert q.prob_of(tok) > 0
            assert all(0 <= t < VOCAB for t in q.token_ids.tolist())
            assert bool((q.token_ids[1:] > q.token_ids[:-1]).all())
            assert min(d.counts) >= 1 and sum(d.counts) == Q_TOTAL


def propose_case(prefix=None, **values):
    base = {"session_id": "s", "keep_len": 0, "keep_digest": 0, "new_tokens": [1],
            "num_tokens": 1, "sampling": common_pb2.SamplingParams(), "top_n": 0,
            "exit_below": 0.0, "top_mass": 0.0}
    return {**base, **values}, prefix


@examples(100)
@given(case=PROPOSE)
@example(case=propose_case(new_tokens=[1, 2], num_tokens=4, top_n=2**31 - 1,
                           sampling=common_pb2.SamplingParams(temperature=1e-45,
                                                              top_p=1e-45)))
@example(case=propose_case(num_tokens=16, top_n=1, exit_below=1.0,
                           sampling=common_pb2.SamplingParams(temperature=3.4e38,
                                                              seed=2**64 - 1)))
@example(case=propose_case(prefix=[5, 6, 7], keep_len=3, keep_digest=digest.digest([5, 6, 7]),
                           new_tokens=[8], num_tokens=16))
def test_propose_fuzz(fuzz_services, case):
    fuzz_call(fuzz_services, "draft", case, fuzz_services.draft.Propose,
              lambda values: draft_pb2.ProposeRequest(**values), check_propose)


# -- Verify -------------------------------------------------------------------------------


def valid_dists_for(new_tokens: list[int], num_draft: int) -> list[common_pb2.SparseDist]:
    """Well-formed q's, each giving its draft token mass, for a sampled Verify: the
    compact form (what drafts send) and the float form (older drafts) in turn; the float
    form for a mutated negative token, which the compact one cannot hold."""
    drafts = new_tokens[len(new_tokens) - num_draft:] if num_draft > 0 else []
    return [wire.point_mass_dist(t) if i % 2 == 0 and t >= 0 else
            common_pb2.SparseDist(token_ids=[t, (t + 1) % VOCAB], probs=[0.75, 0.25])
            for i, t in enumerate(drafts)]


VERIFY = sync_request(
    "target",
    valid={"new_tokens": VALID_TOKENS, "num_draft": st.integers(0, 5),
           "sampling": VALID_SAMPLING, "draft_dists": st.just("valid"),
           "round_seed": UINT64},
    wild={"new_tokens": TOKENS, "num_draft": ints(st.integers(0, 5)), "sampling": SAMPLING,
          "draft_dists": st.one_of(st.just([]), dists(6)), "round_seed": UINT64})


@examples(100)
@given(case=VERIFY)
@example(case=({"session_id": "s", "keep_len": 0, "keep_digest": 0, "new_tokens": [1, 2, 3],
                "num_draft": 2, "sampling": common_pb2.SamplingParams(temperature=1.0),
                "draft_dists": [common_pb2.SparseDist(token_ids=[2], probs=[1.0]),
                                common_pb2.SparseDist(token_ids=[3, 4],
                                                      probs=[5e-324, 1.0])],
                "round_seed": 2**64 - 1}, None))
def test_verify_fuzz(fuzz_services, case):
    values, _ = case
    if values["draft_dists"] == "valid":
        greedy = values["sampling"].temperature == 0
        values["draft_dists"] = [] if greedy else \
            valid_dists_for(values["new_tokens"], values["num_draft"])
    fuzz_call(fuzz_services, "target", case, fuzz_services.target.Verify,
              lambda v: target_pb2.VerifyRequest(**v), check_verify)


def check_verify(req: target_pb2.VerifyRequest, resp: target_pb2.VerifyResponse) -> None:
    k = req.num_draft
    assert len(resp.target_probs) == len(resp.recovered_tokens) == k
    assert all(0.0 <= p <= 1.0 + 1e-6 for p in resp.target_probs)
    assert all(0 <= t < VOCAB for t in resp.recovered_tokens)
    assert 0 <= resp.bonus_token < VOCAB
    assert resp.cached_len == req.keep_len + len(req.new_tokens)


# -- Release and Info ---------------------------------------------------------------------


@examples(40)
@given(session_id=SESSION_IDS, held=st.booleans(), twice=st.booleans())
def test_release_fuzz(fuzz_services, session_id, held, twice):
    stack = fuzz_services
    for stub, service in ((stack.draft, "draft"), (stack.target, "target")):
        ok_id = 0 < len(session_id) <= 256
        if held and ok_id:
            start_session(stack, service, session_id, PROMPT)
        for attempt in range(2 if twice else 1):
            try:
                resp = stub.Release(common_pb2.ReleaseRequest(session_id=session_id),
                                    timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as err:
                assert_client_error(err)
                assert not session_id, (session_id, err.details())
            else:
                assert resp.released == (held and ok_id and attempt == 0)


def test_info_answers_alike_on_both(fuzz_services):
    stack = fuzz_services
    d = stack.draft.Info(common_pb2.InfoRequest(), timeout=RPC_TIMEOUT_S)
    t = stack.target.Info(common_pb2.InfoRequest(), timeout=RPC_TIMEOUT_S)
    assert (d.vocab_size, d.tokenizer_digest) == (t.vocab_size, t.tokenizer_digest)


# -- raw bytes: garbage, truncated messages, strings that are not UTF-8 --------------------

METHODS = [
    ("/specdec.v1.DraftService/Propose", draft_pb2.ProposeRequest),
    ("/specdec.v1.DraftService/Score", draft_pb2.ScoreRequest),
    ("/specdec.v1.DraftService/Release", common_pb2.ReleaseRequest),
    ("/specdec.v1.DraftService/Info", common_pb2.InfoRequest),
    ("/specdec.v1.TargetService/Verify", target_pb2.VerifyRequest),
    ("/specdec.v1.TargetService/Release", common_pb2.ReleaseRequest),
    ("/specdec.v1.TargetService/Info", common_pb2.InfoRequest),
]
# A ProposeRequest whose session_id (field 1) holds bytes that are not UTF-8: protobuf
# refuses to parse it, which gRPC answered INTERNAL ("Exception deserializing request!")
# before the server's interceptor turned it into INVALID_ARGUMENT.
NOT_UTF8_SESSION = b"\x0a\x02\xff\xfe\x22\x01\x05\x28\x01"
TRUNCATED = draft_pb2.ProposeRequest(session_id="s", new_tokens=[1, 2, 3],
                                     num_tokens=2).SerializeToString()[:-3]


def raw_call(stack, method: str, payload: bytes):
    channel = stack.draft_channel if "Draft" in method else stack.target_channel
    call = channel.unary_unary(method, request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    return call(payload, timeout=RPC_TIMEOUT_S)


@pytest.mark.parametrize(("method", "message"), METHODS, ids=[m for m, _ in METHODS])
@examples(25)
@given(payload=st.one_of(st.binary(max_size=512),
                         st.binary(max_size=64).map(lambda b: b"\x0a\x02\xc3\x28" + b)))
@example(payload=NOT_UTF8_SESSION)
@example(payload=TRUNCATED)
@example(payload=b"\xff" * 32)
@example(payload=b"\x0a\xff\xff\xff\xff\x0f")  # a length far beyond the message
def test_raw_bytes_are_invalid_argument_never_internal(fuzz_services, method, message,
                                                       payload):
    try:
        parsed = message.FromString(payload)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError: not a message of its type
        parsed = None
    try:
        raw_call(fuzz_services, method, payload)
    except grpc.RpcError as err:
        assert_client_error(err)
        if parsed is None:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
            assert "not a valid protobuf message" in err.details()
    else:
        assert parsed is not None, "the server took bytes protobuf cannot parse"
    finally:
        fuzz_services.release_all()


def test_not_utf8_session_id_is_invalid_argument(fuzz_services):
    """Regression: the exact bytes that got INTERNAL before the fix."""
    with pytest.raises(grpc.RpcError) as info:
        raw_call(fuzz_services, "/specdec.v1.DraftService/Propose", NOT_UTF8_SESSION)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        raw_call(fuzz_services, "/specdec.v1.TargetService/Verify", b"\xff\xff\xff")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- huge repeated fields and messages beyond the receive limit ---------------------------


@pytest.mark.slow
def test_huge_repeated_fields_and_oversized_messages(fuzz_services):
    stack = fuzz_services
    cases = [
        # under the 8 MiB limit: parsed, then refused by validation
        (lambda: stack.draft.Propose(draft_pb2.ProposeRequest(
            session_id="big", keep_digest=0, new_tokens=[1] * 1_000_000, num_tokens=1),
            timeout=RPC_TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, "max_context"),
        (lambda: stack.target.Verify(target_pb2.VerifyRequest(
            session_id="big", new_tokens=[1, 2], num_draft=1,
            sampling=common_pb2.SamplingParams(temperature=1.0),
            draft_dists=[common_pb2.SparseDist(token_ids=list(range(VOCAB)) * 300,
                                               probs=[1.0] * (VOCAB * 300))]),
            timeout=RPC_TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, "draft_dists[0]"),
        (lambda: stack.target.Verify(target_pb2.VerifyRequest(
            session_id="big", new_tokens=[1, 2], num_draft=1,
            sampling=common_pb2.SamplingParams(temperature=1.0),
            draft_dists=[common_pb2.SparseDist(token_ids=[2], probs=[1.0])] * 200_000),
            timeout=RPC_TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, "one draft_dist"),
        # beyond it: gRPC refuses before the servicer runs
        (lambda: stack.draft.Propose(draft_pb2.ProposeRequest(
            session_id="big", new_tokens=[-1] * 1_000_000, num_tokens=1),
            timeout=RPC_TIMEOUT_S), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
        (lambda: stack.target.Verify(target_pb2.VerifyRequest(
            session_id="x" * (9 * 1024 * 1024), new_tokens=[1]),
            timeout=RPC_TIMEOUT_S), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
        (lambda: stack.draft.Release(common_pb2.ReleaseRequest(
            session_id="x" * (9 * 1024 * 1024)), timeout=RPC_TIMEOUT_S),
         grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
    ]
    for call, code, fragment in cases:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == code, (info.value.code(), info.value.details())
        assert fragment in info.value.details(), info.value.details()


# -- empty everything ---------------------------------------------------------------------


@pytest.mark.parametrize("method", [m for m, _ in METHODS])
def test_empty_requests(fuzz_services, method):
    """Every RPC with an empty message (all fields at their defaults, zero bytes on the
    wire): Info answers, the rest are INVALID_ARGUMENT naming what is missing."""
    if method.endswith("/Info"):
        assert common_pb2.ModelInfo.FromString(raw_call(fuzz_services, method, b"")).vocab_size
        return
    with pytest.raises(grpc.RpcError) as info:
        raw_call(fuzz_services, method, b"")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    expected = {"Propose": "num_tokens", "Verify": "new_tokens"}.get(method.rsplit("/")[-1],
                                                                     "session_id")
    assert expected in info.value.details(), info.value.details()
