"""The lockstep engine: every live generation of a coordinator replica, one step at a time.

One thread runs steps. Each step takes every live generation through one round:

  propose   each generation's drafter hands over its drafts (pre-drafted during the last
            step's Verify, or a look-up's) and asks for the next round's;
  verify    one VerifyBatch per target replica holds every generation's round (one
            forward pass), while one ProposeBatch per draft replica drafts the next
            round for all of them (one pass per drafted position);
  decide    accept / resample per generation (specdec.verify), commit, stream;
  observe   drafters learn the outcome and take their replies; costs are measured.

Generations join and leave between steps: continuous batching at the coordinator, as
vLLM's scheduler does inside one process (Kwon et al. 2023). A long prompt is prefilled
in chunks over several steps, so it does not stall the others' tokens. K comes from the
planner (coordinator.loop.plan), per step and per generation.

Isolation: a generation whose round fails (a refused request, no target left) fails
alone; one whose consumer went away is dropped at the next step; a draft that fails or
hangs costs its generations their drafts for a while, never their output. Every
decision depends on tokens and seeds, never on which replica answered or when, so
greedy output is the target's alone, token for token, at any concurrency.
"""

from __future__ import annotations

import logging
import threading
import time

from coordinator.loop import calls
from coordinator.loop.generation import Generation
from coordinator.loop.plan import Planner
from coordinator.loop.round import Round

log = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0
# A pre-draft batch may take this many times the step's Verify (at least MIN_DRAFT_WAIT_S)
# before its generations give up on it for this step.
DRAFT_WAIT_FACTOR = 4.0
MIN_DRAFT_WAIT_S = 1.0
METRICS_EVERY = 16  # steps between updates of the fitted costs' gauges
SUMMARY_S = 10.0  # seconds between the steps' summaries in the log (INFO)


