"""Which drafter supplies a round: the draft model, or a model-free look-up.

Per generation, `Drafters` keeps the look-up's suffix trie over the prompt and the
committed ids (coordinator.lookup) and chooses each round between

  * the look-up's proposal: free to draft, one Verify, no call to the draft service;
  * the draft model's: a Propose (or a pre-draft already done during the last Verify).

The drafter modes (`--drafter`):
  model   the draft model only (what specdec did before the look-up existed);
  lookup  the look-up only; a round with no match is a target-only round. Needs no draft
          service at all (`--no-draft`);
  hybrid  per round, whichever promises more tokens per unit of cost (running
          acceptance statistics and a fixed cost model); else the draft model.

How many of a look-up's tokens to send: each draft verified costs the target a little
(`verify_cost` of a one-token step, 0.10-0.16 for SmolLM2 on one CPU core), and a draft
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
    """The look-up's limits and the hybrid's cost model. Costs are in one-token target
    rounds (a target-only round = 1), fixed, so that the choice depends on tokens only."""

    max_tokens: int = 8  # drafts per look-up round at most
    min_match: int = 3  # hybrid: a match this long uses the look-up outright
    verify_cost: float = 0.12  # a verified draft's cost (paged SmolLM2: 0.10-0.16)
    # A model round whose drafts a pre-draft already holds: the draft's K+1 steps of the
    # next pre-draft bound it (SmolLM2, one core each: 55 against 22 ms on an AMD EPYC,
    # about 92 against 43 ms on the previous machine).
    ready_round_cost: float = 2.3
    # A model round that must Propose first (92 against 22 ms; 115 against 43 ms).
    fresh_round_cost: float = 3.4
    max_match: int = DEFAULT_MAX_MATCH
    min_prob: float = DEFAULT_MIN_PROB
    depth: int = DEFAULT_DEPTH


# Prior per-token acceptance of look-up drafts by match length (the shortest length of
# each bucket in MATCH_EDGES), when the matched suffix had one continuation (`UNIQUE`)
# and when it had several, as two drafts' worth of evidence. Measured on the shipped
# prompts' greedy text: 0.45, 0.59, 0.65, 0.73-0.78, 0.84 and 0.97 per token for one
# continuation; a match of the longest length looked up (8) is nearly always a copy.
# Sampled rounds accept a draft x with probability p(x) rather than when it is the argmax,
# so a copy is accepted less surely: their priors stay lower (at temperature 0.7 the
# greedy ones took the look-up alone on extraction from 1.91x to 1.24x, 4 repeats).
MATCH_EDGES = (1, 2, 3, 4, 6, DEFAULT_MAX_MATCH)
PRIOR = (0.4, 0.55, 0.65, 0.75, 0.85, 0.95)
PRIOR_SEVERAL = (0.15, 0.35, 0.5, 0.6, 0.7, 0.85)
SAMPLED_PRIOR = (0.3, 0.5, 0.65, 0.75, 0.8, 0.8)
SAMPLED_PRIOR_SEVERAL = (0.1, 0.25, 0.4, 0.55, 0.55, 0.55)
PRIOR_WEIGHT = 2.0
UNIQUE = 0.99  # a first draft this likely (empirically) had one continuation


class Acceptance:
    """Per-token acceptance of look-up drafts, by match length and whether the match had
    one continuation (geometric model), from the greedy or the sampled priors."""

    def __init__(self, greedy: bool = True) -> None:
        priors = PRIOR + PRIOR_SEVERAL if greedy else SAMPLED_PRIOR + SAMPLED_PRIOR_SEVERAL
        self.accepted = [PRIOR_WEIGHT * a for a in priors]
        self.trials = [PRIOR_WEIGHT] * len(priors)

    @staticmethod
    def bucket(match_len: int, unique: bool = True) -> int:
        b = max(0, sum(1 for edge in MATCH_EDGES if match_len >= edge) - 1)
        return b + (0 if unique else len(PRIOR))

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
                 has_model: bool, cache: OutputCache | None = None, tenant: str | None = None,
                 greedy: bool = True):
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
        self.acceptance = Acceptance(greedy)
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
        """LOOKUP or MODEL for this round: the one with more expected tokens per unit of
        cost. `model_drafts_ready`: a pre-draft holds the draft model's proposal, so its
        round costs `ready_round_cost`, else `fresh_round_cost` (it must Propose first).
        A look-up round costs one target round plus `verify_cost` a draft, and when it
        displaces ready model drafts, also the pipeline's chain: the next round has no
        pre-draft, which costs the difference of the two model rounds if that round is the
        model's, as it most likely is once a look-up draft is rejected (1 - a^n). While
        the model's acceptance is unknown, a match of `min_match` tokens decides."""
        if not found:
            return MODEL
        if self.mode != HYBRID:
            return self.mode
        s = self.settings
        if self.model_accepted is None:
            return LOOKUP if found.match_len >= s.min_match and not model_drafts_ready \
                else MODEL
        n = len(found.tokens)
        model_cost = s.ready_round_cost if model_drafts_ready else s.fresh_round_cost
        cost = 1 + s.verify_cost * n
        if model_drafts_ready:
            a = self.acceptance.rate(found.match_len, found.first_prob >= UNIQUE)
            cost += (s.fresh_round_cost - s.ready_round_cost) * (1 - a ** n)
        return LOOKUP if (1 + found.expected) / cost > \
            (1 + self.model_accepted) / model_cost else MODEL

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
