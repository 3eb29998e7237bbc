"""coordinator.api.openai_api / openai_responses: OpenAI bodies <-> Generator messages (pure)."""

from __future__ import annotations

import json

import pytest

from coordinator.api.openai_api import chat_request, completion_request, expand
from coordinator.api.openai_errors import APIError, from_exception
from coordinator.api.openai_responses import CHAT, COMPLETION, Responses, sse, usage
from specdec.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from specdec.v1 import generate_pb2

M = "smollm2-135m"
MSG = [{"role": "user", "content": "hi"}]


def test_chat_fields_map_onto_the_generate_request():
    req, opts = chat_request({"model": M, "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                     "text": "b"}]}],
        "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3,
        "stop": "END", "top_k": 5, "num_draft_tokens": 2, "stream": True,
        "stream_options": {"include_usage": True}, "timeout": 2.5, "n": 1,
        "logprobs": False, "presence_penalty": 0, "user": "u"}, M)
    assert [(m.role, m.content) for m in req.messages] == [("system", "be brief"),
                                                           ("user", "ab")]
    assert req.max_new_tokens == 7 and list(req.stop) == ["END"]
    s = req.sampling
    assert (round(s.temperature, 6), round(s.top_p, 6), s.top_k, s.seed) == (0.5, 0.9, 5, 3)
    assert req.HasField("num_draft_tokens") and req.num_draft_tokens == 2
    assert (opts.stream, opts.include_usage, opts.timeout_s) == (True, True, 2.5)


def test_defaults_are_openais():
    req, opts = chat_request({"model": M, "messages": MSG}, M)
    assert req.sampling.temperature == 1.0 and req.sampling.top_p == 1.0
    assert req.max_new_tokens == 0  # no limit: the HTTP layer fills in the server's cap
    assert not req.HasField("num_draft_tokens")  # the server's K
    assert (opts.stream, opts.include_usage, opts.timeout_s) == (False, False, None)
    seeds = {chat_request({"model": M, "messages": MSG}, M)[0].sampling.seed
             for _ in range(4)}
    assert len(seeds) > 1  # no seed: a fresh one per request, as OpenAI samples
    req, _ = completion_request({"model": M, "prompt": "x"}, M)
    assert req.max_new_tokens == 16 and req.prompt == "x"  # OpenAI's completions default


def test_completion_prompt_forms():
    assert completion_request({"model": M, "prompt": ["one"]}, M)[0].prompt == "one"
    ids = completion_request({"model": M, "prompt": [1, 2, 3]}, M)[0]
    assert list(ids.prompt_token_ids) == [1, 2, 3]
    assert list(completion_request({"model": M, "prompt": [[4, 5]]}, M)[0]
                .prompt_token_ids) == [4, 5]
    for bad in ([], "", [1.5], None, ["a", ""], [[1], []], ["a"] * 33):
        with pytest.raises(APIError) as info:
            completion_request({"model": M, "prompt": bad}, M)
        assert info.value.status == 400 and info.value.param == "prompt"


def test_a_batch_of_prompts_and_n_expand_in_openai_order():
    req, opts = completion_request({"model": M, "prompt": ["a", [7, 8]], "n": 2, "seed": 5},
                                   M)
    subs = expand(req, opts)
    assert [(s.prompt, list(s.prompt_token_ids)) for s in subs] == \
        [("a", []), ("a", []), ("", [7, 8]), ("", [7, 8])]
    seeds = [s.sampling.seed for s in subs]
    assert seeds[0] == seeds[2] == 5 and seeds[1] == seeds[3] != 5  # own seed per choice
    with pytest.raises(APIError) as info:
        completion_request({"model": M, "prompt": ["a"] * 5, "n": 8}, M)
    assert info.value.param == "prompt"


