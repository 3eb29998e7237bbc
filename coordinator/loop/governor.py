"""A closed loop on what drafting actually earns: drafting never makes the system slower.

The planner (coordinator.loop.plan) predicts from fitted costs; what it cannot see is what
the whole machine pays, e.g. on a machine shared by both services and the coordinator,
the CPU that drafting takes from everything else. So the engine runs in windows of
`WINDOW_S` seconds, each window in one of two arms:

  draft   the planner chooses K (what it predicts pays);
  plain   every generation whose request left K to the server decodes target-only.

and measures each arm's committed tokens per second per live generation (steps' tokens
over their wall time and generations), per load bucket (live generations, in powers of
two, rounded: the services' costs change with the batch). Each bucket starts with a
window of each arm, then keeps to the better one, trying the other again every
`PROBE_EVERY` windows (`PROBE_EVERY_CLEAR` when one arm leads by more than `CLEAR`), as
TurboSpec (Liu et al. 2024) keeps speculation under feedback control. A window counts
every step, its first ones too: what a switch costs (after one to drafting, the draft
first fills its caches) is the arm's to pay. Windows are timed, not counted in steps, so
that a probe of the slower arm costs the same share of time whatever its steps take. A
request that set K is never switched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coordinator.drafters.adaptive import ema

WINDOW_S = 3.0  # seconds per window
PROBE_EVERY = 8  # windows between tries of the arm that is behind
PROBE_EVERY_CLEAR = 24  # ... when the better arm leads by more than CLEAR
CLEAR = 0.2
KEEP = 0.6  # weight of the past in an arm's moving average, per window
DRAFT, PLAIN = "draft", "plain"


def bucket(generations: int) -> int:
    """Live generations in powers of two, rounded (1, 2, 3-5, 6-11, 12-22, 23-45, ...):
    N streams keep about N generations live, sometimes one or two fewer."""
    return round(math.log2(generations)) if generations > 0 else -1


@dataclass
class Arm:
    rate: float | None = None  # tokens per second per generation (moving average)
    tokens: float = 0.0  # this window's, so far
    gen_seconds: float = 0.0


class Governor:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.arms: dict[int, dict[str, Arm]] = {}
        self.arm = DRAFT
        self.window_s = 0.0  # this window's seconds so far
        self.windows = 0  # since the last switch of arm choice
        self.current = 0  # the bucket this window is measured for

    def drafting(self, generations: int) -> bool:
        """Whether this step may draft (for the generations whose K is the server's)."""
        if not self.enabled:
            return True
        if self.window_s == 0.0:
            self._choose(bucket(generations))
        return self.arm == DRAFT

    def observe(self, generations: int, tokens: int, seconds: float) -> None:
        """A step committed `tokens` for `generations` generations in `seconds`."""
        if not self.enabled or seconds <= 0:
            return
        if bucket(generations) == self.current:
            arm = self._arms(self.current)[self.arm]
            arm.tokens += tokens
            arm.gen_seconds += generations * seconds
        self.window_s += seconds
        if self.window_s >= WINDOW_S:
            arm = self._arms(self.current)[self.arm]
            if arm.gen_seconds > 0:
                arm.rate = ema(arm.rate, arm.tokens / arm.gen_seconds, KEEP)
            arm.tokens = arm.gen_seconds = 0.0
            self.window_s = 0.0

    def _arms(self, b: int) -> dict[str, Arm]:
        return self.arms.setdefault(b, {DRAFT: Arm(), PLAIN: Arm()})

    def _choose(self, b: int) -> None:
        arms = self._arms(b)
        self.current = b
        unmeasured = [name for name in (DRAFT, PLAIN) if arms[name].rate is None]
        if unmeasured:
            self._switch(unmeasured[0])
            return
        best = DRAFT if arms[DRAFT].rate >= arms[PLAIN].rate else PLAIN
        other = PLAIN if best == DRAFT else DRAFT
        lead = arms[best].rate / max(arms[other].rate, 1e-9) - 1
        every = PROBE_EVERY_CLEAR if lead > CLEAR else PROBE_EVERY
        self.windows += 1
        self._switch(other if self.windows % every == 0 else best)

    def _switch(self, arm: str) -> None:
        self.arm = arm

    def describe(self) -> str:
        return ", ".join(f"~{2 ** b}: " + "/".join(
            f"{name} {a.rate:.1f}" if a.rate is not None else f"{name} -"
            for name, a in arms.items()) for b, arms in sorted(self.arms.items()))
