"""K per generation, every step, from a model of what a step costs and what each
generation's drafts are worth.

A step's expected time and tokens come from coordinator.loop.step_model.

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

from coordinator.drafters.costs import LookupSettings
from coordinator.loop.calibration import Calibration
from coordinator.loop.costs import Costs
from coordinator.loop.step_model import FETCH_DRAFTS, Candidate, StepModel, round_tokens

PROBE_EVERY = 16  # steps between probes of the draft's cost to the target, at most
PROBE_MARGIN = 0.25  # ... only while drafting is predicted to win by less than this
SWEEPS = 2  # coordinate-ascent passes over the generations
FULL_SEARCH = 8  # up to this many generations, both ends are climbed every step
OTHER_END_EVERY = 4  # ... beyond, the other end every this many steps
PROBE_REASON = "probing what drafting costs the target (a target-only step)"
PLAIN_SEEN = 2.0  # decayed target-only steps that keep the plain calibration current


class Planner:
    def __init__(self, default_k: int, k_max: int, adaptive: bool = True,
                 fetch_drafts: int = FETCH_DRAFTS):
        self.default_k, self.k_max = default_k, k_max
        self.fetch_drafts = fetch_drafts  # drafts fetched after a miss, at most K
        self.fetch_now = fetch_drafts  # ... this step (_choose_fetch)
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
            self._choose_fetch(gens, default)
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
        steps.append(StepModel(self, gens, [0 if i in variable else k
                                        for i, k in enumerate(default)]))
        step = max(steps, key=StepModel.goodput)
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
        self._choose_fetch(gens, ks)
        return ks

    def _choose_fetch(self, gens: list[Candidate], ks: list[int]) -> None:
        """The drafts a lone generation fetches after a miss this step: fetch_drafts or
        its whole K, whichever the step's model gives the more tokens per second in the
        long run (a short fetch waits less and its round's pre-draft holds more often,
        a^(f+1); a whole K verifies more in the round). Fetching 1 wins where the draft's
        passes are dear (the Qwen2.5-Coder pair), K where a call costs more than its
        passes (the tiny models)."""
        self.fetch_now = self.fetch_drafts
        if len(gens) != 1 or not ks[0] or not gens[0].drafts_with_model \
                or not self.costs.ready:
            return
        sizes = sorted({min(self.fetch_drafts, ks[0]), ks[0]})
        if len(sizes) > 1:
            self.fetch_now = max(sizes, key=lambda f: StepModel(self, gens, ks, f).goodput())

    def _ascend(self, gens: list[Candidate], start: list[int], variable: list[int]) -> StepModel:
        """Coordinate ascent from `start` over the variable generations, the most
        accepted first."""
        step = StepModel(self, gens, start)
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
        step = StepModel(self, gens, ks)
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

    def _probe_due(self, step: StepModel, variable: list[int]) -> bool:
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

    def _explain(self, step: StepModel, idle: list[int]) -> None:
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

    def fetch_size(self, gens: list[Candidate], ks: list[int], missing: list[int]) -> int:
        """How many drafts (at most each one's K) this step should draft first for the
        generations in `missing` (their pre-draft missed), so that their rounds have
        drafts, rather than verify them without: every generation then waits for the
        draft. 0: none. The size is this step's choice (`_choose_fetch`) if fetching it
        pays this step (judged on the step's expected tokens per second), else the whole
        K if that pays: where pre-drafts keep missing (a grammar's forced tokens are not
        in their assumption), a fetch is a round's only way to drafts. Before the costs
        are measured: fetch_drafts, only when nobody has drafts at hand and no draft
        session is cold (a prefill: the two services then prefill side by side instead,
        while the target decodes the first token alone)."""
        c = self.costs
        if not c.ready:
            fetch = all(not g.ready for g in gens) and not any(gens[i].cold for i in missing)
            return self.fetch_drafts if fetch else 0
        ready = {i for i, g in enumerate(gens) if g.ready and ks[i]}
        base_tokens = sum(round_tokens(g.acceptance, ks[i]) if i in ready else 1.0
                          for i, g in enumerate(gens))
        target = len(gens) + sum(ks[i] for i in ready)
        prefill = sum(g.extra_target_tokens for g in gens)
        drafting_n = len(ready) + len(missing)
        drafting = c.draft_s(max(ks) + 1, drafting_n, 2 * drafting_n)
        o = c.overhead_s(len(gens), drafting_n)
        without = base_tokens / (max(c.verify_s(target, prefill, True), drafting) + o)
        for size in dict.fromkeys((self.fetch_now, max(ks))):  # the step's size first
            fetched = [min(ks[i], size) for i in missing]
            first = c.draft_s(max(fetched) + 1, len(missing),
                              sum(gens[i].catch_up for i in missing))
            more = sum(round_tokens(gens[i].acceptance, f) - 1
                       for i, f in zip(missing, fetched, strict=True))
            with_ = (base_tokens + more) / (
                first + max(c.verify_s(target + sum(fetched), prefill, True), drafting) + o)
            if with_ > without:
                return size
        return 0

    def describe(self) -> str:
        return (f"{self.costs.summary()}; delivered/predicted at "
                f"{self.predicted[3]} generations: "
                f"{self.calibration.describe(self.predicted[3])}")

