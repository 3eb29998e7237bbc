"""coordinator.api.service: request validation and planning over a scripted fake loop."""

from __future__ import annotations

import math

import pytest

from coordinator.api.service import MAX_STOP_CHARS, MAX_STOP_STRINGS, GenerationService, Limits
from specdec.errors import InvalidArgument
from specdec.v1 import common_pb2
from tests.unit import _generation_helpers
from tests.unit._generation_helpers import (
    IM_END,
    IM_START,
    LIMITS,
    FakeLoop,
    encode,
    msg,
    request,
    service,
)

tok = _generation_helpers.tok  # the shared module-scoped fixture


# -- plan: invalid requests ----------------------------------------------------------

BAD = {
    "nothing": (dict(no_prompt=True), "prompt"),
    "empty prompt": (dict(prompt="", max_new_tokens=5), "prompt"),
    "prompt and messages": (dict(prompt="hi", messages=[msg("user", "hi")]), "messages"),
    "prompt and ids": (dict(prompt="hi", prompt_token_ids=[5, 6]), "prompt_token_ids"),
    "messages and ids": (dict(messages=[msg("user", "hi")], prompt_token_ids=[5]),
                         "prompt_token_ids"),
    "all three": (dict(prompt="hi", messages=[msg("user", "x")], prompt_token_ids=[5]),
                  "exactly one"),
    "max_new_tokens 0": (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
    "max_new_tokens negative": (dict(prompt="hi", max_new_tokens=-3), "max_new_tokens"),
    "max_new_tokens over cap": (dict(prompt="hi", max_new_tokens=101), "max_new_tokens"),
    "negative temperature": (
        dict(sampling=common_pb2.SamplingParams(temperature=-0.5)), "sampling.temperature"),
    "nan temperature": (
        dict(sampling=common_pb2.SamplingParams(temperature=math.nan)), "sampling.temperature"),
    "inf temperature": (
        dict(sampling=common_pb2.SamplingParams(temperature=math.inf)), "sampling.temperature"),
    "negative top_k": (dict(sampling=common_pb2.SamplingParams(top_k=-1)), "sampling.top_k"),
    "top_p above 1": (dict(sampling=common_pb2.SamplingParams(top_p=1.5)), "sampling.top_p"),
    "negative top_p": (dict(sampling=common_pb2.SamplingParams(top_p=-0.1)), "sampling.top_p"),
    "num_draft_tokens -1": (dict(num_draft_tokens=-1), "num_draft_tokens"),
    "num_draft_tokens 9": (dict(num_draft_tokens=9), "num_draft_tokens"),
    "too many stops": (dict(stop=["x"] * (MAX_STOP_STRINGS + 1)), "stop"),
    "stop too long": (dict(stop=["x" * (MAX_STOP_CHARS + 1)]), "stop"),
    "unknown role": (dict(messages=[msg("user", "hi"), msg("robot", "beep")]),
                     "messages[1].role"),
    "empty role": (dict(messages=[msg("", "hi")]), "messages[0].role"),
    "id = vocab": (dict(prompt_token_ids=[5, 768]), "prompt_token_ids"),
    "negative id": (dict(prompt_token_ids=[-1, 5]), "prompt_token_ids"),
    "huge id": (dict(prompt_token_ids=[10**6]), "prompt_token_ids"),
    "prompt fills context": (dict(prompt_token_ids=[5] * 64), "prompt"),
    "prompt beyond context": (dict(prompt_token_ids=[5] * 80), "prompt"),
    "text prompt fills context": (dict(prompt="a" * 200), "prompt"),
}


@pytest.mark.parametrize("kw, field", BAD.values(), ids=list(BAD))
def test_plan_rejects(tok, kw, field):
    svc, loop = service(tok)
    with pytest.raises(InvalidArgument) as e:
        svc.plan(request(**kw))
    assert field in e.value.message
    assert e.value.code == "INVALID_ARGUMENT"
    # stream/generate refuse the same way and never reach the loop
    with pytest.raises(InvalidArgument):
        svc.generate(request(**kw))
    assert loop.calls == []


def test_plan_names_the_bad_ids_and_the_context(tok):
    svc, _ = service(tok)
    with pytest.raises(InvalidArgument, match=r"\[800, 900\]"):
        svc.plan(request(prompt_token_ids=[5, 800, 6, 900]))
    with pytest.raises(InvalidArgument, match="64 tokens.*context is 64"):
        svc.plan(request(prompt_token_ids=[5] * 64))


def test_plan_without_tokenizer_needs_ids():
    svc = GenerationService(FakeLoop([]), None, LIMITS, [])
    with pytest.raises(InvalidArgument, match="prompt_token_ids"):
        svc.plan(request(prompt="hi"))
    assert svc.plan(request(prompt_token_ids=[5, 6])).prompt_ids == [5, 6]


# -- plan: valid requests ------------------------------------------------------------


def test_plan_text_prompt(tok):
    svc, _ = service(tok)
    plan = svc.plan(request(prompt="Hello, world!", max_new_tokens=7, stop=["\n", "END"],
                            sampling=common_pb2.SamplingParams(temperature=0.7, top_k=5,
                                                               top_p=0.9, seed=123)))
    assert plan.prompt_ids == encode(tok, "Hello, world!")
    assert plan.max_new_tokens == 7
    assert plan.stop == ["\n", "END"]
    assert plan.sampling.top_k == 5 and plan.sampling.seed == 123
    assert plan.sampling.temperature == pytest.approx(0.7)
    assert plan.sampling.top_p == pytest.approx(0.9)


def test_plan_chat_messages_use_the_template(tok):
    svc, _ = service(tok)
    plan = svc.plan(request(messages=[msg("system", "be brief"), msg("user", "hi"),
                                      msg("assistant", "hello"), msg("user", "again")]))
    ids = plan.prompt_ids
    tail = encode(tok, "assistant\n")
    assert ids[0] == IM_START
    assert ids[-len(tail) - 1:] == [IM_START] + tail
    assert ids.count(IM_START) == 5 and ids.count(IM_END) == 4
    text = tok.decode(ids)
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain"
                    "<|im_end|>\n<|im_start|>assistant\n")


