"""Generator chunks -> OpenAI response objects: unary bodies, SSE chunks and usage.

The shapes are OpenAI's (`chat.completion`, `chat.completion.chunk`, `text_completion`),
so the official `openai` package parses them unchanged; specdec's additions are extra
keys it keeps in `model_extra` (see coordinator.api.openai_api for the list).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time

from coordinator.api.openai_api import FINISH_REASONS, KIND_NAMES
from specdec.messages import message_fields
from specdec.tool_calls import Arguments, CallStart, Content, ToolCallParser, fold
from specdec.v1 import generate_pb2

CHAT, COMPLETION = "chat", "completion"
DONE = "data: [DONE]\n\n"


# GenerationStats' fields that usage.specdec does not repeat: OpenAI's own counts, and who
# served it (served_by, only from a coordinator run with --expose-replicas).
NOT_IN_SPECDEC_USAGE = ("prompt_tokens", "generated_tokens", "coordinator_replica",
                        "coordinator_node", "draft_replicas", "target_replicas")


def usage(stats: generate_pb2.GenerationStats) -> dict:
    """OpenAI's usage, and specdec's own counts (every other field of the wire's
    GenerationStats, by name) with three rates derived from them."""
    drafted, accepted = stats.drafted_tokens, stats.accepted_tokens
    counts = {k: list(v) if isinstance(v, tuple) else v
              for k, v in message_fields(stats).items() if k not in NOT_IN_SPECDEC_USAGE}
    counts["mean_head_size"] = stats.mean_head_size or None  # contrastive decoding only
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        # OpenAI's Predicted Outputs fields count prediction tokens only (speculation's
        # counts are in `specdec`): accepted, and the prediction's other tokens.
        "completion_tokens_details": {
            "accepted_prediction_tokens": stats.prediction_accepted_tokens,
            "rejected_prediction_tokens": max(0, stats.prediction_tokens
                                              - stats.prediction_accepted_tokens)},
        "specdec": {
            **counts,
            "acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_round": stats.generated_tokens / stats.rounds if stats.rounds else None,
            "tokens_per_second": stats.generated_tokens / stats.seconds
            if stats.seconds > 0 else None,
            **served_by(stats),
        },
    }


def served_by(stats: generate_pb2.GenerationStats) -> dict:
    """Who served the generation, when the coordinator says (--expose-replicas)."""
    if not (stats.coordinator_replica or stats.target_replicas):
        return {}
    return {"coordinator_replica": stats.coordinator_replica or None,
            "coordinator_node": stats.coordinator_node or None,
            "draft_replicas": list(stats.draft_replicas),
            "target_replicas": list(stats.target_replicas)}


def tokens(chunk) -> dict:
    """specdec's per-token view of a chunk (or a unary response)."""
    return {"token_ids": list(chunk.token_ids),
            "kinds": [KIND_NAMES.get(k, "unknown") for k in chunk.kinds],
            "token_texts": list(chunk.token_texts)}


def merged(stats: list[generate_pb2.GenerationStats],
           n: int = 1) -> generate_pb2.GenerationStats:
    """Several choices' stats as one (usage sums over them): counts add up, lists join,
    seconds is the longest; the prompt's tokens are counted once per prompt (the
    choices come n per prompt, openai_api.expand's order)."""
    if len(stats) == 1:
        return stats[0]
    out = generate_pb2.GenerationStats()
    for s in stats:
        for field, value in message_fields(s).items():
            if isinstance(value, tuple):
                getattr(out, field).extend(value)
            elif isinstance(value, str):
                setattr(out, field, getattr(out, field) or value)
            elif field == "seconds":
                out.seconds = max(out.seconds, value)
            elif field != "mean_head_size":
                setattr(out, field, getattr(out, field) + value)
    out.prompt_tokens = sum(s.prompt_tokens for s in stats[::n])
    return out


class Choice:
    """One choice of a response as it streams: its index, the prompt text it echoes
    (completions' `echo`), where its text stands (completions' text_offset) and, when
    the output may hold tool calls, their parser and how many it has started."""

    def __init__(self, index: int = 0, echo: str | None = None, offset: int = 0,
                 tools: bool = False):
        self.index, self.echo, self.offset = index, echo, offset
        self.parser = ToolCallParser() if tools else None
        self.calls = 0


