"""Generated text -> the Responses API's objects: a `response` with its output items
(an assistant `message` with `output_text`, and `function_call` items), and the events a
stream sends (response.created, response.output_text.delta, ...,
response.completed), in OpenAI's shapes so the `openai` package and the Agents SDK
parse them. Tool calls are read by specdec.tool_calls' parser, the same for a stream cut
anywhere as for the whole text.
"""

from __future__ import annotations

import secrets
import time

from coordinator.api.openai_responses import served_by
from specdec.tool_calls import Arguments, CallStart, Content, ToolCallParser
from specdec.v1 import generate_pb2


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def usage(stats: generate_pb2.GenerationStats) -> dict:
    drafted, accepted = stats.drafted_tokens, stats.accepted_tokens
    return {"input_tokens": stats.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": stats.generated_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "specdec": {"drafted_tokens": drafted, "accepted_tokens": accepted,
                        "rounds": stats.rounds,
                        "acceptance_rate": accepted / drafted if drafted else None,
                        **served_by(stats)}}


class ResponseBuilder:
    """One response as its text arrives: output items, events and the final object."""

    def __init__(self, model: str, echo: dict, tools: bool):
        self.id, self.model, self.echo = _id("resp"), model, echo
        self.created = int(time.time())
        self.parser = ToolCallParser() if tools else None
        self.items: list[dict] = []
        self._message: dict | None = None  # the open message item
        self._calls: dict[int, dict] = {}  # call index -> its function_call item
        self.seq = 0

    # -- objects ---------------------------------------------------------------------

    def response(self, status: str, stats=None, reason: str = "") -> dict:
        body = {"id": self.id, "object": "response", "created_at": self.created,
                "status": status, "model": self.model, "output": self.items,
                "error": None, "incomplete_details": None, "usage": None,
                **self.echo}
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        if stats is not None:
            body["usage"] = usage(stats)
        return body

    def text(self) -> str:
        """The output's text (the `output_text` the SDKs join)."""
        return "".join(p["text"] for i in self.items if i["type"] == "message"
                       for p in i["content"])

    def assistant_turns(self) -> list[dict]:
        """The output as chat turns, for the stored conversation."""
        calls = [{"id": i["call_id"], "type": "function",
                  "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.items if i["type"] == "function_call"]
        turn = {"role": "assistant", "content": self.text() or None}
        if calls:
            turn["tool_calls"] = calls
        return [turn]

    # -- events ----------------------------------------------------------------------

    def _event(self, type_: str, **fields) -> dict:
        self.seq += 1
        return {"type": type_, "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict]:
        body = self.response("in_progress")
        return [self._event("response.created", response=body),
                self._event("response.in_progress", response=body)]

    def feed(self, text: str, final: bool = False) -> list[dict]:
        """The events for the next piece of generated text (all of it when unary)."""
        if self.parser is None:
            events = [Content(text)] if text else []
        else:
            events = self.parser.feed(text) + (self.parser.finish() if final else [])
        out: list[dict] = []
        for e in events:
            if isinstance(e, Content):
                out += self._text_delta(e.text)
            elif isinstance(e, CallStart):
                out += self._close_message()
                item = {"type": "function_call", "id": _id("fc"), "call_id": _id("call"),
                        "name": e.name, "arguments": "", "status": "in_progress"}
                self._calls[e.index] = item
                self.items.append(item)
                out.append(self._event("response.output_item.added",
                                       output_index=len(self.items) - 1, item=dict(item)))
            elif isinstance(e, Arguments):
                item = self._calls[e.index]
                item["arguments"] += e.text
                out.append(self._event("response.function_call_arguments.delta",
                                       item_id=item["id"], output_index=self._index(item),
                                       delta=e.text))
        return out

    def finish(self, chunk_text: str, reason: str, stats) -> tuple[list[dict], dict]:
        """The last piece of text, then every open item closed; the final response."""
        out = self.feed(chunk_text, final=True) + self._close_message()
        for item in self._calls.values():
            if item["status"] == "in_progress":
                item["status"] = "completed"
                out.append(self._event("response.function_call_arguments.done",
                                       item_id=item["id"], output_index=self._index(item),
                                       arguments=item["arguments"]))
                out.append(self._event("response.output_item.done",
                                       output_index=self._index(item), item=item))
        status = "incomplete" if reason == "length" else "completed"
        final = self.response(status, stats)
        out.append(self._event(f"response.{status}", response=final))
        return out, final

    def _index(self, item: dict) -> int:
        return next(i for i, x in enumerate(self.items) if x is item)

    def _text_delta(self, text: str) -> list[dict]:
        out = []
        if self._message is None:
            self._message = {"type": "message", "id": _id("msg"), "status": "in_progress",
                             "role": "assistant", "content": []}
            self.items.append(self._message)
            index = len(self.items) - 1
            out.append(self._event("response.output_item.added", output_index=index,
                                   item={**self._message, "content": []}))
            self._message["content"].append({"type": "output_text", "text": "",
                                             "annotations": [], "logprobs": []})
            out.append(self._event("response.content_part.added", item_id=self._message["id"],
                                   output_index=index, content_index=0,
                                   part={"type": "output_text", "text": "",
                                         "annotations": [], "logprobs": []}))
        part = self._message["content"][0]
        part["text"] += text
        out.append(self._event("response.output_text.delta", item_id=self._message["id"],
                               output_index=self._index(self._message), content_index=0,
                               delta=text, logprobs=[]))
        return out

    def _close_message(self) -> list[dict]:
        message, self._message = self._message, None
        if message is None:
            return []
        message["status"] = "completed"
        index, part = self._index(message), message["content"][0]
        return [self._event("response.output_text.done", item_id=message["id"],
                            output_index=index, content_index=0, text=part["text"],
                            logprobs=[]),
                self._event("response.content_part.done", item_id=message["id"],
                            output_index=index, content_index=0, part=part),
                self._event("response.output_item.done", output_index=index, item=message)]
