"""What a lockstep step costs, measured: the lines the planner (coordinator.loop.plan)
predicts a step's time from.

A step lasts `F + max(V, D) + o`:

  V  the VerifyBatch, by the tokens it verifies in rounds (1 + drafts per generation),
     the tokens it prefills beyond them (a prompt's tokens cost far less each: fitted
     together, prefills would flatten the slope and drafts look free), and whether the
     draft service computed beside it (`busy`): the cost the services' own timings
     cannot show, e.g. both services and the coordinator sharing one host's cores and
     memory bandwidth. It is a measured term like the others, learnt from steps that
     drafted and steps that did not (coordinator.loop.plan probes when it has no such
     steps and the choice is close). Every step that drafts also verifies two tokens
     or more, so it holds whatever that step costs too: on the Qwen pair the target's
     own pass rose 22 ms from one token to two (docs/benchmarks.md, the fourth host);
  D  the ProposeBatch of the pre-drafts: a first pass that feeds each session what the
     round committed (by those tokens) and one pass per further drafted position (by
     the sessions still drafting at that position, as the draft reports its passes);
  F  a fetch: the same, waited for before the Verify (coordinator.loop.engine);
  o  the coordinator's own time, by the generations it steps and those that draft.

Each line is a least-squares fit over recent samples of every size, robust (Huber weights, so that a
step slowed by something else, e.g. a compile or a neighbour's burst, does not bend the
line) and ridge-damped (a feature that has not varied yet, e.g. one session only, stays
near 0).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

BUCKET_SAMPLES = 32  # recent samples kept per size class of a line's main feature
# A line is fitted again after this many new samples and this long (a fit is a few
# solves: on tiny models, steps of a few ms would otherwise pay one every step).
REFIT_EVERY = 8
REFIT_MIN_S = 0.25
MIN_SAMPLES = 8  # samples seen before a line is trusted
HUBER = 1.5  # residuals beyond this many robust deviations weigh less
IRLS_ROUNDS = 5


class Fit:
    """seconds = sum(c_i * feature_i): robust, ridge-damped least squares; feature 0 is
    the constant (not damped). Samples are kept per size class of feature 1 (powers of
    two), the last BUCKET_SAMPLES of each: a load that stays the same for a while would
    otherwise leave only samples of one size, through which any slope fits (the line
    must still say what a step of another size costs, e.g. one without drafts)."""

    def __init__(self, features: int, ridge: float = 1e-3):
        self.buckets: dict[int, deque] = {}
        self.features, self.ridge = features, ridge
        self._coef: list[float] | None = None
        self._scale = 0.0
        self._fresh = 0  # samples added since the last fit
        self._fitted_at = 0.0

    def add(self, x: tuple[float, ...], seconds: float) -> None:
        if seconds > 0:
            size = int(max(1.0, x[1])).bit_length() if len(x) > 1 else 0
            self.buckets.setdefault(size, deque(maxlen=BUCKET_SAMPLES)).append((x, seconds))
            self._fresh += 1
            if self._fresh >= REFIT_EVERY and \
                    time.monotonic() - self._fitted_at >= REFIT_MIN_S:
                self._coef = None

    @property
    def samples(self) -> list:
        return [s for b in self.buckets.values() for s in b]

    @property
    def ready(self) -> bool:
        return sum(len(b) for b in self.buckets.values()) >= MIN_SAMPLES

    def coef(self) -> list[float]:
        if self._coef is None:
            self._fresh, self._fitted_at = 0, time.monotonic()
            samples = self.samples
            x = np.array([s[0] for s in samples], dtype=np.float64)
            y = np.array([s[1] for s in samples], dtype=np.float64)
            damp = self.ridge * np.eye(self.features) * max(1.0, len(y))
            damp[0, 0] = 0.0
            w = np.ones(len(y))
            coef, scale = np.zeros(self.features), 0.0
            for _ in range(IRLS_ROUNDS):
                xw = x * w[:, None]
                coef = np.linalg.lstsq(xw.T @ x + damp, xw.T @ y, rcond=None)[0]
                r = y - x @ coef
                scale = 1.4826 * float(np.median(np.abs(r - np.median(r)))) or 1e-6
                a = np.abs(r) / (HUBER * scale)
                w = np.where(a <= 1.0, 1.0, 1.0 / np.maximum(a, 1e-12))
            self._coef = [float(c) for c in coef]
            self._scale = scale
        return self._coef

    @property
    def scale(self) -> float:
        """The residuals' robust standard deviation (seconds): how much one sample
        strays from the line."""
        self.coef()
        return self._scale

    def __call__(self, *x: float) -> float:
        return max(0.0, sum(c * v for c, v in zip(self.coef(), x, strict=True)))

    def count(self, feature: int, value: float) -> int:
        """Recent samples whose `feature` equals `value`."""
        return sum(1 for x, _ in self.samples if x[feature] == value)


@dataclass
class Costs:
    """The step's lines (module notes)."""

    target: Fit = field(default_factory=lambda: Fit(4))  # 1, round tokens, prefill, busy
    draft_pass: Fit = field(default_factory=lambda: Fit(2))  # 1, sessions
    draft_first: Fit = field(default_factory=lambda: Fit(2))  # 1, tokens fed first
    overhead: Fit = field(default_factory=lambda: Fit(3))  # 1, generations, drafting

    @property
    def ready(self) -> bool:
        return all(f.ready for f in (self.target, self.draft_pass, self.draft_first,
                                     self.overhead))

    @property
    def busy_known(self) -> bool:
        """Whether the draft's cost to the target has been seen both ways lately."""
        return min(self.target.count(3, 0.0), self.target.count(3, 1.0)) >= MIN_SAMPLES // 2

    def seen_width(self, tokens: int) -> bool:
        """Whether a Verify of about `tokens` round tokens, or fewer, was measured lately
        (the line is trusted down to there)."""
        size = int(max(1, tokens)).bit_length()
        return any(b <= size and q for b, q in self.target.buckets.items())

    def verify_s(self, tokens: float, prefill: float = 0.0, busy: bool = False) -> float:
        """A VerifyBatch of `tokens` in rounds and `prefill` more, the draft computing
        beside it or not."""
        return self.target(1.0, tokens, prefill, 1.0 if busy else 0.0)

    def pass_s(self, sessions: float) -> float:
        return self.draft_pass(1.0, sessions)

    def draft_s(self, passes: int, sessions: int, first_tokens: float) -> float:
        """A ProposeBatch of `passes` passes over `sessions` sessions whose first pass
        feeds `first_tokens` in all."""
        return self.draft_first(1.0, first_tokens) + (passes - 1) * self.pass_s(sessions)

    def overhead_s(self, generations: int, drafting: int) -> float:
        return self.overhead(1.0, generations, drafting)

    # -- learning --------------------------------------------------------------------

    def verified(self, tokens: int, prefill: int, busy: bool, seconds: float) -> None:
        self.target.add((1.0, tokens, prefill, 1.0 if busy else 0.0), seconds)

    def drafted(self, passes: int, sessions: int, first_tokens: int, wall_s: float,
                pass_s: float) -> None:
        """A ProposeBatch took `wall_s`; its passes after the first took `pass_s` each."""
        if passes > 1 and pass_s > 0:
            self.draft_pass.add((1.0, sessions), pass_s)
        self.draft_first.add((1.0, first_tokens), wall_s - (passes - 1) * pass_s)

    def step(self, generations: int, drafting: int, wall_s: float,
             services_s: float) -> None:
        """The step's wall time against the calls it waited for: the rest is ours."""
        self.overhead.add((1.0, generations, drafting), max(1e-5, wall_s - services_s))

    def describe(self) -> dict[str, float]:
        """The fitted terms, in seconds (metrics and logs); {} until measured."""
        if not self.ready:
            return {}
        t, p, f, o = (x.coef() for x in (self.target, self.draft_pass, self.draft_first,
                                         self.overhead))
        return {"verify_base": t[0], "verify_per_token": t[1], "verify_per_prefill_token": t[2],
                "verify_draft_busy": t[3], "draft_pass_base": p[0],
                "draft_pass_per_session": p[1], "draft_first_base": f[0],
                "draft_first_per_token": f[1], "overhead_base": o[0],
                "overhead_per_generation": o[1], "overhead_per_drafting": o[2]}

    def summary(self) -> str:
        d = self.describe()
        if not d:
            return "not measured yet"
        ms = {k: v * 1e3 for k, v in d.items()}
        return (f"verify {ms['verify_base']:.1f} + {ms['verify_per_token']:.2f}/token + "
                f"{ms['verify_per_prefill_token']:.2f}/prefill token + "
                f"{ms['verify_draft_busy']:.1f} draft busy ms; draft pass "
                f"{ms['draft_pass_base']:.1f} + {ms['draft_pass_per_session']:.2f}/session, "
                f"first {ms['draft_first_base']:.1f} + {ms['draft_first_per_token']:.2f}/token "
                f"ms; overhead {ms['overhead_base']:.1f} + "
                f"{ms['overhead_per_generation']:.2f}/gen + "
                f"{ms['overhead_per_drafting']:.2f}/drafting gen ms")
