"""Adaptive K and the confidence exit: how many tokens each round drafts.

AdaptiveK chooses the number of draft tokens each round to maximise tokens per second.

From what the generation has measured so far (exponential moving averages):
per-token acceptance `a`, the draft's time per drafted token `d` (Propose latency / K,
network included) and the target's Verify latency as `v0 + v1 * K`. Expected tokens per
round are (1 - a^(K+1)) / (1 - a) (Leviathan et al.); a round costs `K d + v(K)` when
sequential. With pipelined drafting, the next round's drafts are ready when Verify
returns whenever all K are accepted and the bonus matches the draft's guess (probability
~a^(K+1)); such a round costs max((K+1) d, v(K)) instead (the draft proposes K+1: its
guess at the bonus). The K with the best ratio wins.

With `k_min = 0` (contrastive decoding, whose plain form is a real alternative) K = 0 may
win: a round of one token at `v(0)`. Choosing it stops the acceptance measurements, so
after `probe_every` such rounds one round drafts a single token, and the choice is made
again from what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass


def ema(old: float | None, new: float, keep: float) -> float:
    """Exponential moving average: `keep` is the weight of the old value (None: none yet)."""
    return new if old is None else keep * old + (1 - keep) * new


@dataclass
class AdaptiveK:
    k_max: int
    k: int = 4  # the current choice (also the first round's K)
    pipelined: bool = False
    smoothing: float = 0.3  # weight of the newest observation in each moving average
    alpha: float = 0.7  # prior acceptance until measured
    draft_s_per_token: float | None = None
    verify_base_s: float | None = None
    verify_per_token_s: float = 0.0
    k_min: int = 1  # 0: K = 0 (no drafts) is a choice too
    probe_every: int = 16  # rounds at K = 0 before one round drafts again
    _idle_rounds: int = 0

    def __post_init__(self) -> None:
        self.k = max(self.k_min, 1, min(self.k, self.k_max))

    def _ema(self, old: float | None, new: float) -> float:
        return ema(old, new, 1 - self.smoothing)

    def observe(self, k: int, accepted: int, rejected: bool, propose_s: float | None,
                verify_s: float, proposed: int = 0) -> None:
        """One round's outcome: `accepted` of `k` drafts, whether one was rejected, and the
        Propose (None when pre-drafted; it drafted `proposed` tokens, default k) and
        Verify latencies."""
        if k <= 0:
            self.verify_base_s = self._ema(self.verify_base_s, verify_s)
            if self.k == 0:
                self._idle_rounds += 1
                if self._idle_rounds >= self.probe_every:
                    self._idle_rounds, self.k = 0, 1  # measure acceptance again
            return
        self._idle_rounds = 0
        # Each round is accepted-many Bernoulli successes and at most one failure.
        trials = accepted + (1 if rejected else 0)
        if trials:
            self.alpha = self._ema(self.alpha, accepted / trials)
        if propose_s is not None:
            self.draft_s_per_token = self._ema(self.draft_s_per_token,
                                               propose_s / max(proposed or k, 1))
        base = self.verify_base_s if self.verify_base_s is not None else verify_s
        slope = max(0.0, (verify_s - base) / k)
        self.verify_per_token_s = self._ema(self.verify_per_token_s, slope)
        if self.verify_base_s is None:
            self.verify_base_s = verify_s / (1 + 0.1 * k)  # rough until a K=0 round is seen
        self.k = self.best()

    def expected_tokens(self, k: int) -> float:
        a = min(self.alpha, 0.999)
        return (1 - a ** (k + 1)) / (1 - a)

    def round_seconds(self, k: int) -> float:
        d = self.draft_s_per_token or 0.0
        v = (self.verify_base_s or 0.0) + self.verify_per_token_s * k
        sequential = k * d + v
        if not self.pipelined:
            return sequential
        p = min(self.alpha, 0.999) ** (k + 1)
        return p * max((k + 1) * d, v) + (1 - p) * sequential

    def best(self) -> int:
        if self.draft_s_per_token is None:
            return self.k
        return max(range(self.k_min, self.k_max + 1),
                   key=lambda k: self.expected_tokens(k) / max(self.round_seconds(k), 1e-9))


@dataclass
class ConfidenceExit:
    """The draft-side confidence exit's threshold, adapted to recent acceptance.

    The draft stops proposing once its probability of the token it drew is below
    `threshold`. After each round the threshold moves towards the acceptance the loop
    aims for (the "target matchness" of Draft & Verify, Zhang et al. 2023): smoothed
    acceptance at or below `target_acceptance` raises it by `step` (the draft stops
    sooner, fewer drafts are wasted), above lowers it (longer rounds); the threshold
    itself is smoothed so that one bad round does not swing it. Everything depends on
    tokens only, never on time, so a seeded generation stays reproducible.
    """

    threshold: float = 0.3  # initial
    target_acceptance: float = 0.8
    step: float = 0.05
    acceptance_smoothing: float = 0.5  # weight of the old average (beta1)
    threshold_smoothing: float = 0.5  # weight of the old threshold (beta2)
    max_threshold: float = 0.95
    acceptance: float | None = None

    def __post_init__(self) -> None:
        self.threshold = min(max(self.threshold, 0.0), self.max_threshold)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.acceptance = ema(self.acceptance, accepted / drafted, self.acceptance_smoothing)
        moved = self.threshold + (self.step if self.acceptance <= self.target_acceptance
                                  else -self.step)
        self.threshold = min(max(ema(self.threshold, moved, self.threshold_smoothing), 0.0),
                             self.max_threshold)
