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
matched. `a` is learnt per generation and match length (accepted drafts over accepted
drafts plus rejections, the geometric model of Leviathan et al. 2023, from a prior), and
the look-up sends the n tokens that maximise (1 + a + ... + a^n) / (1 + verify_cost * n),
the expected tokens per round over its cost; n = 0 (a weak match in chat text) means the
look-up sits the round out.

The other statistics are per generation, moving averages of what each drafter's rounds
gave: accepted drafts, and the round's wall time. The choice depends on tokens and
measured times, never on the round's own random draws, so every round stays lossless
whichever drafter supplied it (greedy output never depends on the choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
MODEL, LOOKUP = "model", "lookup"
_DECAY = 0.3  # weight of the newest observation in the moving averages


@dataclass(frozen=True)
class LookupSettings:
    max_tokens: int = 8  # drafts per look-up round at most
    min_match: int = 3  # hybrid: a match this long uses the look-up outright
    verify_cost: float = 0.15  # a verified draft's cost, in one-token target steps
    max_match: int = DEFAULT_MAX_MATCH
    min_prob: float = DEFAULT_MIN_PROB
    depth: int = DEFAULT_DEPTH


class _Average:
    def __init__(self) -> None:
        self.value: float | None = None
        self.n = 0

    def add(self, x: float) -> None:
        self.n += 1
        self.value = x if self.value is None else (1 - _DECAY) * self.value + _DECAY * x


# Prior per-token acceptance of look-up drafts by match length (1, 2, 3, 4+): as one
# accepted and one rejected draft's worth of evidence around these rates.
PRIOR = (0.2, 0.4, 0.6, 0.75)
PRIOR_WEIGHT = 2.0


class Acceptance:
    """Per-token acceptance of look-up drafts, by match length (geometric model)."""

    def __init__(self) -> None:
        self.accepted = [PRIOR_WEIGHT * a for a in PRIOR]
        self.trials = [PRIOR_WEIGHT] * len(PRIOR)

    @staticmethod
    def bucket(match_len: int) -> int:
        return min(max(match_len, 1), len(PRIOR)) - 1

    def rate(self, match_len: int) -> float:
        b = self.bucket(match_len)
        return self.accepted[b] / self.trials[b]

    def observe(self, match_len: int, drafted: int, accepted: int) -> None:
        b = self.bucket(match_len)
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
        self.accepted = {MODEL: _Average(), LOOKUP: _Average()}
        self.seconds = {MODEL: _Average(), LOOKUP: _Average()}
        self.acceptance = Acceptance()

    @property
    def uses_lookup(self) -> bool:
        return self.trie is not None

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
        if not found:
            return NO_LOOKUP
        n, expected = best_length(self.acceptance.rate(found.match_len), len(found.tokens),
                                  s.verify_cost)
        return Lookup(found.tokens[:n], found.match_len, expected) if n else NO_LOOKUP

    def choose(self, found: Lookup, model_drafts_ready: bool) -> str:
        """LOOKUP or MODEL for this round. `model_drafts_ready`: a pre-draft already
        holds the draft model's proposal (it then costs no more than a look-up)."""
        if not found:
            return MODEL
        if self.mode == LOOKUP:
            return LOOKUP
        if self.mode == MODEL:
            return MODEL
        if found.match_len >= self.settings.min_match:
            return LOOKUP
        model_acc = self.accepted[MODEL].value
        if model_acc is None:
            return MODEL
        lookup_acc = found.expected
        if model_drafts_ready:
            return LOOKUP if lookup_acc > model_acc else MODEL
        t_l, t_m = self.seconds[LOOKUP].value, self.seconds[MODEL].value
        if t_l is None or t_m is None:
            return LOOKUP if lookup_acc > model_acc else MODEL
        return LOOKUP if (1 + lookup_acc) / t_l > (1 + model_acc) / t_m else MODEL

    def observe(self, source: str, drafted: int, accepted: int, seconds: float,
                match_len: int = 0) -> None:
        """A round of `source` accepted `accepted` of its `drafted` drafts in `seconds`
        (a look-up's: after a context match of `match_len` tokens)."""
        self.accepted[source].add(accepted)
        self.seconds[source].add(seconds)
        if source == LOOKUP:
            self.acceptance.observe(match_len, drafted, accepted)

    def committed(self, tokens: Sequence[int]) -> None:
        if self.trie is not None:
            self.trie.extend(tokens)
        self.output.extend(tokens)

    def finished(self) -> None:
        """The generation is over: its output joins the tenant's cache (when on)."""
        if self.cache is not None and self.output:
            self.cache.add(self.tenant, self.output)
