"""The drafter interface: who proposes a round's drafts, and what it learns from the round.

A round is propose -> verify -> decide -> observe (coordinator.loop.engine). A drafter
takes part twice:

* `propose(context, k)`: at most k drafts after `context` (the committed ids), from what
  it holds now: a look-up computes them on the spot; the draft model hands over what it
  drafted during the last Verify (pipelining), or nothing. No I/O.
* `observe(outcome)`: the round's result (what was committed, how many drafts were
  accepted) and, for a drafter that asked the draft service for something, its reply.

Between the two, a drafter backed by the draft model may ask for the next round's drafts
(`prepare`): the engine sends every generation's request to the draft service in one
batch while the target verifies. This is transformers' CandidateGenerator
(`get_candidates`, `update_candidate_strategy`), split so that remote work is batched
across generations.

A drafter never decides which tokens are emitted (verification does), so any drafter,
and any choice between drafters made from the past, keeps the output lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

MODEL, LOOKUP, HYBRID, NONE = "model", "lookup", "hybrid", "none"
DRAFTERS = (MODEL, LOOKUP, HYBRID)  # --drafter: who drafts


@dataclass(frozen=True)
class Drafts:
    """A round's drafts x_1..x_k and the q each was drawn from."""

    tokens: list[int] = field(default_factory=list)
    dists: list = field(default_factory=list)  # SparseDist per draft as sent; [] when greedy
    probs: list[float] = field(default_factory=list)  # q_i(x_i); 1.0 for greedy / point mass
    source: str = NONE
    # The draft model's guess at the bonus after all k (its k+1-th token): a pipelined
    # pre-draft of the next round assumes it. None: no guess (a look-up, a confidence
    # exit, or none was drafted).
    guess: int | None = None
    exited_early: bool = False  # the draft's confidence exit cut them short
    pipelined: bool = False  # drafted during the previous round's Verify
    step_seconds: float = 0.0  # the draft's mean pass duration for them (0 = unknown)

    def __len__(self) -> int:
        return len(self.tokens)


NO_DRAFTS = Drafts()


@dataclass(frozen=True)
class Outcome:
    """What a round did, as a drafter sees it."""

    committed: list[int]  # the generation's ids after the round (prompt and output)
    drafts: Drafts  # what the round verified
    accepted: int  # how many of them were accepted
    reply: object = None  # the reply to the drafter's `prepare` request, if it made one


class Drafter(Protocol):
    source: str

    def propose(self, context: Sequence[int], k: int) -> Drafts:
        """At most k drafts after `context`, from what the drafter holds now."""

    def prepare(self, context: Sequence[int], drafts: Drafts, k: int):
        """A request for the draft service, sent during this round's Verify, for the next
        round's k drafts (None: nothing to ask)."""

    def fetch(self, context: Sequence[int], k: int, guess: bool = False,
              seed: int | None = None):
        """A request for this round's k drafts (and a guess at the bonus after them,
        coupled with the round's bonus seed), sent and answered (`fetched`) before its
        Verify: sequential drafting, or a pipelined round whose pre-draft missed (None:
        nothing to ask)."""

    def observe(self, outcome: Outcome) -> None:
        """The round's outcome (and the reply to `prepare`'s request)."""

    def finished(self) -> None:
        """The generation is over."""
