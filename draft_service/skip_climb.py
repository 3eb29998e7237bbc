"""Choosing the skip set on the fly from what the rounds return (SWIFT-style, Xia et al.
2024, "SWIFT: On-the-Fly Self-Speculative Decoding"; training-free).

The candidates are nested: skip the first m layers of a ranked order (specdec tune-skip
writes one), m in [0, max_skip]. Every round the draft learns, from the session's next
Propose, how many of its tokens were kept and how long the round took from its Propose
to the next (draft steps, the target's verify and the network: everything the draft
cannot see directly). The rate (accepted + 1) / round seconds is averaged per m.

The search is hill climbing with a bounded budget: the service drafts with the best m it
has measured, and once per `window` rounds it spends one window on a neighbour (m + 1
or m - 1, in turn), never further; stale figures decay so the choice follows the text.
Which m drafts a round depends only on rounds already finished, so the draft's q is
still the distribution it sampled from: greedy output is unchanged and sampled output
exact in distribution, whatever the climber does.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class _Rate:
    value: float = 0.0
    weight: float = 0.0  # decayed count of rounds behind `value`

    def add(self, x: float, decay: float) -> None:
        self.value = (self.value * self.weight * decay + x) / (self.weight * decay + 1)
        self.weight = self.weight * decay + 1


@dataclass
class SkipClimber:
    order: tuple[int, ...]  # layers, the first to skip first
    max_skip: int
    window: int = 16  # rounds per decision
    decay: float = 0.97  # per observed round, of the older figures
    start: int = 0  # m to begin with
    rates: dict[int, _Rate] = field(default_factory=dict)

    def __post_init__(self):
        if not 0 <= self.start <= self.max_skip <= len(self.order):
            raise ValueError(f"on-the-fly skipping: need 0 <= start {self.start} <= max "
                             f"{self.max_skip} <= {len(self.order)} ranked layers")
        self.m = self.best = self.start
        self._rounds = 0
        self._direction = 1
        self._lock = threading.Lock()
        self.history: list[int] = [self.start]  # m per decision, for stats and tests

    def skip_set(self, m: int | None = None) -> tuple[int, ...]:
        return tuple(sorted(self.order[: self.m if m is None else m]))

    def observe(self, m: int, accepted: int, seconds: float) -> None:
        """One finished round drafted with `m`: `accepted` tokens kept, `seconds` from its
        Propose to the session's next."""
        if seconds <= 0:
            return
        with self._lock:
            for rate in self.rates.values():
                rate.weight *= self.decay
            self.rates.setdefault(m, _Rate()).add((accepted + 1) / seconds, 1.0)
            self._rounds += 1
            if self._rounds % self.window == 0:
                self._decide()

    def _decide(self) -> None:
        measured = {m: r.value for m, r in self.rates.items() if r.weight >= 1.0}
        if measured:
            best = max(measured, key=measured.get)
            if best != self.best:
                log.info("skipping on the fly: best is now %d layers skipped (%s), %.1f "
                         "tokens/s per session", best, ",".join(map(str, self.skip_set(best))),
                         measured[best])
            self.best = best
        if self.m != self.best:  # a probe ended (or the best moved): back to the best
            self.m = self.best
        else:  # probe one neighbour of the best for the next window
            for step in (self._direction, -self._direction):
                if 0 <= self.best + step <= self.max_skip:
                    self.m = self.best + step
                    self._direction = -step
                    break
        self.history.append(self.m)
