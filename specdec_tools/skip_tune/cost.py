"""The cost model of a greedy speculative loop, from agreement flags and step costs.

Greedy rounds are deterministic given where the draft agrees with the target: when the
round starts after the first s tokens of the target's text, the draft proposes text[s],
text[s+1], ... for as long as its prediction from the true prefix matches (while it
matches, its prefix *is* the true prefix), so the round accepts the run of consecutive
agreements from s, capped at K, and the target adds one token (its correction or
bonus). `simulate` replays exactly that over the calibration text, so correlated
agreement (easy spans, hard spans) is counted as it falls, not as an i.i.d. rate.

Time per sequential round: K draft steps, one target verify of K+1 tokens and two RPC
overheads (Propose, Verify); target-only pays one step and one RPC per token. The
predicted speedup is the ratio of the two rates, the same quantity as
specdec_tools.bench.harness.SPEEDUP_DEFINITION (speculative tok/s over target-only tok/s).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Rounds:
    tokens: int  # tokens produced (accepted drafts + one target token per round)
    rounds: int
    drafted: int
    accepted: int

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / max(self.rounds, 1)

    @property
    def acceptance(self) -> float:
        return self.accepted / max(self.drafted, 1)


def simulate(flags: Sequence[Sequence[bool]], k: int) -> Rounds:
    """Replay greedy rounds of `k` drafts over each sequence of agreement flags.

    flags[j][i] is True when the draft, given the true prefix, predicts generated token
    i of sequence j. A sequence of n tokens is consumed round by round; a round drafts
    min(k, tokens left - 1) tokens (the last token always comes from the target)."""
    if k < 1:
        raise ValueError("k must be >= 1")
    tokens = rounds = drafted = accepted = 0
    for seq in flags:
        n, s = len(seq), 0
        while s < n:
            budget = min(k, n - s - 1)
            run = 0
            while run < budget and seq[s + run]:
                run += 1
            drafted += budget
            accepted += run
            rounds += 1
            tokens += run + 1
            s += run + 1
    return Rounds(tokens, rounds, drafted, accepted)


@dataclass(frozen=True)
class StepCosts:
    """Measured milliseconds: `draft_ms` one draft step; `verify_ms(n)` a target pass over
    n tokens (n=1 is a target-only step); `rpc_ms` one RPC's overhead."""

    draft_ms: float
    verify_ms: Callable[[int], float]
    rpc_ms: float = 1.0

    def round_ms(self, k: int) -> float:
        return k * self.draft_ms + self.verify_ms(k + 1) + 2 * self.rpc_ms

    def target_only_ms_per_token(self) -> float:
        return self.verify_ms(1) + self.rpc_ms


@dataclass(frozen=True)
class Prediction:
    k: int
    speedup: float
    tokens_per_round: float
    acceptance: float
    c: float  # draft step over target step


def predict(flags: Sequence[Sequence[bool]], costs: StepCosts, k: int) -> Prediction:
    r = simulate(flags, k)
    spec_rate = r.tokens / (r.rounds * costs.round_ms(k))
    base_rate = 1.0 / costs.target_only_ms_per_token()
    return Prediction(k, spec_rate / base_rate, r.tokens_per_round, r.acceptance,
                      costs.draft_ms / costs.verify_ms(1))


def best(flags: Sequence[Sequence[bool]], costs: StepCosts, ks: Sequence[int]) -> Prediction:
    """The prediction at the K (of `ks`) with the highest predicted speedup."""
    return max((predict(flags, costs, k) for k in ks), key=lambda p: p.speedup)


def break_even_acceptance(c: float, k: int, verify_ratio: float = 1.0) -> float:
    """The per-token acceptance a at which K drafts break even, with i.i.d. acceptance
    (Leviathan et al. 2023: expected tokens per round (1 - a^(K+1)) / (1 - a), round
    cost K c + t(K+1)/t(1) target steps). Bisection on a in [0, 1); 1.0 when even
    a -> 1 does not pay."""

    def gain(a: float) -> float:
        tokens = k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
        return tokens / (k * c + verify_ratio) - 1.0

    if gain(1.0) <= 0:
        return 1.0
    lo, hi = 0.0, 1.0
    if gain(lo) >= 0:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gain(mid) < 0 else (lo, mid)
    return hi
