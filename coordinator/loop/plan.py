"""K per step from goodput over both services.

A lockstep step sends every generation's pre-draft to the draft service and every
Verify to the target at once; it lasts as long as the slower of the two, plus what the
coordinator itself spends between steps:

    T(K) = max(D, V) + o,    D = (K + 1) * d(n),    V = t(total tokens verified)

d(n) is the draft's pass time with n sessions in it (each pre-draft is K + 1 tokens, one
pass each), t(x) the target's pass time for x tokens, both least-squares lines over
recent passes as the services report them (ProposeResponse.step_seconds,
VerifyResponse.pass_*), and o an average of the measured rest. A generation drafting K
with per-token acceptance a yields (1 - a^(K+1)) / (1 - a) tokens in a round whose
drafts a pre-draft holds; a pre-draft holds when its assumption did (all K accepted and
the guess right, a^(K+1); after a miss, the lead guess, a), so in the long run a
fraction pi = a / (1 - a^(K+1) + a) of its rounds have drafts and the others yield one
token. The K in [0, K_max], and the generations that draft at all (those with the best
acceptance first), that give the most expected tokens per second win: the goodput that
TurboSpec (Liu et al. 2024) controls, with the draft's cost in it as SpecEdge (2025) and
WISP (2026) model a remote draft's. K falls when the draft is the bottleneck (d grows
with n) and when the target is (t grows with the tokens); K = 0 for a generation whose
drafts do not pay, and for everyone when none do.

Until both services' costs are measured, every generation drafts the default K. Whether
drafting pays at all is checked against measured throughput by the governor
(coordinator.loop.governor), whose draft windows also keep acceptance measured.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from coordinator.drafters.adaptive import ema

SAMPLES = 128  # recent passes each line is fitted over
MIN_SAMPLES = 8  # passes seen before a line is trusted
AMORTISE_STEPS = 4.0  # a cold draft session's catch-up, as steps of drafting it pays for
PRIOR_ACCEPTANCE = 0.7


class Fit:
    """seconds = sum(c_i * feature_i), least squares over recent samples (ridge-damped,
    so that features that have not varied yet, e.g. one session only, stay near 0)."""

    def __init__(self, features: int, ridge: float = 1e-3):
        self.samples: deque = deque(maxlen=SAMPLES)
        self.features, self.ridge = features, ridge
        self._coef = None

    def add(self, x: tuple[float, ...], seconds: float) -> None:
        if seconds > 0:
            self.samples.append((x, seconds))
            self._coef = None

    @property
    def ready(self) -> bool:
        return len(self.samples) >= MIN_SAMPLES

    def coef(self) -> list[float]:
        if self._coef is None:
            x = np.array([s[0] for s in self.samples], dtype=np.float64)
            y = np.array([s[1] for s in self.samples], dtype=np.float64)
            a = x.T @ x + self.ridge * np.eye(self.features) * max(1.0, len(y))
            a[0, 0] -= self.ridge * max(1.0, len(y))  # the constant is not damped
            self._coef = [float(c) for c in np.linalg.lstsq(a, x.T @ y, rcond=None)[0]]
        return self._coef

    def __call__(self, *x: float) -> float:
        return max(0.0, sum(c * v for c, v in zip(self.coef(), x, strict=True)))


@dataclass
class Costs:
    """What a step costs, measured: a VerifyBatch by the tokens it verifies (its wall
    time), those of rounds (one per session and its drafts) apart from the rest a
    prefill feeds (a prompt's tokens cost far less each than a token per session: fitted
    together, prefills flatten the slope and drafts look free); a draft pass by the
    sessions in it (as the draft reports its passes); the rest of a ProposeBatch (its
    first pass, which feeds each session's catch-up, and the call) by the tokens that
    first pass feeds; and the coordinator's own time between the calls."""

    target: Fit = field(default_factory=lambda: Fit(3))  # 1, round tokens, prefill tokens
    draft_pass: Fit = field(default_factory=lambda: Fit(2))  # 1, sessions
    draft_first: Fit = field(default_factory=lambda: Fit(2))  # 1, tokens fed first
    overhead_s: float | None = None

    @property
    def ready(self) -> bool:
        return self.target.ready and self.draft_pass.ready and self.draft_first.ready \
            and self.overhead_s is not None

    def verify_s(self, tokens: float, prefill: float = 0.0) -> float:
        """A VerifyBatch of `tokens` in rounds (1 + drafts each) and `prefill` more."""
        return self.target(1.0, tokens, prefill)

    def draft_s(self, passes: int, sessions: int, first_tokens: float) -> float:
        """A ProposeBatch of `passes` passes over `sessions` sessions whose first pass
        feeds `first_tokens` in all."""
        return self.draft_first(1.0, first_tokens) + \
            (passes - 1) * self.draft_pass(1.0, sessions)

    def drafted(self, passes: int, sessions: int, first_tokens: int, wall_s: float,
                pass_s: float) -> None:
        """A ProposeBatch took `wall_s`; its passes after the first took `pass_s` each."""
        if passes > 1 and pass_s > 0:
            self.draft_pass.add((1.0, sessions), pass_s)
        self.draft_first.add((1.0, first_tokens), wall_s - (passes - 1) * pass_s)

    def step(self, wall_s: float, services_s: float) -> None:
        self.overhead_s = ema(self.overhead_s, max(0.0, wall_s - services_s), 0.9)


@dataclass
class Candidate:
    """One generation as the planner sees it."""

    acceptance: float  # per-token acceptance of its model drafts
    cap: int  # the most drafts it may verify (its request's K, what is left to generate)
    drafts_with_model: bool  # it has a draft model to ask (else K only caps a look-up)
    fixed: bool = False  # its request set K: it drafts its cap whatever the load
    catch_up: int = 1  # tokens the draft must feed before drafting for it (cold: all)
    remaining: int = 64  # tokens it still wants
    extra_target_tokens: int = 0  # fed to the target this step beyond a round (a prefill)
    ready: bool = False  # model drafts for this round are at hand (a pre-draft held)
    cold: bool = False  # the draft holds nothing of it yet (its first drafts prefill)
    greedy: bool = False  # its output is the target's whichever drafts a round has


class Planner:
    def __init__(self, default_k: int, k_max: int, adaptive: bool = True):
        self.default_k, self.k_max = default_k, k_max
        self.adaptive = adaptive  # False: every generation drafts its cap
        self.costs = Costs()
        self.last_k = 0  # the step's K (metrics, tests)

    def plan(self, gens: list[Candidate]) -> list[int]:
        """K for each generation this step."""
        default = [g.cap if g.fixed else min(g.cap, self.default_k) for g in gens]
        if not self.adaptive or not gens:
            return default
        if not self.costs.ready:
            self.last_k = max(default, default=0)
            return default
        model = sorted((i for i, g in enumerate(gens)
                        if g.drafts_with_model and g.cap > 0 and not g.fixed),
                       key=lambda i: (-gens[i].acceptance, gens[i].catch_up))
        if not model:  # nobody drafts with the model: K only caps look-ups
            return default
        best, best_k, best_m = self.goodput(gens, model, 0, 0), 0, 0
        for k in range(1, min(self.k_max, max(gens[i].cap for i in model)) + 1):
            for m in range(1, len(model) + 1):
                g = self.goodput(gens, model, k, m)
                if g > best:
                    best, best_k, best_m = g, k, m
        out = [0] * len(gens)
        for i in model[:best_m]:
            out[i] = min(best_k, gens[i].cap)
        for i, g in enumerate(gens):
            if g.fixed:
                out[i] = g.cap
            elif not g.drafts_with_model:
                out[i] = min(g.cap, best_k or self.default_k)  # a look-up's cap
        self.last_k = best_k
        return out

    def fetch_pays(self, gens: list[Candidate], ks: list[int], missing: list[int]) -> bool:
        """Whether this step should draft first for the generations in `missing` (their
        pre-draft missed), so that their rounds have drafts, rather than verify them
        without: the draft then works while the target waits. Judged on this step's
        expected tokens per second. Before the costs are measured: only when nobody has
        drafts at hand and no draft session is cold (a prefill: the two services then
        prefill side by side instead, while the target decodes the first token alone)."""
        if not self.costs.ready:
            return all(not g.ready for g in gens) and not any(gens[i].cold for i in missing)
        exp = []
        for i, g in enumerate(gens):
            a, k = min(g.acceptance, 0.99), ks[i]
            exp.append((1 - a ** (k + 1)) / (1 - a) if k and g.drafts_with_model else 1.0)
        ready = [i for i, g in enumerate(gens) if g.ready and ks[i]]
        base_tokens = sum(exp[i] for i in ready) + len(gens) - len(ready)
        target = len(gens) + sum(ks[i] for i in ready)
        prefill = sum(g.extra_target_tokens for g in gens)
        drafting = self.costs.draft_s(max(ks) + 1, len(ready) + len(missing),
                                      2 * (len(ready) + len(missing)))
        o = self.costs.overhead_s or 0.0
        without = base_tokens / (max(self.costs.verify_s(target, prefill), drafting) + o)
        first = self.costs.draft_s(max(ks[i] for i in missing) + 1, len(missing),
                                   sum(gens[i].catch_up for i in missing))
        more = sum(exp[i] - 1 for i in missing)
        extra = sum(ks[i] for i in missing)
        with_ = (base_tokens + more) / (
            first + max(self.costs.verify_s(target + extra, prefill), drafting) + o)
        return with_ > without

    def describe(self) -> str:
        c = self.costs
        if not c.ready:
            return "not measured yet"
        t, p, f = c.target.coef(), c.draft_pass.coef(), c.draft_first.coef()
        return (f"verify {t[0] * 1e3:.1f} + {t[1] * 1e3:.2f}/token + {t[2] * 1e3:.2f}/prefill "
                f"token ms, draft pass "
                f"{p[0] * 1e3:.1f} + {p[1] * 1e3:.2f}/session ms, first pass and call "
                f"{f[0] * 1e3:.1f} + {f[1] * 1e3:.2f}/token ms, overhead "
                f"{c.overhead_s * 1e3:.1f} ms")

    def goodput(self, gens: list[Candidate], model: list[int], k: int, m: int) -> float:
        """Expected tokens per second of a step where the first m of `model` draft k
        (module notes). A cold draft session's catch-up is paid once: it is charged to
        this step in proportion to the steps the generation has left."""
        tokens = target_tokens = float(len(gens))
        prefill = sum(g.extra_target_tokens for g in gens)
        fed = 0.0
        for i in model[:m]:
            g = gens[i]
            a = min(g.acceptance, 0.99)
            kk = min(k, g.cap)
            pi = a / (1 - a ** (kk + 1) + a)
            per_round = (1 - a ** (kk + 1)) / (1 - a)
            per_step = 1 + pi * (per_round - 1)
            tokens += per_step - 1
            target_tokens += pi * kk
            steps_left = max(1.0, g.remaining / per_step)
            fed += 1 + g.catch_up * min(1.0, AMORTISE_STEPS / steps_left)
        seconds = self.costs.verify_s(target_tokens, prefill)
        if m:
            seconds = max(seconds, self.costs.draft_s(k + 1, m, fed))
        return tokens / (seconds + (self.costs.overhead_s or 0.0))


@dataclass
class Acceptance:
    """Per-token acceptance of model drafts, as decayed counts: accepted drafts over
    accepted drafts plus rejections (a round is accepted-many successes and at most one
    failure: the geometric model of Leviathan et al. 2023). A ratio of sums, not an
    average of per-round ratios, which a round of one rejected draft would drag to 0.
    `prior_weight` trials of the prior start it."""

    prior: float = PRIOR_ACCEPTANCE
    prior_weight: float = 4.0
    keep: float = 0.9  # weight of the past at each round
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
