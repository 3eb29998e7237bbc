"""K per generation, every step, from a model of what a step costs and what each
generation's drafts are worth.

A lockstep step sends every generation's pre-draft to the draft service and every
Verify to the target at once; it lasts (coordinator.loop.costs)

    T = max(V, D) + o

with V the target's pass over every round's tokens (and whether the draft computes
beside it), D the draft's passes (each pre-draft is K_i + 1 tokens: a first pass for
everyone, then one pass per further position over the sessions still drafting), and o
the coordinator's own time. A generation drafting K with per-token acceptance a yields
R = (1 - a^(K+1)) / (1 - a) tokens in a round whose drafts a pre-draft holds; a
pre-draft holds when its assumption did (all K accepted and the guess right, a^(K+1);
after a miss, the lead guess, a), so in the long run a fraction
pi = a / (1 - a^(K+1) + a) of its rounds have drafts, the others one token.

Each generation's K (0 = target-only) maximises the step's expected tokens per second,
one generation at a time given the others' (coordinate ascent from the last step's
choice, and from the other end: none drafting, or all; the better wins):
TurboSpec's goodput (Liu et al. 2024) with the draft's cost in it, as SpecEdge
(2025) and WISP (2026) model a remote draft's, decided per generation. K falls when the
draft is the bottleneck and when the target is; a generation whose drafts do not pay
drafts none, and says why (`reasons`): its acceptance against the break-even acceptance
at which one draft would pay.

`a` is the generation's own (coordinator.loop.acceptance), learnt from its rounds and
started from its kind's prior. What the services' timings cannot show (the draft taking
the target's CPU or memory bandwidth on a shared host) is the costs' `busy` term. To
learn it both ways on the same generations, when it has not been seen and drafting wins
by less than PROBE_MARGIN, every PROBE_EVERY-th step is a probe: the generations whose
K is the server's run it target-only. A request that set K drafts its K whatever the
model says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coordinator.drafters.costs import LookupSettings
from coordinator.loop.calibration import Calibration
from coordinator.loop.costs import Costs

AMORTISE_STEPS = 4.0  # a cold draft session's catch-up, as steps of drafting it pays for
PROBE_EVERY = 16  # steps between probes of the draft's cost to the target, at most
PROBE_MARGIN = 0.25  # ... only while drafting is predicted to win by less than this
SWEEPS = 2  # coordinate-ascent passes over the generations
FULL_SEARCH = 8  # up to this many generations, both ends are climbed every step
OTHER_END_EVERY = 4  # ... beyond, the other end every this many steps
# Among K whose predicted goodput is within this of the best (as a share of a
# generation's part of the step), the largest: what the model
# leaves out favours longer rounds (every round is a chunk that the API's proxy and the
# replica's threads stream, on the same cores; text whose acceptance runs in streaks
# holds long pre-drafts more often than independent draws would).
LONGER = 0.04
PROBE_REASON = "probing what drafting costs the target (a target-only step)"
PLAIN_SEEN = 2.0  # decayed target-only steps that keep the plain calibration current


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
    why_not: str = ""  # why it cannot draft this step (cap 0), for its stats


def chain(a: float, k: int, fetch: bool = False) -> tuple[float, float, float]:
    """(expected tokens per step beyond the one every step gives, expected drafts
    verified per step, the probability that a step's pre-draft misses) of a generation
    drafting k with acceptance a (module notes). `fetch`: a missed pre-draft is made up
    for by drafting first (coordinator.loop.engine), so every round has drafts."""
    if k <= 0:
        return 0.0, 0.0, 0.0
    a = min(max(a, 0.0), 0.99)
    hold = a ** (k + 1)
    per_round = (1 - hold) / (1 - a)
    if fetch:
        return per_round - 1, float(k), 1 - hold
    pi = a / (1 - hold + a) if a > 0 else 0.0
    return pi * (per_round - 1), pi * k, 0.0


def expected_max(a: float, b: float, spread: float) -> float:
    """E[max(X, Y)] of independent normal X, Y with means a, b and the standard deviation
    of X - Y `spread` (Clark 1961): a step waits for the later of its Verify and its
    pre-drafts, so two calls of about the same length cost more than either."""
    if spread <= 1e-9:
        return max(a, b)
    z = (a - b) / spread
    cdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return a * cdf + b * (1.0 - cdf) + spread * pdf


class _Step:
    """A step's aggregates, so that one generation's K changes in O(1)."""

    def __init__(self, planner: Planner, gens: list[Candidate], ks: list[int]):
        c = planner.costs
        self.t = c.target.coef()
        self.p = c.draft_pass.coef()
        self.f = c.draft_first.coef()
        self.o = c.overhead.coef()
        self.sv, self.sp, self.sf = c.target.scale, c.draft_pass.scale, c.draft_first.scale
        n = len(gens)
        self.cal = planner.calibration.factors(n)  # by Calibration.share
        self.gens, self.ks = gens, list(ks)
        self.prefill = sum(g.extra_target_tokens for g in gens)
        self.tokens = float(len(gens))
        self.verified = float(len(gens))
        self.fed = self.sum_k = self.fetch_s = 0.0
        self.counts = [0] * (max([*ks, 0]) + 2)
        self.drafting = 0
        self._parts: dict[tuple, tuple[float, float, float, float]] = {}
        for i, k in enumerate(ks):
            self._add(i, k, 1)

    def _part(self, i: int, k: int) -> tuple[float, float, float, float]:
        """Generation i drafting k: its extra tokens, drafts verified, tokens the draft
        feeds first, and the fetch seconds it is expected to make every step wait
        (computed once per step: the ascent asks again and again)."""
        key = (i, k, self.gens[i].acceptance)  # _explain varies the acceptance
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = self._compute_part(i, k)
        return part

    def _compute_part(self, i: int, k: int) -> tuple[float, float, float, float]:
        g = self.gens[i]
        k = min(k, g.cap)
        # Alone, a missed pre-draft is fetched (the engine's fetch_pays, in practice
        # always with one generation); with others, a miss costs its next round's drafts.
        fetch = len(self.gens) == 1 and (g.greedy or not g.fixed)
        extra, drafts, miss = chain(g.acceptance, k, fetch)
        per_step = 1 + extra
        steps_left = max(1.0, g.remaining / per_step)
        fed = 1 + g.catch_up * min(1.0, AMORTISE_STEPS / steps_left)
        fetch_s = 0.0
        if miss:
            p, f = self.p, self.f
            fetch_s = miss * (max(0.0, f[0] + f[1] * 2) + k * max(0.0, p[0] + p[1]))
        return extra, drafts, fed, fetch_s

    def _add(self, i: int, k: int, sign: int) -> None:
        if k <= 0 or not self.gens[i].drafts_with_model:
            return
        extra, drafts, fed, fetch_s = self._part(i, k)
        self.tokens += sign * extra
        self.verified += sign * drafts
        self.fed += sign * fed
        self.fetch_s += sign * fetch_s
        self.sum_k += sign * k
        self.drafting += sign
        if k >= len(self.counts):
            self.counts += [0] * (k + 1 - len(self.counts))
        self.counts[k] += sign

    def set(self, i: int, k: int) -> None:
        self._add(i, self.ks[i], -1)
        self.ks[i] = k
        self._add(i, k, 1)

    def seconds(self) -> float:
        t, p, f, o = self.t, self.p, self.f, self.o
        busy = 1.0 if self.drafting else 0.0
        v = max(0.0, t[0] + t[1] * self.verified + t[2] * self.prefill + t[3] * busy)
        rest = max(0.0, o[0] + o[1] * len(self.gens) + o[2] * self.drafting)
        if not self.drafting:
            return v + rest
        top = len(self.counts) - 1
        while not self.counts[top]:
            top -= 1
        passes = top + 1
        d = max(0.0, f[0] + f[1] * self.fed) + max(0.0, (passes - 1) * p[0]
                                                  + p[1] * self.sum_k)
        spread = (self.sv ** 2 + self.sf ** 2 + (passes - 1) * self.sp ** 2) ** 0.5
        return expected_max(v, d, spread) + rest + self.fetch_s

    def goodput(self) -> float:
        """Expected tokens per second, times what such steps (drafting or not) delivered
        of their prediction lately (Calibration)."""
        factor = self.cal[Calibration.share(self.drafting, len(self.gens))]
        return factor * self.tokens / max(self.seconds(), 1e-6)

    def best_k(self, i: int) -> int:
        """Generation i's K that maximises the step's goodput, the others' held; among
        drafting K within LONGER of the generation's share of the best, the one it has
        (a pre-draft is sized by the last step's K: changing it costs a step's fit), else
        the largest."""
        was = self.ks[i]
        goodputs = []
        for k in range(self.gens[i].cap + 1):
            self.set(i, k)
            goodputs.append(self.goodput())
        top = max(goodputs)
        best = 0
        if top > goodputs[0]:
            slack = LONGER * top / len(self.gens)
            near = [k for k, g in enumerate(goodputs) if k and g >= top - slack]
            best = was if was in near else max(near)
        self.set(i, best)
        return best


class Planner:
    def __init__(self, default_k: int, k_max: int, adaptive: bool = True):
        self.default_k, self.k_max = default_k, k_max
        self.adaptive = adaptive  # False: every generation drafts its cap
        self.costs = Costs()
        self.last_k = 0  # the step's largest K (metrics, tests)
        self.reasons: list[str] = []  # per generation of the last plan: why K is 0 ("")
        self.probe = False  # the last plan was a probe
        # A verified draft costs the target more than the look-up's cost model assumes
        # (coordinator.drafters.costs.LookupSettings.verify_cost, in one-token rounds).
        self.target_loaded = False
        self.steps = 0
        self._previous: dict[int, int] = {}  # id(candidate source) -> last K
        # The last plan's predicted step seconds and tokens, whether it drafted, and for
        # how many generations.
        self.predicted: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
        self.calibration = Calibration()

    def plan(self, gens: list[Candidate], keys: list | None = None) -> list[int]:
        """K for each generation this step (`keys`: stable ids of the generations, so
        that each starts from its last K)."""
        self.steps += 1
        self.probe = False
        self.target_loaded = bool(gens) and self.costs.target.ready and \
            self._loaded(len(gens))
        self.reasons = [g.why_not if g.cap <= 0 else "" for g in gens]
        default = [g.cap if g.fixed else min(g.cap, self.default_k) for g in gens]
        variable = [i for i, g in enumerate(gens)
                    if g.drafts_with_model and g.cap > 0 and not g.fixed]
        if not self.adaptive or not gens or not self.costs.ready or not variable:
            self.last_k = max(default, default=0)
            self._predict(gens, default)
            return default
        keys = keys if keys is not None else list(range(len(gens)))
        start = list(default)
        for i in variable:
            start[i] = min(self._previous.get(keys[i], 0), gens[i].cap)
        # Coordinate ascent stops at local optima, one at each end: when all draft, one
        # generation leaving saves little (the draft's cost to the target stays while any
        # drafts); when none does, the first to draft pays that cost alone. So the step
        # with none drafting is always in the running (one evaluation), and the ascent
        # also climbs from the other end (none drafting if some did, else all at the
        # default K): every step up to FULL_SEARCH generations, beyond every
        # OTHER_END_EVERY steps (the climb's cost grows with the generations). The best
        # step wins.
        starts = [start]
        if len(variable) <= FULL_SEARCH or self.steps % OTHER_END_EVERY == 0:
            other = list(start)
            drafted = any(start[i] for i in variable)
            for i in variable:
                other[i] = 0 if drafted else default[i]
            starts.append(other)
        steps = [self._ascend(gens, s, variable) for s in starts]
        steps.append(_Step(self, gens, [0 if i in variable else k
                                        for i, k in enumerate(default)]))
        step = max(steps, key=_Step.goodput)
        ks = step.ks
        if self._probe_due(step, variable):
            ks = [0 if i in variable else k for i, k in enumerate(ks)]
            self.probe = True
            for i in variable:
                self.reasons[i] = PROBE_REASON
        else:
            idle = [i for i in variable if ks[i] == 0]
            if idle:
                self._explain(step, idle)
        self._previous = {keys[i]: ks[i] for i in variable}
        self.last_k = max(ks, default=0)
        self._predict(gens, ks)
        return ks

    def _ascend(self, gens: list[Candidate], start: list[int], variable: list[int]) -> _Step:
        """Coordinate ascent from `start` over the variable generations, the most
        accepted first."""
        step = _Step(self, gens, start)
        order = sorted(variable, key=lambda i: -gens[i].acceptance)
        for _ in range(SWEEPS):
            before = list(step.ks)
            for i in order:
                step.best_k(i)
            if step.ks == before:
                break
        return step

    def _predict(self, gens: list[Candidate], ks: list[int]) -> None:
        """What the model expects of the step as planned (uncalibrated)."""
        if not gens or not self.costs.ready:
            self.predicted = (0.0, 0.0, 0, 0)
            return
        step = _Step(self, gens, ks)
        self.predicted = (step.seconds(), step.tokens, step.drafting, len(gens))

    def observe(self, tokens: int, seconds: float) -> None:
        """The planned step committed `tokens` in `seconds` (Calibration)."""
        predicted_s, predicted_tokens, drafting, n = self.predicted
        self.calibration.observe(n, drafting, tokens, predicted_tokens, seconds, predicted_s)

    def _loaded(self, generations: int) -> bool:
        """Whether one more verified token costs more than LookupSettings.verify_cost of a
        generation's share of a target-only step."""
        t = self.costs.target.coef()
        share = (t[0] + t[1] * generations) / generations
        return share <= 0 or t[1] / share > LookupSettings.verify_cost

    def _probe_due(self, step: _Step, variable: list[int]) -> bool:
        """A probe step, PROBE_EVERY steps since the last, when no request that set K
        drafts anyway (the step would not be target-only) and the server-K generations'
        drafting is planned on a guess: no target-only step this wide was measured, or
        drafting wins by less than PROBE_MARGIN while the draft's cost to the target, or
        what target-only steps deliver of their prediction (Calibration), was not seen
        lately."""
        if self.steps % PROBE_EVERY:
            return False
        blind = not self.costs.seen_width(len(step.gens))  # a target-only step's width
        seen = self.costs.busy_known and \
            self.calibration.seen(len(step.gens), Calibration.NONE) >= PLAIN_SEEN
        if seen and not blind:
            return False
        if any(step.ks[i] > 0 and g.fixed and g.drafts_with_model
               for i, g in enumerate(step.gens)):
            return False
        drafting = step.goodput()
        if not any(step.ks[i] for i in variable):
            return False
        if blind:
            return True
        saved = list(step.ks)
        for i in variable:
            step.set(i, 0)
        plain = step.goodput()
        for i in variable:
            step.set(i, saved[i])
        return drafting < (1 + PROBE_MARGIN) * plain

    def _explain(self, step: _Step, idle: list[int]) -> None:
        """Why the idle generations draft nothing: the acceptance at which one of them
        (the most accepted) would start paying, by bisection; shared by the others."""
        i = max(idle, key=lambda j: step.gens[j].acceptance)
        g = step.gens[i]
        lo, hi = 0.0, 0.99
        original = g.acceptance
        for _ in range(10):
            mid = (lo + hi) / 2
            step.set(i, 0)  # its part leaves the aggregates under the acceptance it had
            g.acceptance = mid
            if step.best_k(i) > 0:
                hi = mid
            else:
                lo = mid
        step.set(i, 0)
        g.acceptance = original
        even = hi
        for j in idle:
            a = step.gens[j].acceptance
            self.reasons[j] = (f"acceptance {a:.2f} below break-even {even:.2f}" if a < even
                               else f"acceptance {a:.2f}, but the draft's catch-up does not "
                                    f"pay for the {step.gens[j].remaining} tokens left")

    def fetch_pays(self, gens: list[Candidate], ks: list[int], missing: list[int]) -> bool:
        """Whether this step should draft first for the generations in `missing` (their
        pre-draft missed), so that their rounds have drafts, rather than verify them
        without: every generation then waits for the draft. Judged on this step's
        expected tokens per second. Before the costs are measured: only when nobody has
        drafts at hand and no draft session is cold (a prefill: the two services then
        prefill side by side instead, while the target decodes the first token alone)."""
        c = self.costs
        if not c.ready:
            return all(not g.ready for g in gens) and not any(gens[i].cold for i in missing)
        exp = []
        for i, g in enumerate(gens):
            a, k = min(g.acceptance, 0.99), ks[i]
            exp.append((1 - a ** (k + 1)) / (1 - a) if k and g.drafts_with_model else 1.0)
        ready = [i for i, g in enumerate(gens) if g.ready and ks[i]]
        base_tokens = sum(exp[i] for i in ready) + len(gens) - len(ready)
        target = len(gens) + sum(ks[i] for i in ready)
        prefill = sum(g.extra_target_tokens for g in gens)
        drafting_n = len(ready) + len(missing)
        drafting = c.draft_s(max(ks) + 1, drafting_n, 2 * drafting_n)
        o = c.overhead_s(len(gens), drafting_n)
        without = base_tokens / (max(c.verify_s(target, prefill, True), drafting) + o)
        first = c.draft_s(max(ks[i] for i in missing) + 1, len(missing),
                          sum(gens[i].catch_up for i in missing))
        more = sum(exp[i] - 1 for i in missing)
        extra = sum(ks[i] for i in missing)
        with_ = (base_tokens + more) / (
            first + max(c.verify_s(target + extra, prefill, True), drafting) + o)
        return with_ > without

    def describe(self) -> str:
        return (f"{self.costs.summary()}; delivered/predicted at "
                f"{self.predicted[3]} generations: "
                f"{self.calibration.describe(self.predicted[3])}")
