"""What a lockstep step is expected to cost and yield, for the planner
(coordinator.loop.plan): the generations as it sees them (`Candidate`) and a step's
model (`StepModel`).

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
pi = a / (1 - a^(K+1) + a) of its rounds have drafts, the others one token. Alone, a
generation's missed pre-draft is fetched instead: FETCH_DRAFTS drafts (at most K) are
drafted before the Verify, and that round's own pre-draft holds with a^(FETCH_DRAFTS+1)
(`chain`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coordinator.loop.calibration import Calibration

AMORTISE_STEPS = 4.0  # a cold draft session's catch-up, as steps of drafting it pays for
# Among K whose predicted goodput is within this of the best (as a share of a
# generation's part of the step), the largest: what the model
# leaves out favours longer rounds (every round is a chunk that the API's proxy and the
# replica's threads stream, on the same cores; text whose acceptance runs in streaks
# holds long pre-drafts more often than independent draws would).
LONGER = 0.04
# Drafts fetched after a missed pre-draft (at most the round's K; a lone generation
# fetches its whole K instead where the step's model says so, Planner._choose_fetch): a
# fetch makes the target wait for its passes, and its round's pre-draft is sized K
# anyway. Replayed on the Qwen2.5-Coder pair's texts and pass costs (`specdec
# replay-predraft`): fetching 1 rather than K gave chat 1.66x against 1.51x (K=2) and
# code 2.50x against 2.41x (K=3); 2 gave 1.57x and 2.48x at K=3. Measured through
# `specdec up` (`specdec bench --interactive`, one host, back to back): chat 1.17x ->
# 1.21x with the server's K (K=3: 1.21x -> 1.25x), code 2.04x -> 2.12x (K=3: 1.98x ->
# 2.12x); design section 28.
FETCH_DRAFTS = 1


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


def round_tokens(a: float, k: int) -> float:
    """The expected tokens of a round verifying k drafts at per-token acceptance a:
    (1 - a^(k+1)) / (1 - a), the drafts accepted in a row and the target's token."""
    if k <= 0:
        return 1.0
    a = min(max(a, 0.0), 0.99)
    return (1 - a ** (k + 1)) / (1 - a)


def chain(a: float, k: int, fetch: bool = False,
          fetched: int | None = None) -> tuple[float, float, float]:
    """(expected tokens per step beyond the one every step gives, expected drafts
    verified per step, the probability that a step's pre-draft misses) of a generation
    drafting k with acceptance a (module notes). `fetch`: a missed pre-draft is made up
    for by drafting `fetched` drafts first (at most k; None: k), so every round has
    drafts: k when the pre-draft held (probability a^(k+1)), else the fetched ones,
    whose round's pre-draft holds with a^(fetched+1)."""
    if k <= 0:
        return 0.0, 0.0, 0.0
    a = min(max(a, 0.0), 0.99)
    hold = a ** (k + 1)
    per_round = round_tokens(a, k)
    if fetch:
        f = k if fetched is None else max(1, min(fetched, k))
        hold_f = a ** (f + 1)
        held = hold_f / (1 - hold + hold_f)  # the rounds whose pre-draft held
        return (held * (per_round - 1) + (1 - held) * (round_tokens(a, f) - 1),
                held * k + (1 - held) * f, 1 - held)
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


class StepModel:
    """A step's aggregates, so that one generation's K changes in O(1)."""

    def __init__(self, planner, gens: list[Candidate], ks: list[int],
                 fetch_drafts: int | None = None):
        c = planner.costs
        self.t = c.target.coef()
        self.p = c.draft_pass.coef()
        self.f = c.draft_first.coef()
        self.o = c.overhead.coef()
        self.sv, self.sp, self.sf = c.target.scale, c.draft_pass.scale, c.draft_first.scale
        n = len(gens)
        self.cal = planner.calibration.factors(n)  # by Calibration.share
        # drafts fetched after a miss (None: the planner's fetch_drafts)
        self.fetch_drafts = planner.fetch_drafts if fetch_drafts is None else fetch_drafts
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
        # Alone, a missed pre-draft is fetched (the planner's fetch_size, in practice
        # always with one generation); with others, a miss costs its next round's drafts.
        fetch = len(self.gens) == 1 and (g.greedy or not g.fixed)
        f = min(k, self.fetch_drafts)
        extra, drafts, miss = chain(g.acceptance, k, fetch, f)
        per_step = 1 + extra
        steps_left = max(1.0, g.remaining / per_step)
        fed = 1 + g.catch_up * min(1.0, AMORTISE_STEPS / steps_left)
        fetch_s = 0.0
        if miss:  # the fetch's first pass feeds ~2 tokens, then one pass per draft
            fetch_s = miss * (max(0.0, self.f[0] + self.f[1] * 2)
                              + f * max(0.0, self.p[0] + self.p[1]))
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
