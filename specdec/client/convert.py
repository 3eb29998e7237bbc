"""Wire messages <-> the client's result types (specdec.client.types).

`*_from_proto` is what the clients apply to every response; `*_to_proto` turns a
result back into its message, unchanged, for callers that print the wire form (the
`specdec generate --json` output).
"""

from __future__ import annotations

from specdec.client.types import Chunk, Completion, Stats, TokenKind
from specdec.v1 import generate_pb2

_KINDS = {kind.value: kind for kind in TokenKind}


def kind_from_proto(value: int) -> TokenKind:
    """A TokenKind from its wire number; ValueError for one this client does not know."""
    try:
        return _KINDS[value]
    except KeyError:
        raise ValueError(f"unknown token kind {value} from the server") from None


def stats_from_proto(msg: generate_pb2.GenerationStats) -> Stats:
    return Stats(prompt_tokens=msg.prompt_tokens, generated_tokens=msg.generated_tokens,
                 rounds=msg.rounds, drafted_tokens=msg.drafted_tokens,
                 accepted_tokens=msg.accepted_tokens, seconds=msg.seconds,
                 pipelined_rounds=msg.pipelined_rounds, predrafts_wasted=msg.predrafts_wasted,
                 k_per_round=tuple(msg.k_per_round), confidence_exits=msg.confidence_exits,
                 mean_head_size=msg.mean_head_size, lookup_rounds=msg.lookup_rounds,
                 lookup_drafted_tokens=msg.lookup_drafted_tokens,
                 lookup_accepted_tokens=msg.lookup_accepted_tokens,
                 guess_rounds=msg.guess_rounds,
                 guess_rejections=msg.guess_rejections,
                 guess_bonus_misses=msg.guess_bonus_misses,
                 coordinator_replica=msg.coordinator_replica,
                 coordinator_node=msg.coordinator_node,
                 draft_replicas=tuple(msg.draft_replicas),
                 target_replicas=tuple(msg.target_replicas))


def chunk_from_proto(msg: generate_pb2.GenerateChunk) -> Chunk:
    """finish_reason and stats become None where the message leaves them unset."""
    return Chunk(text=msg.text, token_ids=tuple(msg.token_ids),
                 kinds=tuple(kind_from_proto(k) for k in msg.kinds),
                 token_texts=tuple(msg.token_texts), finish_reason=msg.finish_reason or None,
                 stats=stats_from_proto(msg.stats) if msg.HasField("stats") else None)


def completion_from_proto(msg: generate_pb2.GenerateResponse) -> Completion:
    return Completion(text=msg.text, token_ids=tuple(msg.token_ids),
                      kinds=tuple(kind_from_proto(k) for k in msg.kinds),
                      token_texts=tuple(msg.token_texts), finish_reason=msg.finish_reason,
                      stats=stats_from_proto(msg.stats))


def stats_to_proto(stats: Stats) -> generate_pb2.GenerationStats:
    return generate_pb2.GenerationStats(
        prompt_tokens=stats.prompt_tokens, generated_tokens=stats.generated_tokens,
        rounds=stats.rounds, drafted_tokens=stats.drafted_tokens,
        accepted_tokens=stats.accepted_tokens, seconds=stats.seconds,
        pipelined_rounds=stats.pipelined_rounds, predrafts_wasted=stats.predrafts_wasted,
        k_per_round=stats.k_per_round, confidence_exits=stats.confidence_exits,
        mean_head_size=stats.mean_head_size, lookup_rounds=stats.lookup_rounds,
        lookup_drafted_tokens=stats.lookup_drafted_tokens,
        lookup_accepted_tokens=stats.lookup_accepted_tokens,
        guess_rounds=stats.guess_rounds,
        guess_rejections=stats.guess_rejections, guess_bonus_misses=stats.guess_bonus_misses,
        coordinator_replica=stats.coordinator_replica, coordinator_node=stats.coordinator_node,
        draft_replicas=stats.draft_replicas, target_replicas=stats.target_replicas)


def chunk_to_proto(chunk: Chunk) -> generate_pb2.GenerateChunk:
    msg = generate_pb2.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids,
                                     kinds=[k.value for k in chunk.kinds],
                                     token_texts=chunk.token_texts,
                                     finish_reason=chunk.finish_reason or "")
    if chunk.stats is not None:
        msg.stats.CopyFrom(stats_to_proto(chunk.stats))
    return msg


def completion_to_proto(completion: Completion) -> generate_pb2.GenerateResponse:
    return generate_pb2.GenerateResponse(
        text=completion.text, token_ids=completion.token_ids,
        kinds=[k.value for k in completion.kinds], token_texts=completion.token_texts,
        finish_reason=completion.finish_reason, stats=stats_to_proto(completion.stats))
