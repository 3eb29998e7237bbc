"""The Responses API through the official `openai` client and the OpenAI Agents SDK
against a real coordinator: text, function_call items, streamed events, text.format,
conversations continued through previous_response_id on another replica and after a
restart (the shared store), and a 404 for an unknown id."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.conftest import start_coordinator

pytestmark = pytest.mark.slow

ADD = {"type": "function", "name": "add", "description": "Add two integers",
       "parameters": {"type": "object", "properties": {
           "a": {"type": "integer", "maximum": 99}, "b": {"type": "integer", "maximum": 99}},
           "required": ["a", "b"], "additionalProperties": False}}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 10}}, "required": ["city"],
               "additionalProperties": False}}


# The agent's tool parameters and answer, bounded: the tiny model fills them at random.
Small = Annotated[int, Field(ge=0, le=99)]
City = Annotated[str, Field(max_length=8)]


class Verdict(BaseModel):
    answer: Literal["yes", "no"]


def create(client, model, **kw):
    kw.setdefault("max_output_tokens", 48)
    kw.setdefault("temperature", 0)
    return client.responses.create(model=model, **kw)


def test_text_and_usage(client, model):
    r = create(client, model, input="Say hello.", instructions="Be brief.")
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.output[0].type == "message" and r.usage.output_tokens > 0
    assert r.instructions == "Be brief."
    same = create(client, model, input="Say hello.", instructions="Be brief.",
                  extra_body={"num_draft_tokens": 0})
    assert same.output_text == r.output_text  # greedy: equal to target-only


def test_function_call_items_and_the_result_continues(client, model):
    r = create(client, model, input="What is 2 + 3?", tools=[ADD, WEATHER],
               tool_choice={"type": "function", "name": "add"}, max_output_tokens=96)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "add" and set(json.loads(call.arguments)) == {"a", "b"}
    follow = create(client, model, previous_response_id=r.id, tools=[ADD, WEATHER],
                    tool_choice="none",
                    input=[{"type": "function_call_output", "call_id": call.call_id,
                            "output": "5"}])
    assert follow.previous_response_id == r.id and follow.output_text
    assert follow.usage.input_tokens > r.usage.input_tokens
    assert client.responses.retrieve(follow.id).output_text == follow.output_text


def test_streamed_events(client, model):
    events = list(create(client, model, input="Count to five.", stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in ("response.completed",
                                                           "response.incomplete")
    assert "response.output_text.delta" in types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    assert text == create(client, model, input="Count to five.").output_text
    # the SDK's stream helper accumulates the events into the final response
    with client.responses.stream(model=model, input="What is 2 + 3?", tools=[ADD],
                                 tool_choice="required", parallel_tool_calls=False,
                                 max_output_tokens=96, temperature=0) as stream:
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and set(json.loads(call.arguments)) == {"a", "b"}


def test_text_format_gives_json(client, model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = create(client, model, input="Is it sunny? Answer as JSON.",
               text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                "strict": True}})
    assert isinstance(json.loads(r.output_text)["ok"], bool)


def test_an_unknown_previous_response_is_a_404(client, model):
    with pytest.raises(openai.NotFoundError) as info:
        create(client, model, input="x", previous_response_id="resp_nope")
    assert info.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    with pytest.raises(openai.BadRequestError) as info:
        create(client, model, input="x", max_output_tokens=0)
    assert info.value.body["param"] == "max_output_tokens"


def _call_and_result(c, model):
    """A forced call to ADD, and the function_call_output that answers it."""
    first = create(c, model, input="What is 2 + 3?", tools=[ADD], tool_choice="required",
                   parallel_tool_calls=False, max_output_tokens=96)
    (call,) = [o for o in first.output if o.type == "function_call"]
    return first, [{"type": "function_call_output", "call_id": call.call_id, "output": "5"}]


@pytest.mark.long  # a coordinator of two replicas (~37 s; make test-long, CI runs it)
def test_a_conversation_continues_on_another_replica(draft_server, target_server, tmp_path):
    args = ["--draft", draft_server[0], "--target", target_server[0], "--min-replicas", "2",
            "--max-replicas", "2", "--expose-replicas", "--response-store",
            str(tmp_path / "responses.sqlite3")]
    proc, _, http = start_coordinator(args)
    try:
        with openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused",
                           max_retries=0, timeout=60) as c:
            model = c.models.list().data[0].id
            first, result = _call_and_result(c, model)
            served = first.usage.model_extra["specdec"]["coordinator_replica"]
            other = None
            for _ in range(20):  # Serve picks the replica; ask until the other one does
                r = create(c, model, input=result, previous_response_id=first.id,
                           tools=[ADD], tool_choice="none")
                if r.usage.model_extra["specdec"]["coordinator_replica"] != served:
                    other = r
                    break
            assert other is not None, "every continuation went to the same replica"
            assert other.usage.input_tokens > first.usage.input_tokens
    finally:
        assert proc.stop() == 0


@pytest.mark.long  # a second coordinator start (make test-long; CI runs it)
def test_a_conversation_continues_after_a_restart(draft_server, target_server, tmp_path):
    """A full coordinator restart: the store is all that is left, and the continuation
    is the one the first coordinator gave."""
    args = ["--draft", draft_server[0], "--target", target_server[0], "--response-store",
            str(tmp_path / "responses.sqlite3")]
    answers = []
    for restart in (False, True):
        proc, _, http = start_coordinator(args)
        try:
            with openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused",
                               max_retries=0, timeout=60) as c:
                model = c.models.list().data[0].id
                if not restart:
                    first, result = _call_and_result(c, model)
                answers.append(create(c, model, input=result, previous_response_id=first.id,
                                      tools=[ADD], tool_choice="none"))
        finally:
            assert proc.stop() == 0
    before, again = answers
    assert again.usage.input_tokens == before.usage.input_tokens > first.usage.input_tokens
    assert again.output_text == before.output_text


def test_the_agents_sdk_runs_an_agent_loop(coordinator, model):
    """The SDK's loop against the Responses API: a forced first call (function_call
    items), the SDK runs the tool and sends its output back (function_call_output
    items), then a typed final answer (text.format beside the tools). A typed answer
    because the tiny random model never ends free text of its own accord."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def add(a: Small, b: Small) -> int:
        """Add two integers."""
        called.append("add")
        return a + b

    @function_tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        called.append("get_weather")
        return "sunny"

    client = openai.AsyncOpenAI(base_url=coordinator[3] + "/v1", api_key="unused",
                                max_retries=0)
    agent = Agent(name="helper", instructions="Use the tools, then answer.",
                  tools=[add, get_weather], output_type=Verdict,
                  model=OpenAIResponsesModel(model=model, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0,
                                               max_tokens=64, parallel_tool_calls=False))
    result = Runner.run_sync(agent, "Is 2 + 3 five, and is it sunny in Oslo?", max_turns=6)
    assert called, "the agent called no tool"
    assert isinstance(result.final_output, Verdict)
    assert any(item.type == "tool_call_output_item" for item in result.new_items)

    async def streamed():  # the same loop over streamed responses (a client of this loop)
        fresh = openai.AsyncOpenAI(base_url=coordinator[3] + "/v1", api_key="unused",
                                   max_retries=0)
        run = Runner.run_streamed(agent.clone(model=OpenAIResponsesModel(
            model=model, openai_client=fresh)), "Is 2 + 3 five?", max_turns=6)
        async for _ in run.stream_events():
            pass
        return run

    called.clear()
    run = asyncio.run(streamed())
    assert called and isinstance(run.final_output, Verdict)
