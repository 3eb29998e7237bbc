"""The hybrid drafter: per round, the look-up's drafts or the draft model's.

Each round it compares expected tokens per unit of cost (coordinator.drafters.costs's cost
model, in one-token target rounds): the look-up's proposal costs one target round plus
`verify_cost` a draft, and when it displaces model drafts a pre-draft already holds,
also the pipeline's chain (the next round then has no model drafts); the model's round
costs `ready_round_cost` with its drafts at hand, `fresh_round_cost` without. While the
model's acceptance is unknown, a match of `min_match` tokens decides. The choice depends
on tokens only, never on time or on the round's own draws, so a seeded sampled
generation draws the same text whatever the timing, and every round stays lossless.

The draft model keeps drafting whichever wins: after a look-up round its pre-draft
assumes the look-up's drafts are accepted (coordinator.drafters.model).
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.drafters.adaptive import ema
from coordinator.drafters.base import LOOKUP, MODEL, Drafts, Outcome
from coordinator.drafters.costs import UNIQUE, LookupSettings
from coordinator.drafters.lookup import LookupDrafter
from coordinator.drafters.model import ModelDrafter
from coordinator.drafters.prediction import PREDICTION
from coordinator.drafters.trie import Lookup

_DECAY = 0.3  # weight of the newest round in the model's accepted drafts per round
TRUST = 0.5  # a prediction accepted at least this well per token drafts outright


class HybridDrafter:
    source = "hybrid"

    def __init__(self, model: ModelDrafter, lookup: LookupDrafter, settings: LookupSettings):
        self.model, self.lookup, self.settings = model, lookup, settings
        self.model_accepted: float | None = None  # accepted drafts per model round

    def propose(self, context: Sequence[int], k: int) -> Drafts:
        found = self.lookup.find(context, self.lookup.cap(k))
        if found and self.choose(found, self.model.ready is not None) == LOOKUP:
            self.model.propose(context, 0)  # its pre-draft, if any, is not used
            return self.lookup.drafts(found)
        return self.model.propose(context, k)

    def choose(self, found: Lookup, model_ready: bool) -> str:
        """LOOKUP or MODEL: the one with more expected tokens per unit of cost. A client's
        prediction that is holding (per-token acceptance at least TRUST) is taken
        outright: its runs are long, and the client says the text is likely."""
        if found.source == PREDICTION and self.lookup.prediction.rate >= TRUST:
            return LOOKUP
        s = self.settings
        if self.model_accepted is None:
            return LOOKUP if found.match_len >= s.min_match and not model_ready else MODEL
        n = len(found.tokens)
        model_cost = s.ready_round_cost if model_ready else s.fresh_round_cost
        cost = 1 + s.verify_cost * n
        if model_ready:
            a = self.lookup.acceptance.rate(found.match_len, found.first_prob >= UNIQUE)
            cost += (s.fresh_round_cost - s.ready_round_cost) * (1 - a ** n)
        return LOOKUP if (1 + found.expected) / cost > \
            (1 + self.model_accepted) / model_cost else MODEL

    def prepare(self, context: Sequence[int], drafts: Drafts, k: int,
                seeds: tuple[int | None, int | None] = (None, None)):
        return self.model.prepare(context, drafts, k, seeds)

    def fetch(self, context: Sequence[int], k: int, guess: bool = False,
              seed: int | None = None):
        return self.model.fetch(context, k, guess, seed)

    @property
    def has_drafts(self) -> bool:
        return self.model.has_drafts

    def fetched(self, reply) -> None:
        self.model.fetched(reply)

    def observe(self, outcome: Outcome) -> None:
        if outcome.drafts.source == MODEL:
            self.model_accepted = ema(self.model_accepted, outcome.accepted, 1 - _DECAY)
        self.model.observe(outcome)
        self.lookup.observe(outcome)

    def finished(self) -> None:
        self.model.finished()
        self.lookup.finished()
