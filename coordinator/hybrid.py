"""Which drafter supplies a round: the draft model, or a model-free look-up.

Per generation, `Drafters` keeps the look-up's suffix trie over the prompt and the
committed ids (coordinator.lookup) and chooses each round between

  * the look-up's proposal: free to draft, one Verify, no call to the draft service;
  * the draft model's: a Propose (or a pre-draft already done during the last Verify).

The drafter modes (`--drafter`):
  model   the draft model only (what specdec did before the look-up existed);
  lookup  the look-up only; a round with no match is a target-only round. Needs no draft
          service at all (`--no-draft`);
  hybrid  the look-up when its match is long enough or its expected tokens per second
          beat the draft model's, from running statistics; else the draft model.

How many of a look-up's tokens to send: each draft verified costs the target a little
(`verify_cost` of a one-token step, about 0.15 for SmolLM2 on one CPU core), and a draft
is accepted with a per-token probability `a` that depends on how long a context suffix
matched and whether that suffix was always followed by the same token. `a` is learnt per
generation and such bucket (accepted drafts over accepted drafts plus rejections, the
geometric model of Leviathan et al. 2023, from a prior), and
the look-up sends the n tokens that maximise (1 + a + ... + a^n) / (1 + verify_cost * n),
the expected tokens per round over its cost; n = 0 (a weak match in chat text) means the
look-up sits the round out.

The draft model's accepted drafts per round are a moving average per generation. The
choice depends on tokens only (no measured times), never on the round's own random
draws: every round stays lossless whichever drafter supplied it, and a seeded sampled
generation draws the same text whatever the timing (greedy output is the target's
anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.adaptive import ema
from coordinator.lookup import (
    DEFAULT_DEPTH,
    DEFAULT_MAX_MATCH,
    DEFAULT_MIN_PROB,
    NO_LOOKUP,
    Lookup,
    OutputCache,
    SuffixTrie,
    better,
)

DRAFTERS = ("model", "lookup", "hybrid")
MODEL, LOOKUP, HYBRID = DRAFTERS
_DECAY = 0.3  # weight of the newest observation in the model's moving average


@dataclass(frozen=True)
class LookupSettings:
    max_tokens: int = 8  # drafts per look-up round at most
    min_match: int = 3  # hybrid: a match this long uses the look-up outright
    verify_cost: float = 0.15  # a verified draft's cost, in one-token target steps
    # A model round that must Propose first, in look-up rounds: the draft's K+1 steps
    # and the Verify, against the Verify alone (measured on SmolLM2, 1 core each: about
    # 115 against 45 ms).
    fresh_round_cost: float = 2.5
    max_match: int = DEFAULT_MAX_MATCH
    min_prob: float = DEFAULT_MIN_PROB
    depth: int = DEFAULT_DEPTH


# Prior per-token acceptance of look-up drafts by match length (1, 2, 3, 4+), when the
# matched suffix had one continuation (`UNIQUE`) and when it had several: as two drafts'
# worth of evidence around these rates.
PRIOR = (0.3, 0.5, 0.65, 0.8)
PRIOR_SEVERAL = (0.1, 0.25, 0.4, 0.55)
PRIOR_WEIGHT = 2.0
UNIQUE = 0.99  # a first draft this likely (empirically) had one continuation
# A look-up round in place of a model round whose drafts are ready breaks the pipeline's
# chain (the next round's model drafts are not pre-drafted): it must promise this many
# more accepted drafts.
CHAIN_MARGIN = 1.0


class Acceptance:
    """Per-token acceptance of look-up drafts, by match length and whether the match had
    one continuation (geometric model)."""

    def __init__(self) -> None:
        priors = PRIOR + PRIOR_SEVERAL
        self.accepted = [PRIOR_WEIGHT * a for a in priors]
        self.trials = [PRIOR_WEIGHT] * len(priors)

    @staticmethod
    def bucket(match_len: int, unique: bool = True) -> int:
        return min(max(match_len, 1), len(PRIOR)) - 1 + (0 if unique else len(PRIOR))

    def rate(self, match_len: int, unique: bool = True) -> float:
        b = self.bucket(match_len, unique)
        return self.accepted[b] / self.trials[b]

    def observe(self, match_len: int, drafted: int, accepted: int,
                unique: bool = True) -> None:
        b = self.bucket(match_len, unique)
        self.accepted[b] += accepted
        self.trials[b] += accepted + (1 if accepted < drafted else 0)


def best_length(a: float, available: int, verify_cost: float) -> tuple[int, float]:
    """The number of drafts n <= available maximising (1 + a + ... + a^n) /
    (1 + verify_cost * n), and the expected accepted drafts a + ... + a^n; (0, 0) when
    no draft beats a plain step."""
    best, gain, expected, total, term = 0, 1.0, 0.0, 0.0, 1.0
    for n in range(1, available + 1):
        term *= a
        total += term
        g = (1 + total) / (1 + verify_cost * n)
        if g > gain:
            best, gain, expected = n, g, total
    return best, expected


class Drafters:
    """One generation's look-up drafter and its choice of drafter per round."""

    def __init__(self, mode: str, prompt: Sequence[int], settings: LookupSettings,
                 has_model: bool, cache: OutputCache | None = None, tenant: str | None = None):
        if mode not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {mode!r}")
        self.mode = mode if has_model else (LOOKUP if mode != MODEL else MODEL)
        self.settings = settings
        self.cache = cache if tenant is not None else None
        self.tenant = tenant
        self.trie = SuffixTrie(settings.depth) if self.mode != MODEL else None
        if self.trie is not None:
            self.trie.extend(prompt)
        self.output: list[int] = []
        self.model_accepted: float | None = None  # accepted drafts per model round
        self.acceptance = Acceptance()
        self.last = NO_LOOKUP  # the latest proposal (what a look-up round drafted)

    @property
    def uses_model(self) -> bool:
        return self.mode != LOOKUP

    def lookup(self, context: Sequence[int], max_tokens: int) -> Lookup:
        """The look-up's proposal after `context` (the committed ids), from this
        generation's own text and, when on, the tenant's recent outputs."""
        if self.trie is None or max_tokens <= 0:
            return NO_LOOKUP
        s = self.settings
        n = min(max_tokens, s.max_tokens)
        found = self.trie.draft(context, n, s.max_match, s.min_prob)
        if self.cache is not None:
            found = better(found, self.cache.draft(self.tenant, context, n, s.max_match,
                                                   s.min_prob))
        self.last = NO_LOOKUP
        if not found:
            return NO_LOOKUP
        rate = self.acceptance.rate(found.match_len, found.first_prob >= UNIQUE)
        n, expected = best_length(rate, len(found.tokens), s.verify_cost)
        if n:
            self.last = Lookup(found.tokens[:n], found.match_len, expected, found.first_prob)
        return self.last

    def choose(self, found: Lookup, model_drafts_ready: bool) -> str:
        """LOOKUP or MODEL for this round. `model_drafts_ready`: a pre-draft already
        holds the draft model's proposal: it costs no more than a look-up, and using it
        keeps the pipeline's chain going, so the look-up must promise CHAIN_MARGIN more
        accepted drafts. Otherwise the model's round must Propose first
        (`fresh_round_cost` look-up rounds), and the two compare expected tokens per
        unit of cost; a match of `min_match` tokens decides while the model's acceptance
        is unknown."""
        if not found:
            return MODEL
        if self.mode != HYBRID:
            return self.mode
        model_acc = self.model_accepted
        if model_drafts_ready:
            return LOOKUP if model_acc is not None and \
                found.expected > model_acc + CHAIN_MARGIN else MODEL
        if model_acc is None:
            return LOOKUP if found.match_len >= self.settings.min_match else MODEL
        return LOOKUP if (1 + found.expected) * self.settings.fresh_round_cost > \
            1 + model_acc else MODEL

    def observe(self, source: str, drafted: int, accepted: int) -> None:
        """A round of `source` accepted `accepted` of its `drafted` drafts."""
        if source == MODEL:
            self.model_accepted = ema(self.model_accepted, accepted, 1 - _DECAY)
        else:
            last = self.last
            self.acceptance.observe(last.match_len, drafted, accepted,
                                    last.first_prob >= UNIQUE)

    def committed(self, tokens: Sequence[int]) -> None:
        if self.trie is not None:
            self.trie.extend(tokens)
        self.output.extend(tokens)

    def finished(self) -> None:
        """The generation is over: its output joins the tenant's cache (when on)."""
        if self.cache is not None and self.output:
            self.cache.add(self.tenant, self.output)
