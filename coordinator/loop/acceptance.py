"""What a generation's model drafts are worth: its per-token acceptance, learnt from its
own rounds, started from a prior kept per drafter and per kind of request.

Kinds differ in how often the target takes the draft's tokens: a sampled request
accepts a draft with probability min(1, p/q) rather than when it is the target's argmax;
penalties, a logit bias or min_p change p (and q) away from the two models' plain
agreement; a grammar masks both. So each kind keeps its own replica-wide prior, which
every finished round of that kind teaches; a new generation starts from its kind's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ACCEPTANCE = 0.7  # before any round of a kind was seen


@dataclass
class Acceptance:
    """Per-token acceptance of model drafts, as decayed counts: accepted drafts over
    accepted drafts plus rejections (a round is accepted-many successes and at most one
    failure: the geometric model of Leviathan et al. 2023). A ratio of sums, not an
    average of per-round ratios, which a round of one rejected draft would drag to 0.
    `prior_weight` trials of the prior start it."""

    prior: float = PRIOR_ACCEPTANCE
    prior_weight: float = 8.0
    keep: float = 0.97  # weight of the past at each round (about a generation's rounds)
    accepted: float = 0.0
    trials: float = 0.0

    @property
    def rate(self) -> float:
        w = self.prior_weight
        return (self.accepted + w * self.prior) / (self.trials + w)

    def observe(self, accepted: int, drafted: int) -> None:
        if drafted <= 0:
            return
        self.accepted = self.keep * self.accepted + accepted
        self.trials = self.keep * self.trials + accepted + (1 if accepted < drafted else 0)


def kind_of(sampling) -> str:
    """The kind of request a generation's acceptance prior is kept for
    (specdec.sampling.SamplingParams)."""
    parts = ["greedy" if sampling.greedy else "sampled"]
    if sampling.penalised or getattr(sampling, "min_p", 0.0):
        parts.append("penalised")
    if sampling.grammar is not None:
        parts.append("grammar")
    return "+".join(parts)


@dataclass
class Priors:
    """Replica-wide acceptance per (drafter, kind), each slow to forget."""

    keep: float = 0.99
    by_kind: dict[str, Acceptance] = field(default_factory=dict)

    def of(self, drafter: str, kind: str) -> Acceptance:
        key = f"{drafter}/{kind}"
        if key not in self.by_kind:
            # a kind not seen yet starts from what its drafter earns on every kind
            others = [a for k, a in self.by_kind.items() if k.startswith(f"{drafter}/")]
            prior = sum(a.rate for a in others) / len(others) if others else PRIOR_ACCEPTANCE
            self.by_kind[key] = Acceptance(prior=prior, keep=self.keep)
        return self.by_kind[key]

    def describe(self) -> dict[str, float]:
        return {k: a.rate for k, a in self.by_kind.items()}
