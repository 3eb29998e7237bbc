"""Function tools through the official `openai` client and LangChain against the real
HTTP API, with speculation on: forced calls follow their schemas greedy and sampled,
greedy calls equal target-only's, streamed calls equal unary ones, tool turns continue a
conversation, and bad tool input is a 400 naming its parameter while other requests are
served."""

from __future__ import annotations

import json
import threading

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
    "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "maximum": 999}, "b": {"type": "integer", "maximum": 999}},
    "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def ask(client, model, **kw):
    kw.setdefault("max_tokens", 96)
    kw.setdefault("temperature", 0)
    # the tiny random models never stop calling of their own accord: one call each
    kw.setdefault("parallel_tool_calls", False)
    return client.chat.completions.create(model=model, messages=kw.pop("messages", MESSAGES),
                                          tools=TOOLS, **kw)


def valid(calls) -> None:
    assert calls
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "add"}}])
def test_forced_calls_follow_the_schema_and_equal_target_only(client, model, choice):
    spec = ask(client, model, tool_choice=choice, extra_body={"num_draft_tokens": 4})
    alone = ask(client, model, tool_choice=choice, extra_body={"num_draft_tokens": 0})
    got = spec.choices[0]
    assert got.finish_reason == "tool_calls", got
    valid(got.message.tool_calls)
    if isinstance(choice, dict):
        assert [c.function.name for c in got.message.tool_calls] == ["add"]
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in alone.choices[0].message.tool_calls]
    assert spec.usage.model_extra["specdec"]["drafted_tokens"] > 0


def test_sampled_forced_calls_follow_the_schema_every_time(client, model):
    for seed in range(20):
        got = ask(client, model, tool_choice="required", temperature=1.0, seed=seed)
        assert got.choices[0].finish_reason == "tool_calls", (seed, got.choices[0])
        valid(got.choices[0].message.tool_calls)


def test_streamed_calls_join_to_the_unary_calls(client, model):
    for choice in ("required", "auto"):
        unary = ask(client, model, tool_choice=choice)
        calls, content, reason = {}, "", None
        for chunk in ask(client, model, tool_choice=choice,
                         stream=True):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for d in delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": d.id, "name": "", "args": ""})
                call["name"] += (d.function.name or "") if d.function else ""
                call["args"] += (d.function.arguments or "") if d.function else ""
            reason = chunk.choices[0].finish_reason or reason
        message = unary.choices[0].message
        assert reason == unary.choices[0].finish_reason
        assert content == (message.content or "")
        # (two requests: the ids differ; each stream's ids come once, with the names)
        assert all(c["id"].startswith("call_") for c in calls.values())
        assert [(c["name"], c["args"]) for c in calls.values()] == \
            [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def test_a_tool_result_continues_the_conversation(client, model):
    first = ask(client, model, tool_choice={"type": "function",
                                            "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    history = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    spec = ask(client, model, messages=history, tool_choice="none",
               extra_body={"num_draft_tokens": 4})
    alone = ask(client, model, messages=history, tool_choice="none",
                extra_body={"num_draft_tokens": 0})
    assert spec.choices[0].message.content == alone.choices[0].message.content
    assert spec.choices[0].message.tool_calls is None
    assert spec.usage.prompt_tokens > first.usage.prompt_tokens


def test_langchain_bind_tools_gets_the_calls(coordinator, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(model=model, base_url=coordinator[3] + "/v1", api_key="unused",
                     temperature=0, max_tokens=64, max_retries=0)
    out = llm.bind_tools([add], tool_choice="add").invoke("What is 2 + 3?")
    assert [c["name"] for c in out.tool_calls] == ["add"]
    assert set(out.tool_calls[0]["args"]) == {"a", "b"}


@pytest.mark.parametrize(("change", "param"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}}}]}, "tools"),
    ({"messages": [*MESSAGES, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
     "messages[1].tool_call_id"),
])
def test_bad_tool_input_is_a_400_and_others_are_served(client, model, change, param):
    other: dict = {}
    worker = threading.Thread(target=lambda: other.update(r=ask(client, model,
                                                                tool_choice="required")))
    worker.start()
    body = {"model": model, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 8, **change}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**body)
    assert info.value.body["param"] == param, info.value.body
    worker.join(60)
    valid(other["r"].choices[0].message.tool_calls)
