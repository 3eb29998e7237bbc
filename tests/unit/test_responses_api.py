"""The Responses API's pure parts: a request planned into a chat body (input items,
instructions, tools, text.format, the stored conversation), errors naming the Responses
parameter, the output items and stream events built from generated text, and the
bounded SQLite store shared by replicas."""

from __future__ import annotations

import json
import random

import pytest

from coordinator.api.openai_api import chat_request
from coordinator.api.openai_errors import APIError
from coordinator.api.response_store import ResponseStore
from coordinator.api.responses_api import plan, renamed
from coordinator.api.responses_out import ResponseBuilder
from specdec.v1 import generate_pb2

M = "tiny"
ADD = {"type": "function", "name": "add", "description": "Add",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def test_input_items_become_chat_turns_after_the_stored_conversation():
    previous = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    p = plan({"model": M, "instructions": "Be brief.", "tools": [ADD],
              "tool_choice": {"type": "function", "name": "add"}, "max_output_tokens": 9,
              "input": [{"role": "user", "content": [{"type": "input_text", "text": "1+1?"}]},
                        {"type": "function_call", "call_id": "c1", "name": "add",
                         "arguments": '{"a": 1}'},
                        {"type": "function_call", "call_id": "c2", "name": "add",
                         "arguments": '{"a": 2}'},
                        {"type": "function_call_output", "call_id": "c1", "output": "2"}]},
             previous)
    chat = p.chat
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat["messages"][1:3] == previous and p.history[:2] == previous
    assert [c["id"] for c in chat["messages"][4]["tool_calls"]] == ["c1", "c2"]
    assert chat["messages"][5] == {"role": "tool", "tool_call_id": "c1", "content": "2"}
    assert chat["tools"][0]["function"]["name"] == "add"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["max_tokens"] == 9 and p.store and p.echo["instructions"] == "Be brief."
    req, opts = chat_request(chat, M)  # the chat API takes it as it is
    assert opts.tools and req.messages[4].tool_calls[1].id == "c2"


def test_text_format_becomes_the_response_format():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    p = plan({"model": M, "input": "x?", "text": {"format": {
        "type": "json_schema", "name": "X", "schema": schema, "strict": True}}}, None)
    assert p.chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "X", "schema": schema, "strict": True}}
    assert "response_format" not in plan({"model": M, "input": "x",
                                          "text": {"format": {"type": "text"}}}, None).chat


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({}, "input"),
    ({"input": [{"type": "input_image"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "store": "yes"}, "store"),
])
def test_bad_requests_name_the_responses_parameter(body, param):
    with pytest.raises(APIError) as info:
        plan({"model": M, **body}, None)
    assert (info.value.status, info.value.param) == (400, param)


@pytest.mark.parametrize(("body", "param"), [
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "X", "schema": {"type": "wat"}}}},
     "text.format"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
])
def test_chat_errors_are_renamed(body, param):
    with pytest.raises(APIError) as info:
        try:
            chat_request(plan({"model": M, "input": "x", **body}, None).chat, M)
        except APIError as exc:
            raise renamed(exc) from None
    assert (info.value.status, info.value.param) == (400, param)


TEXT = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>')
STATS = generate_pb2.GenerationStats(prompt_tokens=5, generated_tokens=30)


def test_output_items_and_events_agree_for_any_chunking():
    whole = ResponseBuilder(M, {}, tools=True)
    _, final = whole.finish(TEXT, "eos", STATS)
    assert [i["type"] for i in final["output"]] == ["message", "function_call",
                                                      "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Let me add.\n"
    assert [json.loads(i["arguments"]) for i in final["output"][1:]] == [{"a": 1}, {"a": 2}]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 30
    assert whole.assistant_turns()[0]["tool_calls"][1]["function"]["arguments"] == '{"a": 2}'
    rng = random.Random(3)
    for _ in range(100):
        b = ResponseBuilder(M, {}, tools=True)
        events, i = b.start(), 0
        while i < len(TEXT) - 5:
            n = rng.randint(1, 9)
            events += b.feed(TEXT[i:i + n])
            i += n
        more, streamed = b.finish(TEXT[i:], "eos", STATS)
        events += more
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        args = "".join(e["delta"] for e in events
                       if e["type"] == "response.function_call_arguments.delta")
        assert text == "Let me add.\n" and args == '{"a": 1}{"a": 2}'
        assert [(i["type"], i.get("arguments")) for i in streamed["output"]] == \
            [(i["type"], i.get("arguments")) for i in final["output"]]


def test_a_cut_response_is_incomplete():
    _, final = ResponseBuilder(M, {}, tools=False).finish("abc", "length", STATS)
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_store_is_shared_bounded_in_number_and_age(tmp_path):
    now = [1000.0]
    path = tmp_path / "r.sqlite3"
    a = ResponseStore(path, max_entries=3, max_age_s=100, clock=lambda: now[0])
    b = ResponseStore(path, max_entries=3, max_age_s=100, clock=lambda: now[0])
    for i in range(5):
        now[0] += 1
        assert a.put(f"r{i}", {"i": i})
    assert b.get("r0") is None and b.get("r4") == {"i": 4} and len(b) == 3
    now[0] += 150
    assert b.get("r4") is None  # expired
    assert b.delete("r3") and not b.delete("r3")
    small = ResponseStore(path, max_record_bytes=10)
    assert not small.put("big", {"text": "x" * 100}) and small.get("big") is None