def test_sampling_parameters_reach_the_request():
    req, _ = chat_request({"model": M, "messages": MSG, "presence_penalty": 1.5,
                           "frequency_penalty": -0.5, "logit_bias": {"12": -100, "7": 3.5},
                           "repetition_penalty": 1.2, "min_p": 0.1, "logprobs": True,
                           "top_logprobs": 4}, M)
    s = req.sampling
    assert (s.presence_penalty, s.frequency_penalty, dict(s.logit_bias)) == \
        (1.5, -0.5, {12: -100.0, 7: 3.5})
    assert s.repetition_penalty == pytest.approx(1.2) and s.min_p == pytest.approx(0.1)
    assert req.logprobs == 4 and not req.prompt_logprobs
    req, opts = completion_request({"model": M, "prompt": "hi", "echo": True,
                                    "logprobs": 2, "max_tokens": 0}, M)
    assert (req.logprobs, req.prompt_logprobs, req.max_new_tokens) == (2, True, 0)
    assert opts.echo and opts.logprobs == 2
    req, opts = completion_request({"model": M, "prompt": "hi", "echo": True,
                                    "max_tokens": 0}, M)  # echo alone: the prompt back
    assert req.prompt_logprobs and opts.logprobs is None


@pytest.mark.parametrize(("change", "param"), [
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
    ({"logprobs": 3}, "logprobs"),  # the chat API's is a boolean
    ({"n": 0}, "n"), ({"n": 9}, "n"), ({"n": 1.5}, "n"),
    ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"-3": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"5": "a"}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": 1.5}, "min_p"),
])
def test_sampling_parameters_out_of_range_are_400_naming_them(change, param):
    with pytest.raises(APIError) as info:
        chat_request({"model": M, "messages": MSG, **change}, M)
    assert (info.value.status, info.value.param) == (400, param), info.value.message


@pytest.mark.parametrize(("change", "param"), [
    ({"logprobs": 6}, "logprobs"), ({"echo": "yes"}, "echo"),
    ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo
])
def test_completion_logprobs_and_echo_are_checked(change, param):
    with pytest.raises(APIError) as info:
        completion_request({"model": M, "prompt": "hi", **change}, M)
    assert (info.value.status, info.value.param) == (400, param), info.value.message


@pytest.mark.parametrize(("change", "status", "param"), [
    ({"model": "other"}, 404, "model"),
    ({"n": 30}, 400, "n"),
    ({"tools": [{}]}, 400, "tools"),
    ({"tool_choice": "auto"}, 400, "tool_choice"),
    ({"response_format": {"type": "xml"}}, 400, "response_format"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"temperature": True}, 400, "temperature"),
    ({"top_p": 1.5}, 400, "top_p"),
    ({"seed": 1.5}, 400, "seed"),
    ({"top_k": -1}, 400, "top_k"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, 400, "max_tokens"),
    ({"max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content"),
    ({"messages": ["hi"]}, 400, "messages[0]"),
    ({"stream": "yes"}, 400, "stream"),
    ({"timeout": 0}, 400, "timeout"),
    ({"num_draft_tokens": "4"}, 400, "num_draft_tokens"),
    ({"frobnicate": 1}, 400, "frobnicate"),
])
def test_bad_chat_bodies(change, status, param):
    with pytest.raises(APIError) as info:
        chat_request({"model": M, "messages": MSG, **change}, M)
    err = info.value
    assert (err.status, err.param) == (status, param), err.message
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]


