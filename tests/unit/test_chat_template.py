"""specdec.chat_template: a template with no tools gets the generic form (tools in a
system turn, calls as the grammar writes them, results as user turns); a template that
knows tools gets them as they are; a chat without tools renders as before."""

from __future__ import annotations

import copy
import json

import pytest

from specdec.chat_template import GENERIC_TOOLS, knows_tools, render, tools_of, turns
from specdec.errors import InvalidArgument
from specdec.runtime.models import load_tokenizer
from specdec.tool_calls import parse
from specdec.v1 import generate_pb2

TOKENIZER = load_tokenizer("tiny-random")
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}]
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 1}'}]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"}]


def test_a_chat_without_tools_renders_as_the_template_does():
    plain = [{"role": "user", "content": "hi"}]
    assert render(TOKENIZER, plain) == TOKENIZER.apply_chat_template(
        plain, tokenize=False, add_generation_prompt=True)


def test_a_template_without_tools_gets_the_generic_form():
    assert not knows_tools(TOKENIZER)
    text = render(TOKENIZER, CHAT, TOOLS)
    assert GENERIC_TOOLS in text and json.dumps(TOOLS[0]["function"]) in text
    assert text.index(GENERIC_TOOLS) < text.index("Be brief.")
    # the past call is written as the grammar writes a new one, and parses back
    assert parse(text[text.rindex("<tool_call>"):]).calls[0].arguments == '{"a": 1}'
    assert "<tool_response>\n2\n</tool_response>" in text


def test_a_template_that_knows_tools_gets_them():
    tok = copy.deepcopy(TOKENIZER)
    tok.chat_template = (
        "{% for t in tools or [] %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} "
        "{{ c.function.arguments | tojson }}{% endfor %}\n{% endfor %}assistant:")
    assert knows_tools(tok)
    text = render(tok, CHAT, TOOLS)
    assert text.startswith("TOOL add\n") and 'CALL add {"a": 1}' in text
    assert "tool: 2" in text


def test_wire_turns_and_tools():
    msgs = [generate_pb2.ChatMessage(role="assistant", tool_calls=[
        generate_pb2.ToolCall(id="c1", name="add", arguments="{}")]),
        generate_pb2.ChatMessage(role="tool", content="2", tool_call_id="c1")]
    assert turns(msgs) == [{"role": "assistant", "content": "",
                            "tool_calls": [{"id": "c1", "name": "add", "arguments": "{}"}]},
                           {"role": "tool", "content": "2", "tool_call_id": "c1"}]
    assert tools_of("") is None and tools_of(json.dumps(TOOLS)) == TOOLS
    for bad in ("{", '{"a": 1}', "[1]"):
        with pytest.raises(InvalidArgument):
            tools_of(bad)
