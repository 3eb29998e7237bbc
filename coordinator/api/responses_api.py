"""OpenAI's Responses API (`POST /v1/responses`), translated into a chat request.

A Responses request becomes the chat body coordinator.api.openai_api already checks and
runs, so sampling, limits, structured outputs, tools and speculation are the chat API's:

- `input`: a string (one user turn) or items: messages (`role` user, system, developer
  or assistant; content a string or input_text / output_text parts), `function_call`
  items (consecutive ones make one assistant turn) and `function_call_output` items
  (a tool turn answering a call by `call_id`);
- `instructions`: a system turn first; like OpenAI's, it is not carried over to a
  response that continues this one;
- `previous_response_id`: the stored conversation that response ended comes before the
  input (coordinator.api.response_store; an unknown or expired id is a 404);
- `tools` (function tools, in this API's flat shape), `tool_choice`,
  `parallel_tool_calls`; `text.format` (text, json_object or json_schema);
  `max_output_tokens`, `temperature`, `top_p`; `store` (default true), `metadata`,
  `user`; specdec's extensions as on the chat API (`num_draft_tokens`, `seed`, ...).

A 400 names the Responses parameter (`max_output_tokens`, `text.format`, `input`), not
the chat parameter it became. What this API has and specdec does not (other tool types,
images and files, background mode, server-side conversations) is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.api.openai_errors import APIError, bad

FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
          "text", "max_output_tokens", "temperature", "top_p", "stream", "store",
          "previous_response_id", "metadata", "user", "truncation", "reasoning", "include",
          "service_tier", "background", "stream_options", "top_logprobs",
          "prompt_cache_key", "safety_identifier",
          # specdec's and vLLM's extensions, as on the chat API
          "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty", "num_draft_tokens", "timeout", "decoding", "ignore_eos",
          "min_tokens"}
PASSED = {"model", "parallel_tool_calls", "temperature", "top_p", "stream", "seed", "top_k",
          "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
          "num_draft_tokens", "timeout", "decoding", "ignore_eos", "min_tokens", "user"}
RENAMED = {"max_tokens": "max_output_tokens", "response_format": "text.format"}
ROLES = {"user", "system", "developer", "assistant"}


@dataclass
class Plan:
    chat: dict  # the chat-completions body
    history: list[dict]  # the conversation before this response, without instructions
    store: bool
    echo: dict  # the request's settings a response object repeats


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where}.content must be a string or a list of text parts", "input")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in \
                ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad(f"{where}.content[{j}]: only text parts are supported, got {kind!r}",
                      "input", "unsupported_content")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(items) -> list[dict]:
    """`input` as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad("`input` must be a string or a non-empty list of items", "input")
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise bad(f"{where}.role must be one of {', '.join(sorted(ROLES))}, got "
                          f"{item.get('role')!r}", "input")
            out.append({"role": item["role"], "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name")):
                raise bad(f"{where}: a function_call needs call_id and name", "input")
            call = {"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") \
                    and not out[-1].get("content"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str)
                        else _text(output, where)})
        elif kind == "reasoning":
            continue  # a reasoning model's summary: nothing this model reads
        else:
            raise bad(f"{where}: items of type {kind!r} are not supported (message, "
                      "function_call and function_call_output are)", "input",
                      "unsupported_parameter")
    return out


def _tools(tools) -> list[dict]:
    if not isinstance(tools, list):
        raise bad("`tools` must be a list of function tools", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad(f"tools[{i}]: only function tools are supported, got {kind!r}", "tools",
                      "unsupported_parameter")
        out.append({"type": "function", "function": {
            k: t[k] for k in ("name", "description", "parameters") if k in t}})
    return out


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _format(text) -> dict | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
        raise bad('`text` must be {"format": {"type": "text" | "json_object" | '
                  '"json_schema", ...}}', "text.format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    raise bad(f"text.format.type must be text, json_object or json_schema, got "
              f"{fmt.get('type')!r}", "text.format")


def plan(body, previous: list[dict] | None) -> Plan:
    """The chat body for a Responses request; `previous`: the stored conversation its
    previous_response_id names (the caller looks it up)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None)
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad(f"unknown parameter {unknown[0]!r}", unknown[0], "unknown_parameter")
    for name in ("background", "conversation", "prompt"):
        if body.get(name):
            raise bad(f"`{name}` is not supported", name, "unsupported_parameter")
    if body.get("truncation") not in (None, "disabled"):
        raise bad('`truncation` must be "disabled": a prompt over the context is a 400',
                  "truncation")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise bad("`store` must be a boolean", "store")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("`instructions` must be a string", "instructions")
    if "input" not in body:
        raise bad("`input` is required", "input", "missing_required_parameter")
    history = [*(previous or []), *input_messages(body["input"])]
    chat = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions
                        else []) + history
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    echo = {"instructions": instructions, "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice", "auto"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"), "store": store,
            "text": body.get("text") or {"format": {"type": "text"}},
            "metadata": body.get("metadata") or {}, "user": body.get("user"),
            "truncation": "disabled"}
    return Plan(chat, history, store, echo)


def renamed(exc: APIError) -> APIError:
    """A chat API error, naming the Responses parameter it came from."""
    param = exc.param or ""
    if param in RENAMED:
        exc.param = RENAMED[param]
    elif param.startswith("messages"):
        exc.param = "input"
    return exc