# Found by tests/fuzz (each was a 500 with a UnicodeEncodeError, OverflowError or
# ValueError from protobuf): lone surrogates (JSON "\ud800" escapes), integers beyond a
# double, token ids beyond 32 bits.
@pytest.mark.parametrize(("change", "param"), [
    ({"messages": [{"role": "user", "content": "\udc00x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages"),
    ({"stop": ["ok", "\ud800"]}, "stop"),
    ({"model": "\udfff"}, "model"),
    ({"user": {"\ud800": 1}}, "user"),
    ({"\ud800": 1}, None),
    ({"temperature": 10**400}, "temperature"),
    ({"timeout": -10**400}, "timeout"),
    ({"presence_penalty": 10**309}, "presence_penalty"),
])
def test_hostile_values_are_400_not_500(change, param):
    with pytest.raises(APIError) as info:
        chat_request({"model": M, "messages": MSG, **change}, M)
    err = info.value
    assert (err.status, err.param) == (400, param), err.message
    assert err.message


@pytest.mark.parametrize("prompt", ["\ud800", ["\udbff"], [10**30], [[2**31]], [-1], [1, -2**31]])
def test_hostile_completion_prompts_are_400(prompt):
    with pytest.raises(APIError) as info:
        completion_request({"model": M, "prompt": prompt}, M)
    assert (info.value.status, info.value.param) == (400, "prompt"), info.value.message


def test_domain_errors_get_http_statuses():
    cases = [(InvalidArgument("x"), 400), (ResourceExhausted("x"), 429),
             (Unavailable("x"), 503), (DeadlineExceeded("x"), 504), (KeyError("x"), 500)]
    for exc, status in cases:
        err = from_exception(exc)
        assert err.status == status
    assert "KeyError" in from_exception(KeyError("secret")).message
    assert "secret" not in from_exception(KeyError("secret")).message


def _chunk(ids, kinds, texts, reason=""):
    return generate_pb2.GenerateChunk(text="".join(texts), token_ids=ids, kinds=kinds,
                                      token_texts=texts, finish_reason=reason)


def test_chunks_and_usage_in_openais_shapes():
    r = Responses(CHAT, M)
    first = r.chunk(_chunk([5, 6], [1, 3], ["a", "b"]), first=True)
    last = r.chunk(_chunk([7], [2], ["c"], "eos"), first=False)
    assert first["object"] == "chat.completion.chunk" and first["id"] == last["id"]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "ab"}
    assert last["choices"][0]["delta"] == {"content": "c"}
    assert last["choices"][0]["finish_reason"] == "stop"
    assert first["specdec"] == {"token_ids": [5, 6], "kinds": ["accepted", "bonus"],
                                "token_texts": ["a", "b"]}
    stats = generate_pb2.GenerationStats(prompt_tokens=4, generated_tokens=3, rounds=2,
                                         drafted_tokens=4, accepted_tokens=3, seconds=0.5)
    u = usage(stats)
    assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (4, 3, 7)
    # OpenAI's prediction fields count Predicted Outputs only: 0 without a prediction
    assert u["completion_tokens_details"] == {"accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0}
    predicted = generate_pb2.GenerationStats(prediction_tokens=10,
                                             prediction_drafted_tokens=8,
                                             prediction_accepted_tokens=7)
    assert usage(predicted)["completion_tokens_details"] == {
        "accepted_prediction_tokens": 7, "rejected_prediction_tokens": 3}
    assert u["specdec"]["acceptance_rate"] == 0.75 and u["specdec"]["tokens_per_round"] == 1.5
    assert usage(generate_pb2.GenerationStats())["specdec"]["acceptance_rate"] is None
    tail = r.usage_chunk(stats)
    assert tail["choices"] == [] and tail["usage"]["total_tokens"] == 7
    assert Responses(COMPLETION, M).chunk(_chunk([1], [4], ["x"], "length"), True)[
        "choices"][0] == {"index": 0, "text": "x", "finish_reason": "length", "logprobs": None}
    line = sse({"a": "é"})
    assert line.startswith("data: ") and line.endswith("\n\n")
    assert json.loads(line[6:]) == {"a": "é"}


def test_service_errors_name_the_openai_parameter():
    err = from_exception(InvalidArgument("num_draft_tokens must be in [0, 8], got 99"))
    assert (err.status, err.param) == (400, "num_draft_tokens")
    assert from_exception(InvalidArgument("max_new_tokens must be in [1, 4096]")).param == \
        "max_tokens"
    assert from_exception(InvalidArgument("prompt is 9000 tokens; ...")).param is None
