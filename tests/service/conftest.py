"""Helpers for tests that talk to the real servers over gRPC."""

from __future__ import annotations

import pytest

from specdec import digest
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

SAMPLED = common_pb2.SamplingParams(temperature=1.0, top_k=0, top_p=0.0, seed=7)
GREEDY = common_pb2.SamplingParams()


def propose_req(session_id, new_tokens, keep_len=0, keep_digest=None, k=4,
                sampling=GREEDY, top_n=0, prefix=None):
    """A ProposeRequest; keep_digest defaults to the digest of prefix[:keep_len]."""
    if keep_digest is None:
        keep_digest = digest.digest((prefix or [])[:keep_len])
    return draft_pb2.ProposeRequest(session_id=session_id, keep_len=keep_len,
                                    keep_digest=keep_digest, new_tokens=new_tokens,
                                    num_tokens=k, sampling=sampling, top_n=top_n)


def verify_req(session_id, new_tokens, num_draft=0, keep_len=0, keep_digest=None,
               dists=(), sampling=GREEDY, round_seed=1, prefix=None):
    if keep_digest is None:
        keep_digest = digest.digest((prefix or [])[:keep_len])
    return target_pb2.VerifyRequest(session_id=session_id, keep_len=keep_len,
                                    keep_digest=keep_digest, new_tokens=new_tokens,
                                    num_draft=num_draft, draft_dists=list(dists),
                                    sampling=sampling, round_seed=round_seed)


@pytest.fixture()
def draft_stub(draft_channel):
    return draft_pb2_grpc.DraftServiceStub(draft_channel)


@pytest.fixture()
def target_stub(target_channel):
    return target_pb2_grpc.TargetServiceStub(target_channel)


def evict_at(rounds: tuple[int, ...], *servers):
    """An on_tokens callback that releases every session of these (address, engine)
    servers after the given rounds (numbered from 1): a lost-session fault. A session a
    request holds then (a pipelined pre-draft's) goes when that request returns."""
    seen = 0

    def evict(_tokens, _kinds):
        nonlocal seen
        seen += 1
        if seen in rounds:
            for _, engine in servers:
                store = engine.model.store
                with store._lock:
                    held = list(store._idle) + list(store._out)
                for session_id in held:
                    store.release(session_id)

    return evict


@pytest.fixture(scope="module")
def tmp_home(tmp_path_factory):
    """SPECDEC_HOME in a fresh folder for one module (exports made there, not in the
    user's cache), restored afterwards."""
    import os

    old = os.environ.get("SPECDEC_HOME")
    os.environ["SPECDEC_HOME"] = str(tmp_path_factory.mktemp("specdec-home"))
    yield
    if old is None:
        os.environ.pop("SPECDEC_HOME")
    else:
        os.environ["SPECDEC_HOME"] = old
