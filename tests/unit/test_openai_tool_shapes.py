"""Function tools in OpenAI's chat request and response shapes (pure logic): the
request's tools, tool_choice and tool turns reach the GenerateRequest with the grammar
that constrains the calls; every bad tool input is a 400 naming its parameter; a
response's calls are the same unary and streamed, however the text is chunked."""

from __future__ import annotations

import json
import random

import pytest

from coordinator.api.openai_api import chat_request
from coordinator.api.openai_errors import APIError
from coordinator.api.openai_responses import CHAT, Choice, Responses
from specdec.v1 import common_pb2, generate_pb2

M = "tiny"
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]


def request(**body):
    return chat_request({"model": M, "messages": MSG, **body}, M)


def test_tools_and_choice_reach_the_request_with_their_grammar():
    req, opts = request(tools=[WEATHER, ADD])
    assert opts.tools and json.loads(req.tools)[0]["function"]["name"] == "get_weather"
    assert req.sampling.grammar.kind == common_pb2.Grammar.KIND_LARK
    assert "head[lazy]" in req.sampling.grammar.spec
    req, _ = request(tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False)
    assert "head" not in req.sampling.grammar.spec and "fn_1" in req.sampling.grammar.spec
    req, _ = request(tools=[WEATHER, ADD],
                     tool_choice={"type": "function", "function": {"name": "add"}})
    assert '"const": "add"' in req.sampling.grammar.spec
    assert '"const": "get_weather"' not in req.sampling.grammar.spec
    req, opts = request(tools=[WEATHER], tool_choice="none")
    assert req.tools and not req.sampling.HasField("grammar")
    assert not opts.tools


def test_a_json_answer_combines_with_auto_and_yields_to_forced_calls():
    fmt = {"type": "json_schema", "json_schema": {"name": "v", "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}}}}
    req, _ = request(tools=[WEATHER], response_format=fmt)
    assert 'answer: %json {"type": "object", "properties": {"ok"' in req.sampling.grammar.spec
    req, _ = request(tools=[WEATHER], response_format=fmt, tool_choice="required")
    assert "answer" not in req.sampling.grammar.spec
    req, _ = request(tools=[WEATHER], response_format=fmt, tool_choice="none")
    assert req.sampling.grammar.kind == common_pb2.Grammar.KIND_JSON_SCHEMA


def test_tool_turns_reach_the_request():
    req, _ = chat_request({"model": M, "messages": HISTORY, "tools": [WEATHER]}, M)
    assistant, tool = req.messages[1], req.messages[2]
    assert assistant.content == "" and assistant.tool_calls[0].name == "get_weather"
    assert json.loads(assistant.tool_calls[0].arguments) == {"city": "Paris"}
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "call_1", "18 C, sunny")


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "structured_outputs": {"regex": "a+"}}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [*HISTORY[:2], {**HISTORY[2], "tool_call_id": "call_9"}]},
     "messages[2].tool_call_id"),
    ({"messages": [HISTORY[0], HISTORY[2]]}, "messages[1].tool_call_id"),
    ({"messages": [HISTORY[0], {"role": "assistant", "tool_calls": [{"id": "c"}]}]},
     "messages[1].tool_calls"),
])
def test_bad_tool_input_is_a_400_naming_the_parameter(change, param):
    with pytest.raises(APIError) as info:
        chat_request({"model": M, "messages": MSG, **change}, M)
    assert (info.value.status, info.value.param) == (400, param), info.value.message


TEXT = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')


def test_unary_and_streamed_calls_are_equal_for_any_chunking():
    responses = Responses(CHAT, M)
    unary = responses.unary(generate_pb2.GenerateResponse(text=TEXT, finish_reason="eos"),
                            [(Choice(tools=True), generate_pb2.GenerateResponse(
                                text=TEXT, finish_reason="eos"))])
    message = unary["choices"][0]["message"]
    assert unary["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] == "Checking.\n"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "add"]
    rng = random.Random(7)
    for _ in range(200):
        choice, cuts = Choice(tools=True), sorted(rng.sample(range(1, len(TEXT)), 12))
        pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)], strict=True)]
        content, calls, reason = "", {}, None
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            chunk = generate_pb2.GenerateChunk(text=piece, finish_reason="eos" if last else "")
            body = responses.chunk(chunk, i == 0, choice)["choices"][0]
            content += body["delta"].get("content") or ""
            for d in body["delta"].get("tool_calls", []):
                call = calls.setdefault(d["index"], {"id": d.get("id"), "name": "", "args": ""})
                call["name"] += d.get("function", {}).get("name", "")
                call["args"] += d["function"].get("arguments", "")
            reason = body["finish_reason"] or reason
        assert reason == "tool_calls" and content == message["content"]
        assert [(c["id"], c["name"], c["args"]) for c in calls.values()] == [
            (c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in message["tool_calls"]]
