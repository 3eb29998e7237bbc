"""Structured outputs through real clients against the real HTTP API: the `openai`
client's parse() with Pydantic models, LangChain's with_structured_output, vLLM's
structured_outputs / guided_* fields, streaming, gRPC; every bad constraint is a 400
naming its parameter while the server keeps serving."""

from __future__ import annotations

import json
import re
import time
from typing import Literal

import grpc
import openai
import pytest
from pydantic import BaseModel, Field

from specdec import wire
from specdec.grammar import Grammar
from specdec.v1 import common_pb2, generate_pb2

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Describe the weather as JSON."}]


class Weather(BaseModel):
    sunny: bool
    temperature: int = Field(ge=-20, le=45)
    wind: Literal["calm", "breeze", "storm"]


def chat(client, model, **kw):
    kw.setdefault("max_tokens", 80)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=model, messages=MESSAGES, **kw)


def test_parse_returns_the_pydantic_object_as_target_only_would(client, model):
    for _ in range(3):
        got = client.chat.completions.parse(model=model, messages=MESSAGES, max_tokens=80,
                                            temperature=0, response_format=Weather,
                                            extra_body={"num_draft_tokens": 4})
        if got.usage.model_extra["specdec"]["drafted_tokens"] > 0:
            break
        # the shared test coordinator's draft may be backing off for a second after a
        # failure (a Propose past its deadline on a loaded machine): a grammar that broke
        # the draft would fail every try
        time.sleep(1.5)
    message = got.choices[0].message
    assert got.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Weather)
    assert Weather.model_validate_json(message.content) == message.parsed
    alone = client.chat.completions.parse(model=model, messages=MESSAGES, max_tokens=80,
                                          temperature=0, response_format=Weather,
                                          extra_body={"num_draft_tokens": 0})
    assert alone.choices[0].message.content == message.content  # token for token
    assert got.usage.model_extra["specdec"]["drafted_tokens"] > 0


def test_sampled_parse_is_valid_for_every_seed(client, model):
    for seed in range(5):
        got = client.chat.completions.parse(model=model, messages=MESSAGES, max_tokens=80,
                                            temperature=1.0, seed=seed, response_format=Weather)
        assert isinstance(got.choices[0].message.parsed, Weather), seed


def test_langchain_with_structured_output_returns_the_object(coordinator, model):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=coordinator[3] + "/v1", api_key="unused",
                     temperature=0, max_tokens=80, max_retries=0)
    out = llm.with_structured_output(Weather).invoke("Describe the weather as JSON.")
    assert isinstance(out, Weather)


def test_json_object_and_streamed_json_schema(client, model):
    choice = chat(client, model, response_format={"type": "json_object"}).choices[0]
    if choice.finish_reason == "stop":  # any object: the tiny model may write a long one
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.startswith("{")
    fmt = {"type": "json_schema", "json_schema": {
        "name": "weather", "schema": Weather.model_json_schema(), "strict": False}}
    whole = chat(client, model, response_format=fmt).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(
        client, model, response_format=fmt, stream=True) if c.choices)
    assert streamed == whole
    Weather.model_validate_json(whole)


@pytest.mark.parametrize("extra, pattern", [
    ({"structured_outputs": {"regex": "(yes|no), [0-9]{1,3}"}}, r"(yes|no), [0-9]{1,3}"),
    ({"structured_outputs": {"choice": ["alpha", "beta"]}}, r"alpha|beta"),
    ({"guided_choice": ["red", "green blue"]}, r"red|green blue"),
    ({"guided_regex": "[a-c]{2,5}"}, r"[a-c]{2,5}"),
    ({"structured_outputs": {"grammar": 'start: "f(" /[0-9]/ ")"'}}, r"f\([0-9]\)"),
    ({"guided_grammar": 'root ::= "v" [0-9] "." [0-9]'}, r"v[0-9]\.[0-9]"),
])
def test_vllm_fields_constrain_chat_and_completions(client, model, extra, pattern):
    text = chat(client, model, extra_body=extra).choices[0].message.content
    assert re.fullmatch(pattern, text), text
    done = client.completions.create(model=model, prompt="Answer:", max_tokens=40,
                                     temperature=0.7, seed=1, extra_body=extra)
    assert re.fullmatch(pattern, done.choices[0].text), done.choices[0].text


def test_grpc_generate_takes_a_grammar(generator_stub):
    req = generate_pb2.GenerateRequest(
        messages=[generate_pb2.ChatMessage(role="user", content="Say yes or no.")],
        max_new_tokens=40, sampling=common_pb2.SamplingParams(seed=3))
    req.sampling.grammar.CopyFrom(wire.grammar_to_proto(
        Grammar.of("choice", json.dumps(["yes", "no"]))))
    assert generator_stub.Generate(req).text in ("yes", "no")
    streamed = "".join(c.text for c in generator_stub.GenerateStream(req))
    assert streamed in ("yes", "no")
    req.sampling.grammar.spec = "[oops"
    req.sampling.grammar.kind = common_pb2.Grammar.KIND_REGEX
    with pytest.raises(grpc.RpcError) as info:
        generator_stub.Generate(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling.grammar" in info.value.details()


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"guided_regex": "[z-a]"}, "guided_regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_grammar": 'start: "a" x\nx[stop="."]: /[a-z]+/'}, "guided_grammar"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
])
def test_a_bad_constraint_is_400_naming_it(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, model, extra_body=extra)
    assert info.value.param == param, info.value.message
    assert chat(client, model, max_tokens=4).choices  # still serving
