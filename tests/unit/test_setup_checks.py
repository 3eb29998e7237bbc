"""coordinator.deploy.setup.check_compatible: draft and target replicas must share a tokenizer."""

from __future__ import annotations

import pytest

from coordinator.deploy.setup import check_compatible
from specdec.v1.common_pb2 import ModelInfo


def info(model_id="tiny", vocab_size=768, digest="abc123", **kw) -> ModelInfo:
    fields = dict(max_context=512, backend="torch", device="cpu") | kw
    return ModelInfo(model_id=model_id, vocab_size=vocab_size, tokenizer_digest=digest,
                     **fields)


def test_equal_infos_pass():
    check_compatible({"d:1": info("draft-model")}, {"t:1": info("target-model")})


def test_many_equal_replicas_pass():
    drafts = {f"d:{i}": info("small", max_draft_tokens=8) for i in range(3)}
    targets = {f"t:{i}": info("big", max_context=1024 + i) for i in range(2)}
    check_compatible(drafts, targets)


def test_target_only_passes():
    check_compatible({}, {"t:1": info()})


@pytest.mark.parametrize("draft", [info(digest="other"), info(vocab_size=769)])
def test_mismatched_draft_is_refused(draft):
    with pytest.raises(ValueError) as e:
        check_compatible({"draft-host:7001": draft}, {"target-host:7002": info()})
    text = str(e.value)
    assert "draft-host:7001" in text and "target-host:7002" in text
    assert "share a tokenizer" in text
    assert f"vocab {draft.vocab_size}" in text and draft.tokenizer_digest in text


def test_message_names_both_sides_values():
    draft = info("small", vocab_size=500, digest="d-digest")
    target = info("big", vocab_size=768, digest="t-digest")
    with pytest.raises(ValueError) as e:
        check_compatible({"d:1": draft}, {"t:1": target})
    text = str(e.value)
    for part in ("draft at d:1", "target at t:1", "small", "big", "vocab 500", "vocab 768",
                 "d-digest", "t-digest"):
        assert part in text, part


def test_one_bad_draft_among_good_ones():
    drafts = {"d:1": info(), "d:2": info(), "d:3": info(digest="zzz")}
    with pytest.raises(ValueError, match="d:3.*t:1.*share a tokenizer"):
        check_compatible(drafts, {"t:1": info()})


def test_mismatched_targets_are_refused():
    with pytest.raises(ValueError, match="target at t:2.*target at t:1"):
        check_compatible({}, {"t:1": info(), "t:2": info(vocab_size=1024)})


def test_other_fields_may_differ():
    draft = info("other-model", max_draft_tokens=4, max_sessions=3, default_top_n=16)
    draft.max_context = 64
    draft.backend, draft.device = "openvino", "GPU"
    check_compatible({"d:1": draft}, {"t:1": info("target")})
