"""What the planner's steps delivered of their prediction, measured (coordinator.loop.plan).

The cost model leaves things out: the CPU that streaming every round takes on a shared
host, the steps a switch to drafting costs, the acceptance model's errors. They show as
the ratio of tokens per second delivered to those predicted, and that ratio multiplies
the predicted goodput of a planned step, so drafting must beat target-only by what such
steps have been falling short of their prediction lately.
"""

from __future__ import annotations

import math

FEW_DRAFTING = 0.25  # at most this share of a step's generations drafting is "a few"
CALIBRATION_KEEP = 0.98  # weight of the past in the sums, per step


class Calibration:
    """Tokens per second delivered over predicted, apart by `share` (steps where none, a
    few or more generations draft: the model's errors differ, a step where one
    generation of 16 drafts delivering about what a target-only step does, one where all
    draft what the draft's pipeline does) and per load (live generations in powers of
    two, rounded: the model's errors change with the batch), as decayed sums (ratios of
    sums: a step's luck averages out). Each starts at 1, is shrunk towards 1 by `weight`
    steps' worth of exact predictions, and a load not seen yet borrows every load's of
    the same share."""

    NONE, FEW, MOST = 0, 1, 2  # the shares

    def __init__(self, keep: float = CALIBRATION_KEEP, weight: float = 8.0):
        self.keep, self.weight = keep, weight
        # (load, share) -> steps, tokens, predicted tokens, seconds, predicted seconds
        self.sums: dict[tuple[int, int], list[float]] = {}

    @staticmethod
    def load(generations: int) -> int:
        return round(math.log2(max(1, generations)))

    @staticmethod
    def share(drafting: int, generations: int) -> int:
        """NONE: none of the step's generations drafts; FEW: at most FEW_DRAFTING of
        them; MOST: more."""
        if drafting <= 0:
            return Calibration.NONE
        return Calibration.FEW if drafting <= FEW_DRAFTING * generations \
            else Calibration.MOST

    def observe(self, generations: int, drafting: int, tokens: float,
                predicted_tokens: float, seconds: float, predicted_seconds: float) -> None:
        """A step of `generations`, `drafting` of them drafting, delivered `tokens` in
        `seconds` where the model predicted the others."""
        if predicted_tokens <= 0 or predicted_seconds <= 0 or seconds <= 0:
            return
        key = (self.load(generations), self.share(drafting, generations))
        s = self.sums.setdefault(key, [0.0] * 5)
        for j, x in enumerate((1.0, tokens, predicted_tokens, seconds, predicted_seconds)):
            s[j] = self.keep * s[j] + x

    def seen(self, generations: int, share: int) -> float:
        """Decayed steps measured at this load and share."""
        return self.sums.get((self.load(generations), share), [0.0])[0]

    def factor(self, generations: int, share: int) -> float:
        s = self.sums.get((self.load(generations), share))
        if s is None or s[0] <= 0:
            every = [v for (_, d), v in self.sums.items() if d == share]
            s = [sum(v[j] for v in every) for j in range(5)] if every else None
        if s is None or s[0] <= 0:
            return 1.0
        n, tok, ptok, sec, psec = s
        wt, ws = self.weight * ptok / n, self.weight * psec / n
        rate = ((tok + wt) / (ptok + wt)) / ((sec + ws) / (psec + ws))
        return min(max(rate, 0.5), 1.5)

    def factors(self, generations: int) -> tuple[float, float, float]:
        """The factor of each share (indexed by NONE, FEW, MOST) at this load."""
        return tuple(self.factor(generations, s) for s in (self.NONE, self.FEW, self.MOST))

    def describe(self, generations: int) -> str:
        none, few, most = self.factors(generations)
        return f"most drafting {most:.2f}, a few {few:.2f}, plain {none:.2f}"
