"""Tool calls in generated text: their format, the grammar that constrains them, and the
parser that reads them back from a stream cut anywhere.

The format is Qwen2.5's (the Hermes function-calling format), one block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several calls follow each other, one newline apart. Models whose chat template knows no
tools (SmolLM2's) are told the same format in a system message
(specdec.chat_template.GENERIC_TOOLS).

**The grammar** (`grammar_for`, llguidance's Lark with inline JSON schemas) writes each
call's JSON compactly, the name as a constant and the arguments by the tool's
`parameters` schema:

* ``required``: one or more calls (one when parallel calls are off), nothing else;
* a named tool: exactly one call of that tool;
* ``auto``: any text that does not contain the opening tag, then optionally calls. The
  text is free until the model writes the opening; from there the calls are
  constrained (a lazy trigger: nothing is constrained before it).

Both services mask with the grammar (specdec.grammar), so a draft the grammar refuses is
never proposed and never accepted, and greedy output equals target-only's under the
same grammar.

**The parser** (`ToolCallParser`) turns text, fed in chunks of any size, into events:
content, the start of a call (its name), and pieces of its arguments. An event is sent
only when no later text can change it: text that may be the start of the opening tag is
held back, and so are a closing brace and whitespace that may end the call's JSON. So
the events of any chunking, joined, equal those of the whole text (`parse`), which is
what the unary response shows; a property test checks this for random chunkings.
SGLang's parsers lost calls when a chunk held several tokens or calls (issues 31915,
37634); this one has no notion of tokens at all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from specdec.grammar import JSON_OPTIONS, Grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# The header of a call as the grammar writes it (and as models write it unconstrained),
# then the arguments' first character (so a chunk boundary inside whitespace waits).
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*'
                     r"(?=\S)")
# What may end a call's JSON: whitespace, the outer object's brace, whitespace, and
# the start of the closing tag.
_TAIL = re.compile(r"\s*(\}\s*)?$")


# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


@dataclass
class ToolCall:
    name: str
    arguments: str = ""  # JSON text, as generated


@dataclass
class Parsed:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    """Feed generated text in chunks; get events that never need taking back."""

    def __init__(self):
        self._buf, self._state, self._calls, self._sent = "", "text", 0, 0

    def feed(self, text: str) -> list:
        self._buf += text
        out: list = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list:
        out: list = []
        while self._step(out, final=True):
            pass
        return out

    # one transition; True when another may follow
    def _step(self, out: list, final: bool) -> bool:
        buf = self._buf
        if self._state == "between":  # after a call: whitespace, another call, or text
            at = buf.find(OPEN)
            if at >= 0 and not buf[:at].strip():
                self._buf, self._state = buf[at + len(OPEN):], "header"
                return True
            rest = buf.lstrip()
            if not rest and final:
                self._buf = ""
            if not rest or (not final and at < 0 and OPEN.startswith(rest)):
                return False  # whitespace between calls is content only before text
            self._state = "text"
            return True
        if self._state == "text":
            at = buf.find(OPEN)
            if at >= 0:
                self._content(out, buf[:at])
                self._buf, self._state = buf[at + len(OPEN):], "header"
                return True
            keep = 0 if final else _partial_suffix(buf, OPEN)
            self._content(out, buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        if self._state == "header":
            m = _HEADER.match(buf)
            close = buf.find(CLOSE)
            if m and (close < 0 or m.end() <= close):
                out.append(CallStart(self._calls, json.loads(m.group(1))))
                self._buf, self._state, self._sent = buf[m.end():], "args", 0
                return True
            if close >= 0 or final:  # not a call in this format: keep it as text
                end = close + len(CLOSE) if close >= 0 else len(buf)
                self._content(out, OPEN + buf[:end])
                self._buf, self._state = buf[end:], "text"
                return True
            return False
        # args: everything up to the closing tag, less the call's own closing brace
        close = buf.find(CLOSE)
        if close >= 0 or final:
            # cut short (max tokens): the start of a closing tag is not an argument
            body = (buf[:close] if close >= 0 else
                    buf[:len(buf) - _partial_suffix(buf, CLOSE)]).rstrip()
            args = body[:-1].rstrip() if body.endswith("}") else body
            self._args(out, args)
            self._calls += 1
            self._buf = buf[close + len(CLOSE):] if close >= 0 else ""
            self._state = "between"
            return close >= 0
        held = _partial_suffix(buf, CLOSE)
        safe = buf[:len(buf) - held]
        tail = _TAIL.search(safe)
        self._args(out, safe[:tail.start()] if tail else safe)
        return False

    def _content(self, out: list, text: str) -> None:
        if text:
            out.append(Content(text))

    def _args(self, out: list, args: str) -> None:
        if len(args) > self._sent:
            out.append(Arguments(self._calls, args[self._sent:]))
            self._sent = len(args)


def fold(events: list, into: Parsed | None = None) -> Parsed:
    """Events joined into content and calls."""
    parsed = into or Parsed()
    for e in events:
        if isinstance(e, Content):
            parsed.content += e.text
        elif isinstance(e, CallStart):
            parsed.calls.append(ToolCall(e.name))
        else:
            parsed.calls[e.index].arguments += e.text
    return parsed


def parse(text: str) -> Parsed:
    """The content and calls of a whole generated text."""
    parser = ToolCallParser()
    return fold(parser.feed(text) + parser.finish())


# -- the grammar -------------------------------------------------------------------------


def call_schema(name: str, parameters: dict | None) -> dict:
    """The JSON one call of tool `name` writes: its name, then its arguments."""
    return {"type": "object",
            "properties": {"name": {"const": name},
                           "arguments": parameters or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False,
            "x-guidance": JSON_OPTIONS}


def grammar_for(tools: list[dict], choice: str, parallel: bool = True,
                answer: dict | None = None) -> Grammar | None:
    """The Lark grammar for `tools` ([{name, parameters}]) under `choice`: "auto",
    "required", or a tool's name; None for "none" (the text is not constrained).
    `answer`: with "auto", a JSON schema the answer must follow when the model calls no
    tool (a structured output beside tools); the answer is then that JSON or calls."""
    if choice == "none":
        return None
    if choice not in ("auto", "required"):
        tools = [t for t in tools if t["name"] == choice]
        parallel = False
    rules = [f"fn_{i}: %json {json.dumps(call_schema(t['name'], t.get('parameters')))}"
             for i, t in enumerate(tools)]
    more = ' ("\\n" call)*' if parallel else ""
    body = f'"\\n" ({" | ".join(f"fn_{i}" for i in range(len(tools)))}) "\\n{CLOSE}"'
    if choice != "auto":
        start = f"start: call{more}"
    elif answer is not None:
        start = f"start: answer | call{more}"
        rules.append(f"answer: %json {json.dumps({**answer, 'x-guidance': JSON_OPTIONS})}")
    else:  # the text ends at the first opening (a lazy lexeme), or has none
        start = f"start: (TEXT | head body{more})?"
    lines = ["%llguidance {}", start, f'call: "{OPEN}" body', f"body: {body}", *rules]
    if choice == "auto" and answer is None:
        lines += [f"head[lazy]: /(?s:.*){re.escape(OPEN)}/",
                  f"TEXT: /(?s:.+)/ & ~/(?s:.*){re.escape(OPEN)}(?s:.*)/"]
    return Grammar.of("lark", "\n".join(lines) + "\n")
