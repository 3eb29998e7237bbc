"""Generator chunks -> OpenAI response objects: unary bodies, SSE chunks and usage.

The shapes are OpenAI's (`chat.completion`, `chat.completion.chunk`, `text_completion`),
so the official `openai` package parses them unchanged; specdec's additions are extra
keys it keeps in `model_extra` (see coordinator.api.openai_api for the list).
"""

from __future__ import annotations

import json
import secrets
import time

from coordinator.api.openai_api import FINISH_REASONS, KIND_NAMES
from specdec.messages import message_fields
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
        "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                      "rejected_prediction_tokens": drafted - accepted},
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


class Responses:
    """Builds one request's response objects (one id and creation time for all)."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        prefix = "chatcmpl" if kind == CHAT else "cmpl"
        self.id = f"{prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())

    def _envelope(self, object_: str) -> dict:
        return {"id": self.id, "object": object_, "created": self.created,
                "model": self.model, "system_fingerprint": None}

    def unary(self, resp: generate_pb2.GenerateResponse) -> dict:
        reason = FINISH_REASONS.get(resp.finish_reason, resp.finish_reason)
        if self.kind == CHAT:
            body = self._envelope("chat.completion")
            body["choices"] = [{"index": 0, "message": {"role": "assistant",
                                                        "content": resp.text},
                                "finish_reason": reason, "logprobs": None}]
        else:
            body = self._envelope("text_completion")
            body["choices"] = [{"index": 0, "text": resp.text, "finish_reason": reason,
                                "logprobs": None}]
        body["usage"] = usage(resp.stats)
        body["specdec"] = tokens(resp)
        return body

    def chunk(self, chunk: generate_pb2.GenerateChunk, first: bool) -> dict:
        reason = FINISH_REASONS.get(chunk.finish_reason, chunk.finish_reason) or None
        if self.kind == CHAT:
            body = self._envelope("chat.completion.chunk")
            delta = {"role": "assistant", "content": chunk.text} if first else \
                {"content": chunk.text}
            body["choices"] = [{"index": 0, "delta": delta, "finish_reason": reason,
                                "logprobs": None}]
        else:
            body = self._envelope("text_completion")
            body["choices"] = [{"index": 0, "text": chunk.text, "finish_reason": reason,
                                "logprobs": None}]
        body["specdec"] = tokens(chunk)
        return body

    def usage_chunk(self, stats: generate_pb2.GenerationStats) -> dict:
        """`stream_options.include_usage`: the last chunk, empty choices and the usage."""
        body = self._envelope("chat.completion.chunk" if self.kind == CHAT
                              else "text_completion")
        body["choices"] = []
        body["usage"] = usage(stats)
        return body


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"
