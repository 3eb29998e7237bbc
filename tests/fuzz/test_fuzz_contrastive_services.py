"""Fuzzing contrastive decoding's RPCs over real gRPC on loopback: the draft's Score and
Verify with its contrastive option, on the strategies and the rule of
test_fuzz_model_services (OK with a well-formed reply, or a client error with a message;
never INTERNAL or UNKNOWN; the services healthy after)."""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from specdec.v1 import common_pb2, draft_pb2, target_pb2
from tests.fuzz._fuzz_stack import VOCAB, examples
from tests.fuzz.test_fuzz_model_services import (
    FLOATS,
    TOKENS,
    VALID_TOKENS,
    VERIFY,
    fuzz_call,
    ints,
    sync_request,
)

# -- contrastive decoding: Verify's heads and the draft's Score ---------------------------

CONTRASTIVE = st.builds(common_pb2.ContrastiveParams, alpha=FLOATS, beta=FLOATS,
                        amateur_temperature=FLOATS, formulation=ints(st.integers(0, 1)))
VALID_CONTRASTIVE = st.builds(common_pb2.ContrastiveParams,
                              alpha=st.floats(0.0625, 1.0, width=32),
                              beta=st.floats(0.0, 4.0, width=32),
                              amateur_temperature=st.floats(0.125, 4.0, width=32),
                              formulation=st.integers(0, 1))
HEADS = st.lists(st.builds(common_pb2.HeadValues, token_ids=st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8, unique=True),
    st.lists(ints(st.integers(0, VOCAB - 1)), max_size=8))), max_size=20)
VALID_HEADS = st.lists(st.builds(common_pb2.HeadValues, token_ids=st.lists(
    st.integers(0, VOCAB - 1), min_size=1, max_size=8, unique=True)), max_size=4)
SCORE = sync_request(
    "draft",
    valid={"new_tokens": st.one_of(st.just([]), VALID_TOKENS), "heads": VALID_HEADS,
           "contrastive": VALID_CONTRASTIVE},
    wild={"new_tokens": TOKENS, "heads": HEADS, "contrastive": CONTRASTIVE})


@examples(100)
@given(case=SCORE)
@example(case=({"session_id": "s", "keep_len": 0, "keep_digest": 0, "new_tokens": [1, 2],
                "heads": [common_pb2.HeadValues(token_ids=[2**31 - 1])],
                "contrastive": common_pb2.ContrastiveParams(alpha=math.nan)}, None))
def test_score_fuzz(fuzz_services, case):
    fuzz_call(fuzz_services, "draft", case, fuzz_services.draft.Score,
              lambda values: draft_pb2.ScoreRequest(**values), check_score)


def check_score(req: draft_pb2.ScoreRequest, resp: draft_pb2.ScoreResponse) -> None:
    assert len(resp.values) == len(req.heads)
    for h, v in zip(req.heads, resp.values, strict=True):
        assert len(v.values) == len(h.token_ids) and not v.token_ids
        assert all(not math.isnan(x) for x in v.values)
    assert resp.cached_len == req.keep_len + len(req.new_tokens)


@examples(60)
@given(case=VERIFY, contrastive=st.one_of(VALID_CONTRASTIVE, CONTRASTIVE))
def test_contrastive_verify_fuzz(fuzz_services, case, contrastive):
    values, _ = case
    if values["draft_dists"] == "valid":
        values["draft_dists"] = []
    fuzz_call(fuzz_services, "target", case, fuzz_services.target.Verify,
              lambda v: target_pb2.VerifyRequest(**v, contrastive=contrastive), check_heads)


def check_heads(req: target_pb2.VerifyRequest, resp: target_pb2.VerifyResponse) -> None:
    assert len(resp.heads) == max(req.num_draft, 0) + 1 and not resp.target_probs
    for h in resp.heads:
        assert len(h.token_ids) == len(h.values) >= 1
        assert list(h.token_ids) == sorted(set(h.token_ids))
        assert all(0 <= t < VOCAB for t in h.token_ids)
        assert all(math.isfinite(x) for x in h.values)


