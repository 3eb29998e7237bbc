"""specdec.tool_calls: the streaming parser gives the same content and calls for any
chunking of a text, and the tool grammar allows exactly the calls it should (on the tiny
tokenizer, through the matcher both services use)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specdec.grammar import Grammars, check
from specdec.runtime.models import TINY_VOCAB, load_tokenizer
from specdec.tool_calls import (
    Arguments,
    CallStart,
    Content,
    Parsed,
    ToolCall,
    ToolCallParser,
    fold,
    grammar_for,
    parse,
)

WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city"]}}
ADD = {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}


def call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


# Streams as the grammar makes models write them, and as models write them unconstrained.
RECORDED = [
    call("get_weather", '{"city": "Paris"}'),
    "Let me look.\n" + call("get_weather", '{"city": "Paris", "unit": "c"}'),
    call("add", '{"a": 1, "b": 2}') + "\n" + call("get_weather", '{"city": "Oslo"}'),
    call("f", '{"x": {"y": [1, {"z": "}"}]}}') + "\n\n" + call("g", "{}"),
    call("echo", '{"s": "a <tool_call> in a string }}"}'),
    "Plain text with < and </tool and <tool_ca but no call.",
    "text <tool_call>not json</tool_call> more",
    call("add", '{"a": 1, "b": 2}') + "\nand some text after",
    '<tool_call>\n{"name": "cut", "arguments": {"a": "unfinished',
    '<tool_call>\n{"name": "cut", "arguments": {"a": 1}}\n</tool',
    '<tool_call>\n{"name":"tight","arguments":{"k":1}}\n</tool_call>',
    "",
]


# Streams recorded from the Qwen2.5-Coder pair (one chunk per speculative round, several
# tokens each; tool_choice auto and required, one to three calls, plain answers).
QWEN = json.loads((Path(__file__).parent / "data" / "qwen_tool_streams.json").read_text())


def chunked(text: str, rng: random.Random) -> Parsed:
    parser, events, i = ToolCallParser(), [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 13, 40])
        events += parser.feed(text[i:i + n])
        i += n
    return fold(events + parser.finish())


def test_whole_texts_parse_to_their_calls():
    assert parse(RECORDED[1]) == Parsed("Let me look.\n", [
        ToolCall("get_weather", '{"city": "Paris", "unit": "c"}')])
    assert parse(RECORDED[2]).calls == [ToolCall("add", '{"a": 1, "b": 2}'),
                                        ToolCall("get_weather", '{"city": "Oslo"}')]
    assert parse(RECORDED[3]).calls[0].arguments == '{"x": {"y": [1, {"z": "}"}]}}'
    assert parse(RECORDED[4]).calls[0].arguments == '{"s": "a <tool_call> in a string }}"}'
    assert parse(RECORDED[5]) == Parsed(RECORDED[5], [])
    assert parse(RECORDED[6]) == Parsed(RECORDED[6], [])  # not a call: kept as text
    assert parse(RECORDED[7]).content == "\nand some text after"
    assert parse(RECORDED[8]).calls == [ToolCall("cut", '{"a": "unfinished')]
    assert parse(RECORDED[9]).calls == [ToolCall("cut", '{"a": 1}')]  # cut in the tag
    assert parse(RECORDED[10]).calls == [ToolCall("tight", '{"k":1}')]
    for calls in (parse(t).calls for t in RECORDED[:4]):
        assert all(isinstance(json.loads(c.arguments), dict) for c in calls)


@pytest.mark.parametrize("text", RECORDED)
def test_a_thousand_random_chunkings_give_the_calls_of_the_whole_text(text):
    rng = random.Random(hash(text) % 1000)
    whole = parse(text)
    for _ in range(1000):
        assert chunked(text, rng) == whole


@pytest.mark.parametrize("stream", QWEN["streams"], ids=lambda s: s["prompt"][:24])
def test_recorded_streams_give_their_calls_as_recorded_and_rechunked(stream):
    text = "".join(stream["chunks"])
    whole = parse(text)
    parser, events = ToolCallParser(), []
    for chunk in stream["chunks"]:  # as the rounds came
        events += parser.feed(chunk)
    assert fold(events + parser.finish()) == whole
    if "<tool_call>" in text:
        assert whole.calls and all(isinstance(json.loads(c.arguments), dict)
                                   for c in whole.calls)
    rng = random.Random(len(text))
    for _ in range(1000):
        assert chunked(text, rng) == whole


def test_events_come_as_soon_as_they_are_sure():
    parser = ToolCallParser()
    assert parser.feed("Hi <tool") == [Content("Hi ")]
    assert parser.feed('_call>\n{"name": "add", "arguments": {"a"') == [
        CallStart(0, "add"), Arguments(0, '{"a"')]
    assert parser.feed(": 1}") == [Arguments(0, ": 1")]  # the brace may end the call
    assert parser.feed("}\n</tool_") == [Arguments(0, "}")]
    assert parser.feed("call>") == []
    assert parser.finish() == []


# -- the grammar, through the matcher ------------------------------------------------------

TOKENIZER = load_tokenizer("tiny-random")


def allowed(grammar, text: str) -> bool:
    """The whole text is allowed, and the grammar may end after it."""
    state = Grammars(lambda: TOKENIZER, TINY_VOCAB).new_state(grammar, 0)
    tokens = TOKENIZER.encode(text, add_special_tokens=False)
    if state.valid_prefix(tokens) != len(tokens):
        return False
    for t in tokens:
        state.consume(t)
    return bool(state.matcher.is_accepting())


def test_required_allows_calls_that_follow_the_schemas_and_nothing_else():
    g = grammar_for([WEATHER, ADD], "required")
    assert check(g) == ""
    assert allowed(g, call("get_weather", '{"city": "Paris"}'))
    assert allowed(g, call("add", '{"a": 1, "b": 2}') + "\n" + call("add", '{"a": 3, "b": 4}'))
    assert not allowed(g, "Hello")
    assert not allowed(g, call("get_weather", '{"town": "Paris"}'))  # not the schema
    assert not allowed(g, call("add", '{"a": "1", "b": 2}'))
    assert not allowed(g, call("nope", "{}"))
    assert not allowed(g, call("add", '{"a":1,"b":2}'))  # not the compact form


def test_named_and_no_parallel_allow_one_call():
    g = grammar_for([WEATHER, ADD], "add")
    assert allowed(g, call("add", '{"a": 1, "b": 2}'))
    assert not allowed(g, call("get_weather", '{"city": "Paris"}'))
    two = call("add", '{"a": 1, "b": 2}') + "\n" + call("add", '{"a": 1, "b": 2}')
    assert not allowed(g, two)
    assert not allowed(grammar_for([WEATHER, ADD], "required", parallel=False), two)


def test_auto_leaves_text_free_until_the_opening_then_constrains():
    g = grammar_for([WEATHER, ADD], "auto")
    assert check(g) == ""
    assert allowed(g, "The answer is 4, no tool needed.")
    assert allowed(g, call("add", '{"a": 1, "b": 2}'))
    assert allowed(g, "Let me add.\n" + call("add", '{"a": 1, "b": 2}'))
    assert not allowed(g, "Let me add.\n<tool_call>\nadd(1, 2)")
    assert not allowed(g, call("add", '{"a": 1}'))  # b is required


def test_auto_with_an_answer_schema_allows_that_json_or_calls():
    g = grammar_for([WEATHER, ADD], "auto", answer={
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    assert check(g) == ""
    assert allowed(g, '{"ok": true}')
    assert allowed(g, call("add", '{"a": 1, "b": 2}'))
    assert not allowed(g, "free text")
    assert not allowed(g, '{"ok": "yes"}')


def test_none_has_no_grammar_and_a_bad_schema_does_not_compile():
    assert grammar_for([ADD], "none") is None
    bad = grammar_for([{"name": "x", "parameters": {"type": "object", "properties": {
        "n": {"$ref": "#/$defs/missing"}}}}], "required")
    assert check(bad) != ""