class Engine:
    def __init__(self, planner: Planner, pipelined: bool = True, name: str = "lockstep",
                 metrics=None):
        self.planner, self.pipelined = planner, pipelined
        self.metrics = metrics  # () -> specdec.metrics.LoopMetrics (the fitted costs)
        self._summary = Summary()
        self._joining: list[Generation] = []
        self._live: list[Generation] = []
        self._cond = threading.Condition()
        self._closed = False
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- callers (any thread) -------------------------------------------------------------

    def join(self, gen: Generation) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._joining.append(gen)
            self._cond.notify_all()

    def leave(self, gen: Generation) -> None:
        """The consumer went away: drop `gen` at the next step, and wait until the engine
        has let it go (a step at most)."""
        gen.cancelled.set()
        with self._cond:
            self._cond.notify_all()
        gen.closed.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # -- the engine thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._joining and not self._live and not self._closed:
                    self._cond.wait(IDLE_WAIT_S)
                if self._closed:
                    gens = self._joining + self._live
                    self._joining, self._live = [], []
                else:
                    self._live += self._joining
                    self._joining = []
                    gens = None
            if gens is not None:
                for gen in gens:
                    self._end(gen, RuntimeError("the coordinator is shutting down"))
                return
            for gen in [g for g in self._live if g.cancelled.is_set()]:
                self._end(gen)
            if not self._live:
                continue
            try:
                self.step(list(self._live))
            except Exception as exc:  # noqa: BLE001 - a bug must not kill the replica
                log.exception("a lockstep step failed; its generations fail with it")
                for gen in list(self._live):
                    self._end(gen, exc)

    def step(self, gens: list[Generation]) -> None:
        """One round of every generation: propose, verify, decide, observe."""
        started = time.perf_counter()
        candidates = [g.candidate() for g in gens]
        ks = self.planner.plan(candidates, [g.session_id for g in gens])
        for g, reason in zip(gens, self.planner.reasons, strict=True):
            g.reason = reason
        fetch_s = self._fetch(gens, candidates, ks)  # drafts the Verify must wait for
        loaded = self.planner.target_loaded
        rounds = [g.start(k, self.pipelined, loaded) for g, k in zip(gens, ks, strict=True)]
        sent = calls.send_predrafts([r for r in rounds if r.predraft is not None])
        verify_s = calls.verify(rounds)
        for r in rounds:
            self._settle(r, r.gen.decide)
        draft_s = calls.collect(sent, max(MIN_DRAFT_WAIT_S, DRAFT_WAIT_FACTOR * verify_s))
        wall = time.perf_counter() - started
        for r in rounds:
            r.seconds = wall
            self._settle(r, r.gen.observe)
        self._measure(rounds, wall, verify_s, draft_s, fetch_s, busy=bool(sent))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("step %d: %d gens, a %s, K %s, drafts %s, wall %.1f ms, verify %.1f "
                      "ms, draft %.1f ms, fetch %.1f ms%s, costs %s", self.steps, len(gens),
                      [round(c.acceptance, 2) for c in candidates], ks,
                      [len(r.drafts) for r in rounds], wall * 1e3, verify_s * 1e3,
                      draft_s * 1e3, fetch_s * 1e3, " (probe)" if self.planner.probe else "",
                      self.planner.describe())
        for r in rounds:
            self._publish(r)
        self.steps += 1
        if self.metrics is not None and self.steps % METRICS_EVERY == 0:
            self.metrics().costs(self.planner.costs.describe())
        committed = sum(len(r.output.tokens) for r in rounds if r.output is not None)
        if not any(r.partial for r in rounds):  # a prefill chunk's step is no round's
            self.planner.observe(committed, wall)
        self._summary.add(len(gens), ks, committed, wall, self.planner.predicted[0])
        if self._summary.due():
            log.info("%s; costs: %s", self._summary.take(), self.planner.describe())

    def _fetch(self, gens: list[Generation], candidates: list, ks: list[int]) -> float:
        """Draft what this step's Verify must wait for: every round's drafts when
        sequential, else those of the rounds whose pre-draft missed (`_to_fetch`), as
        many as the planner's fetch_size (its round's pre-draft is still sized K).
        Returns the seconds it took."""
        if self.pipelined:
            chosen, size = self._to_fetch(candidates, ks)
        else:
            chosen, size = range(len(gens)), max(ks, default=0)
        if not chosen:
            return 0.0
        seconds, answers = calls.fetch([gens[i] for i in chosen],
                                       [min(ks[i], size) for i in chosen],
                                       guess=self.pipelined)
        if answers:
            measure_drafting(self.planner.costs, answers, seconds)
        return seconds

    def _to_fetch(self, candidates: list, ks: list[int]) -> tuple[list[int], int]:
        """The generations to draft for before this step's Verify, pipelined, and how
        many drafts each (at most its K): those whose pre-draft missed (none at hand)
        and whose draft session is warm (a cold one prefills beside the target's prefill
        instead, its first token standing for the target's), when the planner judges it
        pays (Planner.fetch_size). A sampled request that set K never waits (its round
        after a miss has no model drafts while the next pre-draft starts from the
        corrected ids), so that its rounds, and a seeded text, do not depend on timing;
        a greedy one may, its output being the target's whatever the drafts."""
        missing = [i for i, c in enumerate(candidates) if ks[i] and c.drafts_with_model
                   and not c.ready and not c.cold and (c.greedy or not c.fixed)]
        size = self.planner.fetch_size(candidates, ks, missing) if missing else 0
        return (missing, size) if size else ([], 0)

    def _settle(self, r: Round, part) -> None:
        """Run one generation's part of the step; its own failure ends it alone."""
        if r.error is None:
            try:
                part(r)
            except Exception as exc:  # noqa: BLE001 - isolate the generation
                log.exception("generation %s failed", r.gen.session_id)
                r.error = exc

    def _publish(self, r: Round) -> None:
        """Stream the round's tokens; a generation that ended (or failed) is let go."""
        gen = r.gen
        if r.error is not None:
            self._end(gen, r.error)
        elif gen.done:
            self._end(gen, final=r.output)
        elif r.output is not None:
            gen.outputs.put(r.output)

    def _measure(self, rounds: list[Round], wall: float, verify_s: float,
                 draft_s: float, fetch_s: float, busy: bool) -> None:
        """Teach the planner what this step's calls cost (one replica of each service:
        the calls' wall times against what they carried; `busy`: the draft computed
        beside the Verify)."""
        costs = self.planner.costs
        verified = [r for r in rounds if r.verdict is not None]
        tokens = sum(min(len(r.request.new_tokens), len(r.drafts) + 1) for r in verified)
        prefill = sum(len(r.request.new_tokens) for r in verified) - tokens
        if verified and verify_s > 0:
            costs.verified(tokens, prefill, busy, verify_s)
        asked = [r for r in rounds if r.predraft is not None]
        if asked and draft_s > 0:
            measure_drafting(costs, [(r.predraft.request, r.reply) for r in asked], draft_s)
        costs.step(len(rounds), len(asked), wall, fetch_s + max(verify_s, draft_s))

    def _end(self, gen: Generation, error: BaseException | None = None, final=None) -> None:
        """Let `gen` go: the engine no longer touches it, and its consumer gets the last
        output (or the error). The consumer's thread then releases its sessions
        (Generation.finalize), so that the releases cost the steps nothing."""
        if gen in self._live:
            self._live.remove(gen)
        if gen.closed.is_set():
            return
        if error is not None:
            gen.outputs.put(error)
        elif final is not None:
            gen.outputs.put(final)
        gen.closed.set()


class Summary:
    """What the steps did since the last log line (every SUMMARY_S while busy): steps,
    generations, K, tokens per second, and the step time the planner predicted against
    the one measured."""

    def __init__(self):
        self.started = time.monotonic()
        self.steps = self.gens = self.k = self.drafting = self.tokens = 0
        self.wall = self.predicted = 0.0

    def add(self, gens: int, ks: list[int], tokens: int, wall: float,
            predicted: float) -> None:
        self.steps += 1
        self.gens += gens
        self.k += sum(ks)
        self.drafting += sum(1 for k in ks if k)
        self.tokens += tokens
        self.wall += wall
        self.predicted += predicted

    def due(self) -> bool:
        return time.monotonic() - self.started >= SUMMARY_S and self.steps > 0

    def take(self) -> str:
        n = max(1, self.steps)
        text = (f"{self.steps} steps of {self.gens / n:.1f} generations, "
                f"{self.drafting / max(1, self.gens):.0%} drafting, mean K "
                f"{self.k / max(1, self.gens):.2f}, {self.tokens / max(self.wall, 1e-9):.1f} "
                f"tok/s, step {self.wall / n * 1e3:.0f} ms (predicted "
                f"{self.predicted / n * 1e3:.0f} ms)")
        self.__init__()
        return text


def measure_drafting(costs, answers: list, seconds: float) -> None:
    """Teach `costs` what a ProposeBatch of these (request, reply) items cost."""
    passes = max(q.num_tokens for q, _ in answers)
    first = sum(len(q.new_tokens) for q, _ in answers)
    pass_s = max((a.step_seconds for _, a in answers if hasattr(a, "step_seconds")),
                 default=0.0)
    costs.drafted(passes, len(answers), first, seconds, pass_s)
