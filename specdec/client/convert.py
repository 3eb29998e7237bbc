"""Wire messages <-> the client's result types (specdec.client.types).

`*_from_proto` is what the clients apply to every response; `*_to_proto` turns a
result back into its message, unchanged, for callers that print the wire form (the
`specdec generate --json` output).
"""

from __future__ import annotations

from dataclasses import fields

from specdec.client.types import Chunk, Completion, Stats, TokenKind
from specdec.logprobs import logprobs_from_proto, logprobs_to_proto
from specdec.messages import message_fields, message_from
from specdec.v1 import generate_pb2

_KINDS = {kind.value: kind for kind in TokenKind}


def kind_from_proto(value: int) -> TokenKind:
    """A TokenKind from its wire number; ValueError for one this client does not know."""
    try:
        return _KINDS[value]
    except KeyError:
        raise ValueError(f"unknown token kind {value} from the server") from None


def stats_from_proto(msg: generate_pb2.GenerationStats) -> Stats:
    """The typed Stats; fields this client does not know (a newer server's) are left out."""
    known = {f.name for f in fields(Stats)}
    return Stats(**{k: v for k, v in message_fields(msg).items() if k in known})


def _logprobs(msg) -> dict:
    """A chunk's or a response's log-probabilities, as the client's fields."""
    return dict(logprobs=tuple(map(logprobs_from_proto, msg.logprobs)),
                prompt_logprobs=tuple(map(logprobs_from_proto, msg.prompt_logprobs)),
                prompt_token_ids=tuple(msg.prompt_token_ids))


def _logprobs_into(msg, result) -> None:
    msg.logprobs.extend(map(logprobs_to_proto, result.logprobs))
    msg.prompt_logprobs.extend(map(logprobs_to_proto, result.prompt_logprobs))
    msg.prompt_token_ids.extend(result.prompt_token_ids)


def chunk_from_proto(msg: generate_pb2.GenerateChunk) -> Chunk:
    """finish_reason and stats become None where the message leaves them unset."""
    return Chunk(text=msg.text, token_ids=tuple(msg.token_ids),
                 kinds=tuple(kind_from_proto(k) for k in msg.kinds),
                 token_texts=tuple(msg.token_texts), finish_reason=msg.finish_reason or None,
                 stats=stats_from_proto(msg.stats) if msg.HasField("stats") else None,
                 **_logprobs(msg))


def completion_from_proto(msg: generate_pb2.GenerateResponse) -> Completion:
    return Completion(text=msg.text, token_ids=tuple(msg.token_ids),
                      kinds=tuple(kind_from_proto(k) for k in msg.kinds),
                      token_texts=tuple(msg.token_texts), finish_reason=msg.finish_reason,
                      stats=stats_from_proto(msg.stats), **_logprobs(msg))


def stats_to_proto(stats: Stats) -> generate_pb2.GenerationStats:
    return message_from(generate_pb2.GenerationStats, stats)


def chunk_to_proto(chunk: Chunk) -> generate_pb2.GenerateChunk:
    msg = generate_pb2.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids,
                                     kinds=[k.value for k in chunk.kinds],
                                     token_texts=chunk.token_texts,
                                     finish_reason=chunk.finish_reason or "")
    if chunk.stats is not None:
        msg.stats.CopyFrom(stats_to_proto(chunk.stats))
    _logprobs_into(msg, chunk)
    return msg


def completion_to_proto(completion: Completion) -> generate_pb2.GenerateResponse:
    msg = generate_pb2.GenerateResponse(
        text=completion.text, token_ids=completion.token_ids,
        kinds=[k.value for k in completion.kinds], token_texts=completion.token_texts,
        finish_reason=completion.finish_reason, stats=stats_to_proto(completion.stats))
    _logprobs_into(msg, completion)
    return msg
