"""The look-up's cost model: how many of its drafts to send, and the hybrid's units.

Costs are in one-token target rounds (a target-only round = 1), fixed, so that every
choice depends on tokens only, never on measured times or on a round's own draws: a
seeded sampled generation draws the same text whatever the timing, and every round
stays lossless whichever drafter supplied it.

How many of a look-up's tokens to send (coordinator.drafters.lookup): each draft verified
costs the target a little (`verify_cost`), and a draft is accepted with a per-token
probability `a` that depends on how long a context suffix matched and whether that
suffix was always followed by the same token. `a` is learnt per generation and such
bucket (accepted drafts over accepted drafts plus rejections, the geometric model of
Leviathan et al. 2023, from a prior), and the look-up sends the n tokens that maximise
(1 + a + ... + a^n) / (1 + verify_cost * n), the expected tokens per round over its
cost; n = 0 (a weak match in chat text) means the look-up sits the round out. The
hybrid (coordinator.drafters.hybrid) compares that with the model's round costs.
The measurements behind the constants are in docs/benchmarks.md ("Who drafts").
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.drafters.trie import (
    DEFAULT_DEPTH,
    DEFAULT_MAX_MATCH,
    DEFAULT_MIN_PROB,
)


@dataclass(frozen=True)
class LookupSettings:
    """The look-up's limits and the hybrid's cost model. Costs are in one-token target
    rounds (a target-only round = 1), fixed, so that the choice depends on tokens only."""

    max_tokens: int = 8  # drafts per look-up round at most
    min_match: int = 2  # hybrid: a match this long uses the look-up outright
    verify_cost: float = 0.12  # a verified draft's cost
    # A model round whose drafts a pre-draft already holds: the draft's K+1 steps of the
    # next pre-draft bound it.
    ready_round_cost: float = 2.3
    # A model round that must Propose first.
    fresh_round_cost: float = 3.4
    max_match: int = DEFAULT_MAX_MATCH
    min_prob: float = DEFAULT_MIN_PROB
    depth: int = DEFAULT_DEPTH


# Prior per-token acceptance of look-up drafts by match length (the shortest length of
# each bucket in MATCH_EDGES), when the matched suffix had one continuation (`UNIQUE`)
# and when it had several, as two drafts' worth of evidence. They follow the acceptance
# measured on the shipped prompts' greedy text (docs/design.md, section 19, "How many
# drafts to send"); a match of the longest length looked up (8) is nearly always a copy.
# Sampled rounds accept a draft x with probability p(x) rather than when it is the argmax,
# so a copy is accepted less surely: their priors stay lower (at temperature 0.7 the
# greedy ones cost the look-up alone on extraction much of its speedup: docs/benchmarks.md,
# "Who drafts").
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