class Responses:
    """Builds one request's response objects (one id and creation time for all).
    `logprobs`: the request asked for log-probabilities, with this many alternatives
    (None: not asked); `token_text(id)` names a token in them."""

    def __init__(self, kind: str, model: str, logprobs: int | None = None,
                 token_text=None):
        self.kind, self.model = kind, model
        self.logprobs, self.token_text = logprobs, token_text or str
        prefix = "chatcmpl" if kind == CHAT else "cmpl"
        self.id = f"{prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())

    def _logprobs(self, chunk, choice: Choice, first: bool) -> dict | None:
        """The chunk's tokens' log-probabilities in the API's shape (the chat API's
        `content` list, or the completions API's legacy columns, the echoed prompt's
        first)."""
        if self.logprobs is None:
            return None
        name = self.token_text
        if self.kind == CHAT:
            def entry(token, logprob):
                text = name(token)
                return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

            return {"content": [{**entry(t, e.logprobs[0]), "top_logprobs": [
                entry(a, v) for a, v in zip(e.top_ids, e.top_logprobs, strict=True)]}
                for t, e in zip(chunk.token_ids, chunk.logprobs, strict=True)],
                "refusal": None}
        ids, values, tops, texts = [], [], [], []
        if first and choice.echo is not None and chunk.prompt_token_ids:
            ids += list(chunk.prompt_token_ids)
            values += [None] + [e.logprobs[0] for e in chunk.prompt_logprobs]
            tops += [None] + [dict(zip(map(name, e.top_ids), e.top_logprobs, strict=True))
                              for e in chunk.prompt_logprobs]
            texts += [name(t) for t in chunk.prompt_token_ids]
            choice.offset = 0
        ids += list(chunk.token_ids)
        values += [e.logprobs[0] for e in chunk.logprobs]
        tops += [dict(zip(map(name, e.top_ids), e.top_logprobs, strict=True))
                 for e in chunk.logprobs]
        texts += list(chunk.token_texts)
        offsets = []
        for text in texts:
            offsets.append(choice.offset)
            choice.offset += len(text)
        return {"tokens": [name(t) for t in ids], "token_logprobs": values,
                "top_logprobs": tops, "text_offset": offsets}

    def _envelope(self, object_: str) -> dict:
        return {"id": self.id, "object": object_, "created": self.created,
                "model": self.model, "system_fingerprint": None}

    def unary(self, resp: generate_pb2.GenerateResponse, choices: list | None = None,
              stats: generate_pb2.GenerationStats | None = None) -> dict:
        """One response, or with `choices` [(Choice, GenerateResponse)] several (then
        `stats` is their merged stats and `specdec` lists each choice's tokens)."""
        choices = choices or [(Choice(), resp)]
        body = self._envelope("chat.completion" if self.kind == CHAT else "text_completion")
        body["choices"] = []
        for choice, r in choices:
            reason = FINISH_REASONS.get(r.finish_reason, r.finish_reason)
            logprobs = self._logprobs(r, choice, True)
            if self.kind == CHAT:
                message = {"role": "assistant", "content": r.text}
                if choice.parser is not None:
                    parsed = fold(choice.parser.feed(r.text) + choice.parser.finish())
                    if parsed.calls:
                        message = {"role": "assistant", "content": parsed.content or None,
                                   "tool_calls": [self._call(choice, i, c.name, c.arguments)
                                                  for i, c in enumerate(parsed.calls)]}
                        reason = "tool_calls" if reason == "stop" else reason
                body["choices"].append({"index": choice.index, "message": message,
                                        "finish_reason": reason, "logprobs": logprobs})
            else:
                body["choices"].append({"index": choice.index,
                                        "text": (choice.echo or "") + r.text,
                                        "finish_reason": reason, "logprobs": logprobs})
        body["usage"] = usage(stats or choices[0][1].stats)
        body["specdec"] = tokens(resp) if len(choices) == 1 else \
            {"choices": [tokens(r) for _, r in choices]}
        return body

    def chunk(self, chunk: generate_pb2.GenerateChunk, first: bool,
              choice: Choice | None = None) -> dict:
        choice = choice or Choice()
        reason = FINISH_REASONS.get(chunk.finish_reason, chunk.finish_reason) or None
        logprobs = self._logprobs(chunk, choice, first)
        if self.kind == CHAT:
            body = self._envelope("chat.completion.chunk")
            delta = {"content": chunk.text}
            if choice.parser is not None:
                delta, reason = self._tool_delta(chunk, choice, reason)
            if first:
                delta = {"role": "assistant", **delta}
            body["choices"] = [{"index": choice.index, "delta": delta,
                                "finish_reason": reason, "logprobs": logprobs}]
        else:
            body = self._envelope("text_completion")
            text = (choice.echo or "") + chunk.text if first else chunk.text
            body["choices"] = [{"index": choice.index, "text": text,
                                "finish_reason": reason, "logprobs": logprobs}]
        body["specdec"] = tokens(chunk)
        return body

    def _call(self, choice: Choice, i: int, name: str, arguments: str | None) -> dict:
        """A call in OpenAI's shape; its id is the same in a stream and a unary body."""
        digest = hashlib.sha256(f"{self.id}/{choice.index}/{i}".encode()).hexdigest()[:24]
        call = {"id": f"call_{digest}", "type": "function",
                "function": {"name": name, "arguments": arguments or ""}}
        return call if arguments is not None else {"index": i, **call}

    def _tool_delta(self, chunk, choice: Choice, reason: str | None) -> tuple[dict, str]:
        """The chunk's text through the choice's tool-call parser: content, and
        tool_calls deltas (a call's id and name first, then pieces of its arguments)."""
        events = choice.parser.feed(chunk.text)
        if chunk.finish_reason:
            events += choice.parser.finish()
        content, calls = "", []
        for e in events:
            if isinstance(e, Content):
                content += e.text
            elif isinstance(e, CallStart):
                calls.append(self._call(choice, e.index, e.name, None))
                choice.calls += 1
            elif isinstance(e, Arguments):
                calls.append({"index": e.index, "function": {"arguments": e.text}})
        delta: dict = {"content": content or None} if content or not calls else {}
        if calls:
            delta["tool_calls"] = calls
        if reason == "stop" and choice.calls:
            reason = "tool_calls"
        return delta, reason

    def usage_chunk(self, stats: generate_pb2.GenerationStats) -> dict:
        """`stream_options.include_usage`: the last chunk, empty choices and the usage."""
        body = self._envelope("chat.completion.chunk" if self.kind == CHAT
                              else "text_completion")
        body["choices"] = []
        body["usage"] = usage(stats)
        return body


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"
