"""What the client returns: token kinds, generation stats, stream chunks, completions.

Plain frozen dataclasses with tuples inside, so a result can be kept, compared and
hashed without holding on to protobuf messages. `specdec.client.convert` builds them
from the wire messages.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from specdec.logprobs import TokenLogprobs
from specdec.v1 import generate_pb2


class TokenKind(enum.Enum):
    """How a generated token came to be (the wire's `specdec.v1.TokenKind`).

    The values are the proto enum's numbers; `str(kind)` is the lower-case name.
    """

    ACCEPTED = generate_pb2.TOKEN_KIND_ACCEPTED  # a draft token the target accepted
    RECOVERED = generate_pb2.TOKEN_KIND_RECOVERED  # resampled by the target after a rejection
    BONUS = generate_pb2.TOKEN_KIND_BONUS  # from the target after all K drafts were accepted
    TARGET = generate_pb2.TOKEN_KIND_TARGET  # target-only decoding (K = 0, or no draft)

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Stats:
    """How a generation went (the wire's GenerationStats), with two derived rates."""

    prompt_tokens: int
    generated_tokens: int
    rounds: int
    drafted_tokens: int
    accepted_tokens: int
    seconds: float
    pipelined_rounds: int  # rounds whose drafts were pre-drafted during the last Verify
    predrafts_wasted: int  # pre-drafts thrown away (an assumption that did not hold)
    k_per_round: tuple[int, ...]  # the K each round used
    confidence_exits: int  # rounds the draft cut short (its confidence fell too low)
    mean_head_size: float = 0.0  # contrastive decoding: mean |V_head| over scored positions
    # Rounds drafted by the model-free look-up, and their drafts (included above).
    lookup_rounds: int = 0
    lookup_drafted_tokens: int = 0
    lookup_accepted_tokens: int = 0
    # Rounds that started an all-accepted pre-draft, and how many rejected a draft or
    # accepted all with another bonus than the draft's guess.
    guess_rounds: int = 0
    guess_rejections: int = 0
    guess_bonus_misses: int = 0
    # Who served it (only from a coordinator run with --expose-replicas): the coordinator
    # replica and Ray node, and the draft and target replicas it was pinned to, in order.
    # Predicted Outputs: the prediction's tokens, and the drafts taken from it / accepted.
    prediction_tokens: int = 0
    prediction_drafted_tokens: int = 0
    prediction_accepted_tokens: int = 0
    # Structured outputs: tokens the grammar forced, committed without a model pass.
    forced_tokens: int = 0
    # The drafting decision: the K chosen per round on average, and why it was 0 in the
    # rounds where it was ("" when never).
    mean_k: float = 0.0
    k_reason: str = ""
    coordinator_replica: str = ""
    coordinator_node: str = ""
    draft_replicas: tuple[str, ...] = ()
    target_replicas: tuple[str, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted tokens, in [0, 1]; None when nothing was drafted."""
        if self.drafted_tokens == 0:
            return None
        return self.accepted_tokens / self.drafted_tokens

    @property
    def tokens_per_round(self) -> float | None:
        """Generated tokens per round (per target pass); None when there was no round."""
        if self.rounds == 0:
            return None
        return self.generated_tokens / self.rounds


@dataclass(frozen=True)
class Chunk:
    """One streamed piece of a generation (about one round's tokens).

    `token_texts` has one entry per token (possibly empty: a character split across
    tokens comes with the token completing it); joined they equal `text`.
    `finish_reason` ("length", "eos" or "stop") and `stats` are set on the last
    chunk only, None before it.
    """

    text: str
    token_ids: tuple[int, ...]
    kinds: tuple[TokenKind, ...]
    token_texts: tuple[str, ...]
    finish_reason: str | None = None
    stats: Stats | None = None
    # Asked for (logprobs=...): one per token; the first chunk's prompt_logprobs, one
    # per prompt token after the first (prompt_logprobs=True), with the prompt's ids.
    logprobs: tuple[TokenLogprobs, ...] = ()
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Completion:
    """A whole generation: what the chunks of its stream add up to.

    `finish_reason` is "length" (max_new_tokens reached, or the model's context
    full), "eos" (the model ended) or "stop" (a stop string; it is cut from `text`).
    """

    text: str
    token_ids: tuple[int, ...]
    kinds: tuple[TokenKind, ...]
    token_texts: tuple[str, ...]
    finish_reason: str
    stats: Stats
    logprobs: tuple[TokenLogprobs, ...] = ()  # as in Chunk
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