def test_plan_prompt_token_ids_pass_through(tok):
    svc, _ = service(tok)
    ids = [0, 1, 2, 767, 300]
    assert svc.plan(request(prompt_token_ids=ids)).prompt_ids == ids


def test_plan_default_k(tok):
    svc, _ = service(tok)
    assert svc.plan(request()).k == LIMITS.default_k == 4
    assert svc.plan(request(num_draft_tokens=0)).k == 0
    assert svc.plan(request(num_draft_tokens=8)).k == 8


def test_plan_default_k_limited_by_the_draft(tok):
    svc, _ = service(tok, limits=Limits(768, 64, max_draft_tokens=2, default_k=4))
    assert svc.plan(request()).k == 2
    with pytest.raises(InvalidArgument, match="num_draft_tokens"):
        svc.plan(request(num_draft_tokens=3))
    no_draft, _ = service(tok, limits=Limits(768, 64, max_draft_tokens=0, default_k=0))
    assert no_draft.plan(request()).k == 0
    with pytest.raises(InvalidArgument, match="num_draft_tokens"):
        no_draft.plan(request(num_draft_tokens=1))


@pytest.mark.parametrize("n_prompt, asked, expected", [
    (60, 10, 4), (63, 100, 1), (10, 54, 54), (10, 55, 54), (1, 100, 63), (5, 3, 3),
])
def test_plan_clamps_max_new_tokens_to_the_context(tok, n_prompt, asked, expected):
    svc, _ = service(tok)
    plan = svc.plan(request(prompt_token_ids=[5] * n_prompt, max_new_tokens=asked))
    assert plan.max_new_tokens == expected


def test_plan_accepts_limits_at_the_edges(tok):
    svc, _ = service(tok)
    n = len(encode(tok, "Hello"))
    assert svc.plan(request(max_new_tokens=100)).max_new_tokens == 64 - n
    plan = svc.plan(request(prompt_token_ids=[767] * 63, max_new_tokens=1,
                            stop=["y" * MAX_STOP_CHARS] * MAX_STOP_STRINGS,
                            sampling=common_pb2.SamplingParams(top_p=1.0, seed=2**64 - 1)))
    assert plan.max_new_tokens == 1
    assert len(plan.stop) == MAX_STOP_STRINGS
