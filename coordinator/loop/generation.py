"""One generation in the lockstep engine: its committed ids, random streams, links to
both services, drafter, record and output queue; and its part of each step.

`start` begins a round (propose: the drafter's drafts at hand, and its request for the
next round's), `decide` applies the target's verdict (accept / resample, commit, stream)
and `observe` tells the drafter how it went. Everything a round needs of the
generation is here; the engine only orders the steps and batches the calls.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

import torch

from coordinator.drafters.base import MODEL, NO_DRAFTS, Outcome
from coordinator.loop.acceptance import Acceptance, Priors, kind_of
from coordinator.loop.round import Round, RoundOutput, trim
from coordinator.loop.step_model import Candidate
from coordinator.record import LoopStats, Recorder, RoundResult
from coordinator.remote.clients import WireBytes
from coordinator.remote.link import DraftLink, TargetLink
from coordinator.remote.routing import Pins
from specdec.digest import TokenPrefix
from specdec.errors import SpecdecError, Unavailable
from specdec.sampling import SamplingParams, derive_seed, generator
from specdec.verify import Decision, TokenKind, decide

log = logging.getLogger(__name__)

PREFILL_CHUNK = 512  # prompt tokens a target prefill feeds per step at most


@dataclass
class Shared:
    """What every generation of one engine shares."""

    draft: object  # coordinator.remote.routing.Router | None
    target: object  # coordinator.remote.routing.Router
    policy: object  # coordinator.loop.policy.LoopPolicy
    metrics: object  # specdec.metrics.LoopMetrics
    make_drafter: object  # (Generation) -> Drafter | None
    draft_backoff_s: float = 1.0
    k_max: int = 0
    # Every generation's model drafts, per kind of request: the prior of a new
    # generation's acceptance (coordinator.loop.acceptance).
    priors: Priors = field(default_factory=Priors)


class Generation:
    def __init__(self, shared: Shared, prompt: list[int], max_new_tokens: int,
                 sampling: SamplingParams, k: int, eos_token_ids=(),
                 stats: LoopStats | None = None, speculative: bool = True,
                 tenant: str | None = None, fixed_k: bool = True,
                 logprobs: int | None = None, prompt_logprobs: bool = False,
                 prediction=(), guide=None):
        self.prompt_len = len(prompt)
        # Both services learn where the prompt ends with the sampling parameters (the
        # presence and frequency penalties count only what follows it).
        self.shared, self.sampling = shared, replace(sampling, prompt_len=len(prompt))
        self.committed = TokenPrefix(prompt)
        self.logprobs = logprobs  # the raw model's log-probabilities, with this many top
        # The prompt's, by position (1..len - 1), until every one is in.
        self.prompt_scores: dict[int, object] | None = {} if prompt_logprobs else None
        self.prediction = list(prediction)  # Predicted Outputs' token ids (the drafter's)
        # The coordinator's own matcher of sampling.grammar (specdec.grammar.GrammarState),
        # or None: jump-forward, and look-up drafts cut where the grammar refuses them.
        self.guide = guide
        self.max_new_tokens, self.eos = max_new_tokens, set(eos_token_ids)
        self.k, self.tenant = k, tenant
        self.fixed_k = fixed_k  # K is the request's (else the planner's, at most k)
        self.generated = 0
        self.round_index = 0
        self.session_id = uuid.uuid4().hex
        self.uniforms = generator(sampling.seed, "uniforms")
        self.record = Recorder(stats if stats is not None else LoopStats(), shared.metrics,
                               k)
        self.record.stats.prediction_tokens = len(self.prediction)
        self.meter = WireBytes()
        self.pins = Pins()
        self.target = TargetLink(shared.target, self.pins, self.session_id, self.record,
                                 self.meter)
        if not self.target.pin():
            raise Unavailable("no target replica is reachable; retry later")
        self.draft = DraftLink(shared.draft, self.pins, self.session_id, self.record,
                               self.meter, shared.draft_backoff_s) \
            if shared.draft is not None and speculative and k > 0 else None
        self.lookup = None  # the drafter's look-up, if it has one (set by make_drafter)
        self.drafter = shared.make_drafter(self) if speculative and k > 0 else None
        self.prior = shared.priors.of(MODEL, kind_of(self.sampling))
        self.acceptance = Acceptance(prior=self.prior.rate)
        self.reason = ""  # why this step's K is 0 (the planner's, or the generation's)
        self.outputs: queue.SimpleQueue = queue.SimpleQueue()
        self.cancelled = threading.Event()  # the consumer went away
        self.closed = threading.Event()  # the engine let it go (sessions released)
        self.done = False
        self.started = time.perf_counter()

    # -- the planner's view ------------------------------------------------------------

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.generated

    def candidate(self) -> Candidate:
        """How the planner sees this generation."""
        model = self.draft is not None and self.draft.ready()
        fed = len(self.committed) - self.draft.view.plan(self.committed)[0] if model else 0
        target_new = len(self.committed) - self.target.view.plan(self.committed)[0]
        # A client's prediction drafts whatever the load: its drafts cost the draft
        # service nothing, and K only caps them (as a look-up's).
        predicted = bool(self.prediction)
        cap = max(0, min(self.k, self.remaining - 1)) if self.drafter is not None else 0
        return Candidate(self.acceptance.rate, cap, model and not predicted, self.fixed_k,
                         fed, self.remaining, min(target_new, PREFILL_CHUNK) - 1,
                         self.drafter is not None and self.drafter.has_drafts,
                         model and not self.draft.view.tokens, self.sampling.greedy,
                         self._why_not(cap))

    def _why_not(self, cap: int) -> str:
        """Why this generation cannot draft this step ("" when it can)."""
        if cap > 0:
            return ""
        if self.drafter is None:
            return "the request asked for target-only decoding (num_draft_tokens 0)" \
                if self.k == 0 else "no drafter (no draft service, no look-up)"
        if self.remaining <= 1:
            return "one token left: nothing to draft for"
        return "no drafts asked for"

    # -- a round -----------------------------------------------------------------------

    def start(self, k: int, pipelined: bool, target_loaded: bool = False) -> Round:
        """Propose: the drafts at hand (at most k), and the request for the next round's.
        `target_loaded`: the planner's word that a verified draft is dear (it caps the
        look-up at k)."""
        if self.lookup is not None:
            self.lookup.target_loaded = target_loaded
        self.round_index += 1
        self.target.leave_if_gone()
        keep, _, new = self.target.view.plan(self.committed)
        if len(new) > PREFILL_CHUNK:  # a long prompt: feed it over several steps
            part = TokenPrefix(self.committed.tokens[:keep + PREFILL_CHUNK])
            r = Round(self, 0, NO_DRAFTS, self.round_index, [], partial=True,
                      sent=part.tokens)
            r.plan_request()
            self.round_index -= 1  # not a round of the generation
            return r
        self.record.planned(k, self.reason)
        drafts = self.drafter.propose(self.committed.tokens, k) \
            if self.drafter is not None else NO_DRAFTS
        drafts = trim(drafts, self.remaining - 1)
        if self.guide is not None and drafts and drafts.source != MODEL:
            # a look-up's (or a prediction's) drafts past what the grammar allows would
            # be rejected for certain; the model's are masked by the draft already
            drafts = self._grammatical(drafts)
        # No drafts, no draws (nothing to advance in the stream). A torch call lets go of
        # the GIL, and under load the engine thread then waits for the stream threads
        # to hand it back: a K=0 round makes none.
        u = torch.rand(len(drafts), generator=self.uniforms,
                       dtype=torch.float64).tolist() if drafts else []
        r = Round(self, k, drafts, self.round_index, u,
                  sent=self.committed.tokens + list(drafts.tokens))
        r.plan_request()
        after = self.remaining - len(drafts) - 2  # left if all are accepted, less one
        if pipelined and self.drafter is not None and min(k, after) > 0:
            r.predraft = self.drafter.prepare(
                self.committed.tokens, drafts, min(k, after),
                (self.bonus_seed(r.index), self.bonus_seed(r.index + 1)))
            if r.predraft is not None:
                self.record.predraft_started()
        return r

    # -- log-probabilities ---------------------------------------------------------------

    def scoring_prompt(self, keep_len: int) -> bool:
        """Whether a Verify that keeps keep_len positions asks for the prompt's
        log-probabilities: some prompt position after keep_len has none yet."""
        if self.prompt_scores is None:
            return False
        return any(i not in self.prompt_scores
                   for i in range(max(1, keep_len + 1), self.prompt_len))

    def scored_prompt(self, keep_len: int, entries: list | None) -> None:
        """A Verify's prompt log-probabilities: entry t is position keep_len + 1 + t."""
        for t, entry in enumerate(entries or ()):
            if keep_len + 1 + t < self.prompt_len:
                self.prompt_scores[keep_len + 1 + t] = entry

    def _logprobs(self, r: Round, tokens: list[int]) -> list | None:
        """Each emitted token's entry: the verdict's row i holds the i-th token of the
        decision (an accepted x_i, the recovered token, or the bonus at row K)."""
        rows = r.verdict.logprobs
        if rows is None:
            return None
        return [rows[i].of(t) for i, t in enumerate(tokens)]

    def decide(self, r: Round) -> None:
        """Accept / resample against the verdict, commit and stream the tokens."""
        if r.partial:
            return
        drafts, v = r.drafts, r.verdict
        if not drafts:
            r.decision = Decision([v.bonus_token], [TokenKind.TARGET], 0)
        else:
            r.decision = decide(drafts.tokens, drafts.probs, v, r.u)
            if drafts.guess is not None and r.predraft is not None:
                self.record.outcome(r.decision.num_accepted < len(drafts),
                                    r.decision.tokens[-1] != drafts.guess)
        remaining = self.remaining
        tokens, kinds = r.decision.tokens[:remaining], r.decision.kinds[:remaining]
        stop = next((i for i, t in enumerate(tokens) if t in self.eos), None)
        if stop is None and self.guide is not None and self.logprobs is None \
                and len(tokens) < remaining:
            # jump-forward: what the grammar forces next needs no pass (no log-probability
            # either, so not when they are asked for)
            forced = self._forced(tokens, remaining - len(tokens))
            tokens, kinds = tokens + forced, kinds + [TokenKind.TARGET] * len(forced)
            self.record.stats.forced_tokens += len(forced)
            stop = next((i for i, t in enumerate(tokens) if t in self.eos), None)
        if stop is not None:
            tokens, kinds = tokens[:stop + 1], kinds[:stop + 1]
        self.committed.extend(tokens)
        self.generated += len(tokens)
        self.record.committed(len(tokens))
        reason = "eos" if stop is not None else (
            "length" if self.generated >= self.max_new_tokens else None)
        self.done = reason is not None
        self.record.stats.seconds = time.perf_counter() - self.started
        logprobs = self._logprobs(r, tokens)
        prompt = None
        if self.prompt_scores is not None:  # all in by the first decided round
            prompt = [self.prompt_scores[i] for i in range(1, self.prompt_len)]
            self.prompt_scores = None
        r.output = RoundOutput(tokens, kinds, reason, logprobs, prompt)

    def _grammatical(self, drafts):
        """The drafts up to the first the grammar refuses (that one is no guess to
        pre-draft on either)."""
        try:
            if self.guide.sync(self.committed.tokens, strict=False):
                valid = self.guide.valid_prefix(drafts.tokens)
                if valid < len(drafts):
                    return replace(trim(drafts, valid), guess=None)
        except SpecdecError as e:  # its own error state: go on without it
            log.warning("generation %s: the coordinator's matcher is off (%s)",
                        self.session_id, e)
            self.guide = None
        return drafts

    def _forced(self, tokens: list[int], limit: int) -> list[int]:
        """The tokens the grammar forces after the committed text and `tokens` (none when
        the coordinator's matcher cannot follow: the services enforce the grammar)."""
        try:
            if self.guide.sync(self.committed.tokens + tokens, strict=False):
                return self.guide.forced(limit)
        except SpecdecError as e:  # its own error state: go on without jump-forward
            log.warning("generation %s: the coordinator's matcher is off (%s)",
                        self.session_id, e)
            self.guide = None
        return []

    def observe(self, r: Round) -> None:
        """Tell the drafter how the round went (and give it its reply)."""
        if r.partial:
            return
        v, drafts = r.verdict, r.drafts
        self.record.round(RoundResult(r.decision, len(drafts), r.seconds, None, 0,
                                      drafts.exited_early,
                                      (v.pass_sessions, v.pass_tokens, v.pass_seconds),
                                      drafts.step_seconds,
                                      source=drafts.source if drafts else MODEL), r.seconds)
        if self.drafter is None:
            return
        accepted = r.decision.num_accepted
        if r.drafts.source == MODEL and r.drafts:
            self.acceptance.observe(accepted, len(r.drafts))
            self.prior.observe(accepted, len(r.drafts))
        self.drafter.observe(Outcome(self.committed.tokens, r.drafts, accepted, r.reply))

    def bonus_seed(self, index: int) -> int | None:
        """Sampled rounds: the seed of round `index`'s coupled bonus (specdec.coupling),
        with which the draft draws its guess at it. None when greedy or off."""
        if self.sampling.greedy or not self.shared.policy.couple_bonus:
            return None
        return derive_seed(self.sampling.seed, "bonus", index)

    def finalize(self) -> None:
        """The generation is over and the engine has let it go: its drafter learns so,
        its sessions are released and its record closed (in the consumer's thread)."""
        if self.drafter is not None:
            self.drafter.finished()
        self.pins.release_all(self.session_id)
        self.record.finished(time.perf_counter() - self.started, self.meter.sent,
                             self.meter.received)
