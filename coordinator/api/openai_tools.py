"""OpenAI's function tools in a chat request, checked and turned into what the generator
takes: the tools for the chat template (GenerateRequest.tools), the tool turns of the
history, and the grammar that constrains calls (specdec.tool_calls.grammar_for).

- `tools`: [{"type": "function", "function": {name, description, parameters, strict}}];
  a name is 1-64 of a-z, A-Z, 0-9, _ and -; `parameters` is a JSON schema object, and
  one the grammar engine cannot compile is a 400 naming `tools`. Calls always follow
  the schema, `strict` or not.
- `tool_choice`: "none" (no call; the tools are still shown), "auto" (the default with
  tools), "required", or {"type": "function", "function": {"name": ...}} naming one;
  a name that is not among the tools is a 400 naming `tool_choice`.
- `parallel_tool_calls` (default true): false allows one call per response.
- with `response_format` (a JSON schema or json_object) and "auto", an answer that is
  not a call must be that JSON (what agent SDKs send for a typed final output);
  "required" and named calls leave no room for an answer, and "none" keeps the format.
- messages: an assistant turn may carry `tool_calls` (content may then be null), and a
  `tool` turn answers one of them by `tool_call_id`; an id that answers no earlier
  call is a 400 naming that message.

`functions` / `function_call` (the API's older names) are refused with a 400 that says
to send `tools`.
"""

from __future__ import annotations

import json
import re

from coordinator.api.openai_errors import bad
from specdec import wire
from specdec.grammar import check
from specdec.tool_calls import grammar_for
from specdec.v1 import generate_pb2

TOOL_FIELDS = {"tools", "tool_choice", "parallel_tool_calls"}
MAX_TOOLS = 128
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _tools(tools) -> list[dict]:
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad(f"`tools` must be a list of at most {MAX_TOOLS} tool objects", "tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" \
                or not isinstance(tool.get("function"), dict):
            raise bad(f'{where} must be {{"type": "function", "function": {{...}}}}', "tools")
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise bad(f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got "
                      f"{name!r}", "tools")
        if name in seen:
            raise bad(f"{where}.function.name {name!r} is given twice", "tools")
        seen.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"{where}.function.parameters must be a JSON schema object", "tools")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad(f"{where}.function.description must be a string", "tools")
        out.append({"type": "function", "function": {
            k: v for k, v in fn.items() if k in ("name", "description", "parameters")}})
    return out


def _choice(choice, names: list[str]) -> str:
    if choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name in names:
            return name
        raise bad(f"`tool_choice` names {name!r}, which is not among the tools "
                  f"({', '.join(names) or 'none given'})", "tool_choice")
    raise bad('`tool_choice` must be "none", "auto", "required" or {"type": "function", '
              '"function": {"name": ...}}', "tool_choice")


def apply(body: dict, req: generate_pb2.GenerateRequest) -> bool:
    """Set req's tools and tool grammar from the body; True when the output may hold
    calls (the response then parses them)."""
    for name in ("functions", "function_call"):
        if body.get(name) not in (None, "none", []):
            raise bad(f"`{name}` is the API's older form; send `tools` and `tool_choice`",
                      name, "unsupported_parameter")
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("`parallel_tool_calls` must be a boolean", "parallel_tool_calls")
    if not tools:
        if choice not in (None, "none"):
            raise bad("`tool_choice` needs `tools`", "tool_choice")
        return False
    tools = _tools(tools)
    choice = _choice("auto" if choice is None else choice,
                     [t["function"]["name"] for t in tools])
    req.tools = json.dumps(tools, ensure_ascii=False)
    answer = _answer_schema(req) if choice == "auto" else None
    grammar = grammar_for([t["function"] for t in tools], choice, parallel, answer)
    if grammar is None:
        return False  # "none": a structured output, if any, stays as it is
    error = check(grammar)
    if error:
        raise bad(f"`tools` cannot be used as a grammar: {error}", "tools")
    req.sampling.grammar.CopyFrom(wire.grammar_to_proto(grammar))
    return True


def _answer_schema(req: generate_pb2.GenerateRequest) -> dict | None:
    """The JSON schema a structured output (response_format) sets for an answer that is
    not a call; None without one. Other structured outputs do not combine with tools."""
    if not req.sampling.HasField("grammar"):
        return None
    grammar = wire.grammar_from_proto(req.sampling.grammar)
    if grammar.kind == "json_object":
        return {"type": "object"}
    if grammar.kind == "json_schema":
        return json.loads(grammar.spec)
    raise bad(f"a {grammar.kind} structured output cannot be combined with tools (a JSON "
              'schema or json_object can); send tool_choice "none" or drop one',
              "tool_choice")


def tool_turn(m: dict, i: int, calls: set[str]) -> generate_pb2.ChatMessage:
    """A `tool` message, answering one of `calls` (the ids seen so far)."""
    call_id = m.get("tool_call_id")
    if not isinstance(call_id, str) or call_id not in calls:
        raise bad(f"messages[{i}].tool_call_id {call_id!r} answers no tool call of an "
                  "earlier assistant message", f"messages[{i}].tool_call_id")
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise bad(f"messages[{i}].content must be the tool's result as a string",
                  f"messages[{i}].content")
    return generate_pb2.ChatMessage(role="tool", content=content, tool_call_id=call_id)


def assistant_calls(m: dict, i: int) -> list[generate_pb2.ToolCall]:
    """An assistant message's `tool_calls`, as the wire carries them."""
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise bad(f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(c.get("id"), str) \
                or not isinstance(fn.get("name"), str):
            raise bad(f'messages[{i}].tool_calls[{j}] must be {{"id", "type": "function", '
                      '"function": {"name", "arguments"}}', f"messages[{i}].tool_calls")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append(generate_pb2.ToolCall(id=c["id"], name=fn["name"], arguments=args))
    return out
