"""A chat, with its tools and tool turns, rendered as prompt text by the model's chat
template.

A template that knows tools (Qwen2.5's: it mentions `tools`) gets them as they are: the
tool list, assistant turns with `tool_calls` (arguments as objects, which it writes as
JSON) and `tool` turns. A template that knows none (SmolLM2's, the tiny test models')
gets the generic form instead, in plain turns it can render:

* the tools, and how to call them, in a system message (GENERIC_TOOLS, followed by one
  tool per line as JSON), before the chat's own system text;
* an assistant turn's calls as its text: each ``<tool_call>\\n{"name": ..., "arguments":
  ...}\\n</tool_call>``, the format specdec.tool_calls constrains and parses;
* a tool turn as a user turn holding ``<tool_response>\\n...\\n</tool_response>``.

Both forms write a past call exactly as the grammar makes the model write a new one, so
a conversation's earlier turns render as the tokens the model generated and its prefix
is served from the prefix caches.
"""

from __future__ import annotations

import json

from specdec.errors import InvalidArgument, require
from specdec.tool_calls import CLOSE, OPEN

GENERIC_TOOLS = (
    "You can call functions. To call one, reply with its name and JSON arguments "
    f"between {OPEN} and {CLOSE}, one call per block:\n"
    f'{OPEN}\n{{"name": "function_name", "arguments": {{"arg": "value"}}}}\n{CLOSE}\n'
    "Call a function only when it helps answer; otherwise answer directly. "
    "The functions:")


def knows_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders tools itself."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "tools" in template


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def call_text(name: str, arguments: str) -> str:
    """One call as the grammar writes it."""
    body = json.dumps({"name": name, "arguments": _arguments(arguments)},
                      ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def _native(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": _arguments(c["arguments"])}}
                for c in m["tool_calls"]]
        out.append(m)
    return out


def _generic(messages: list[dict], tools: list[dict]) -> list[dict]:
    out = []
    if tools:
        listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False)
                            for t in tools)
        system = f"{GENERIC_TOOLS}\n{listing}"
        if messages and messages[0]["role"] == "system":
            system += "\n\n" + messages[0]["content"]
            messages = messages[1:]
        out.append({"role": "system", "content": system})
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user",
                        "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        elif m.get("tool_calls"):
            calls = "\n".join(call_text(c["name"], c["arguments"]) for c in m["tool_calls"])
            text = f"{m['content']}\n{calls}" if m.get("content") else calls
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def render(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The prompt text for `messages` ({role, content, tool_calls: [{id, name,
    arguments}], tool_call_id}) and `tools` (OpenAI's tool objects), ending with the
    assistant's turn opened."""
    tools = tools or []
    uses_tools = tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if uses_tools and knows_tools(tokenizer):
        return tokenizer.apply_chat_template(_native(messages), tools=tools or None,
                                             tokenize=False, add_generation_prompt=True)
    if uses_tools:
        messages = _generic(messages, tools)
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=True)


def turns(messages) -> list[dict]:
    """The wire's ChatMessages as `render` takes them."""
    out = []
    for m in messages:
        turn = {"role": m.role, "content": m.content}
        if m.tool_calls:
            turn["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                  for c in m.tool_calls]
        if m.tool_call_id:
            turn["tool_call_id"] = m.tool_call_id
        out.append(turn)
    return out


def tools_of(text: str) -> list[dict] | None:
    """GenerateRequest.tools (JSON text) as a list; None when empty."""
    if not text:
        return None
    try:
        tools = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(f"tools is not JSON: {e}") from None
    require(isinstance(tools, list) and all(isinstance(t, dict) for t in tools),
            "tools must be JSON text of a list of tool objects")
    return tools
