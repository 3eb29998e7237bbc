"""The speculative decoding loop over draft and target replicas.

A generation is rounds of Propose -> Verify -> decide (the pure math of specdec.verify)
until max_new_tokens or an end-of-sequence token. K = 0 is target-only decoding through
the same Verify call (num_draft = 0), so both paths share everything but the draft.

The parts, each with one job:
  coordinator.link      a generation's link to each service: its replica, cache view,
                        sync/resync and failover (draft: back-off; target: re-pin)
  coordinator.predraft  pipelined drafting (the next round drafted during this Verify)
  coordinator.record    every event counted once, in LoopStats and in LoopMetrics
  coordinator.adaptive  adaptive K and the confidence exit
  coordinator.hybrid    which drafter supplies a round: the draft model or the model-free
                        look-up (coordinator.lookup, coordinator.lookup_round)
  coordinator.policy    how rounds run, and the coordinator's defaults
Greedy output is the same with or without faults, pipelining or adaptive K.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from coordinator.adaptive import AdaptiveK, ConfidenceExit
from coordinator.clients import DraftClient, Proposal, TargetClient, WireBytes
from coordinator.contrastive_round import contrastive_round
from coordinator.hybrid import LOOKUP, MODEL, Drafters, LookupSettings
from coordinator.link import DraftLink, TargetLink
from coordinator.load import LoadAwareK
from coordinator.lookup import NO_LOOKUP, OutputCache
from coordinator.lookup_round import lookup_round
from coordinator.policy import DEFAULT_POLICY, LoopPolicy
from coordinator.predraft import PreDrafts
from coordinator.record import LoopStats, Recorder, RoundResult
from coordinator.routing import Pins, Router
from specdec.contrastive import ContrastiveParams
from specdec.digest import TokenPrefix
from specdec.errors import FailedPrecondition, Unavailable
from specdec.metrics import LoopMetrics
from specdec.sampling import SamplingParams, derive_seed, generator
from specdec.verify import Decision, TokenKind, decide

__all__ = ["LoopResult", "LoopStats", "RoundOutput", "SpeculativeLoop"]


@dataclass
class LoopResult:
    token_ids: list[int]
    kinds: list[TokenKind]
    finish_reason: str  # "length" | "eos"
    stats: LoopStats


@dataclass
class RoundOutput:
    tokens: list[int]
    kinds: list[TokenKind]
    finish_reason: str | None  # set on the last round


class SpeculativeLoop:
    def __init__(self, draft: Router | DraftClient | None, target: Router | TargetClient,
                 policy: LoopPolicy = DEFAULT_POLICY, metrics: LoopMetrics | None = None,
                 max_propose: int = 16, draft_backoff_s: float = 1.0,
                 max_concurrency: int = 32, max_verify: int = 16):
        self.policy = policy
        self.max_propose = max_propose  # the draft's max_draft_tokens (K+1 when pipelining)
        self.max_verify = max_verify  # the target's max_draft_tokens (a look-up's cap)
        self.lookup = LookupSettings(max_tokens=min(policy.lookup_k, max_verify),
                                     min_match=policy.lookup_min_match)
        # The tenants' recent outputs, shared by this replica's generations (opt-in).
        self.output_cache = OutputCache(policy.lookup_cache, self.lookup.depth) \
            if policy.lookup_cache > 0 else None
        self.draft = _as_router(draft, "draft") if draft is not None else None
        self.target = _as_router(target, "target")
        self.draft_backoff_s = draft_backoff_s
        self.metrics = metrics if metrics is not None else LoopMetrics()
        # One pre-draft in flight per generation at most: a pool as large as the
        # generations admitted never makes one generation's pre-draft wait for another's.
        self.load_k = LoadAwareK(self.k_max, policy.pipeline) \
            if policy.load_aware_k and draft is not None else None
        self.executor = ThreadPoolExecutor(max_workers=max(1, max_concurrency),
                                           thread_name_prefix="predraft") \
            if policy.pipeline else None
        # Contrastive rounds run the draft's forward beside the target's (one at a time
        # per generation, as pre-drafts do).
        self.amateur_pool = ThreadPoolExecutor(max_workers=max(1, max_concurrency),
                                               thread_name_prefix="amateur") \
            if draft is not None else None

    @property
    def k_max(self) -> int:
        """The most drafts a model-drafted round can verify: the draft's max, less the
        pipelined guess (the target's, when there is no draft)."""
        if self.draft is None:
            return self.max_verify if self.drafts_by_lookup else 0
        return self.max_propose - (1 if self.policy.pipeline else 0)

    @property
    def drafts_by_lookup(self) -> bool:
        """Rounds may be drafted by the look-up (--drafter lookup or hybrid)."""
        return self.policy.drafter != MODEL and self.policy.lookup_k > 0

    def rounds(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams,
               num_draft_tokens: int, eos_token_ids: Sequence[int] = (),
               stats: LoopStats | None = None, load_aware: bool = False,
               contrastive: ContrastiveParams | None = None, tenant: str | None = None,
               ) -> Iterator[RoundOutput]:
        """Run a generation round by round. Closing the iterator early (a stop string,
        a cancelled client) releases both sessions at once. `load_aware`: K was left to
        the server, so the load-aware controller (if on) chooses it each round.
        `contrastive`: contrastive decoding (coordinator.contrastive_round) with a fixed
        K (0 = the plain form); it needs the draft. `tenant`: whose recent outputs the
        look-up may draft from and add this output to (when the output cache is on);
        None = neither."""
        k_max = self.k_max
        speculative = contrastive is None and num_draft_tokens > 0 and \
            (self.draft is not None or self.drafts_by_lookup)
        model_drafts = speculative and self.draft is not None
        adaptive = AdaptiveK(max(1, k_max), num_draft_tokens, self.policy.pipeline) \
            if self.policy.adaptive_k and model_drafts else None
        if contrastive is not None and num_draft_tokens > 0 and \
                (self.policy.adaptive_k or load_aware):
            # K left to the server (or --adaptive-k): measured per generation; the plain
            # form (K = 0) competes.
            adaptive = AdaptiveK(max(1, k_max), num_draft_tokens, self.policy.pipeline,
                                 k_min=0)
        load_k = self.load_k if load_aware and model_drafts and adaptive is None else None
        if contrastive is not None and self.draft is None:
            raise FailedPrecondition("contrastive decoding needs a draft service (the "
                                     "amateur); this coordinator runs target-only")
        gen = Generation(self, list(prompt_ids), sampling,
                         max(num_draft_tokens, adaptive.k_max if adaptive else 0), stats,
                         contrastive, tenant if speculative else None, speculative)
        gen.record.started()
        t0 = time.perf_counter()
        between = 0.0  # the last gap between rounds (the consumer, the detokenizer, ...)
        round_end = None
        try:
            while True:
                remaining = max_new_tokens - gen.generated
                started = time.perf_counter()
                if round_end is not None:
                    between = started - round_end
                k = adaptive.k if adaptive else num_draft_tokens
                lookup_k = self.lookup.max_tokens
                if load_k is not None:
                    k = load_k.choose(num_draft_tokens)
                    lookup_k = min(lookup_k, k)  # the target's budget under load
                result = gen.round(min(k, remaining - 1), remaining,
                                   min(lookup_k, remaining - 1) if k > 0 else 0)
                seconds = time.perf_counter() - started
                gen.record.round(result, seconds)
                if gen.drafters is not None and result.k:
                    gen.drafters.observe(result.source, result.k,
                                         result.decision.num_accepted)
                # Every speculative generation's model-drafted rounds teach it (contrastive
                # ones accept against another distribution; K's controllers learn the
                # draft model, not the look-up).
                if self.load_k is not None and contrastive is None and result.source == MODEL:
                    self.load_k.observe(result.k, result.decision.num_accepted,
                                        result.rejected,
                                        result.propose_s if gen.round_index > 1 else None,
                                        result.proposed, *result.target_pass,
                                        draft_step_s=result.draft_step_s)
                round_end = time.perf_counter()
                if adaptive is not None and gen.round_index > 1 and result.source == MODEL:
                    # (round 1 is mostly prefill)
                    verify_s = result.verify_s
                    if contrastive is not None:
                        # Its plain form competes, at three calls per token: the whole
                        # cycle beyond drafting counts, not the Verify alone (a round's
                        # fixed cost would otherwise make K = 0 look cheaper than it is).
                        verify_s = round_end - started - (result.propose_s or 0.0) - \
                            result.predraft_wait_s + between
                    adaptive.observe(result.k, result.decision.num_accepted, result.rejected,
                                     result.propose_s, verify_s, result.proposed)
                tokens = result.decision.tokens[:remaining]
                kinds = result.decision.kinds[:remaining]
                stop = next((i for i, t in enumerate(tokens) if t in eos_token_ids), None)
                if stop is not None:
                    tokens, kinds = tokens[: stop + 1], kinds[: stop + 1]
                gen.commit(tokens)
                reason = "eos" if stop is not None else (
                    "length" if gen.generated >= max_new_tokens else None)
                gen.record.stats.seconds = time.perf_counter() - t0
                yield RoundOutput(tokens, kinds, reason)
                if reason:
                    return
        finally:
            gen.release()
            if gen.drafters is not None:
                gen.drafters.finished()
            gen.record.finished(time.perf_counter() - t0, gen.meter.sent, gen.meter.received)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 sampling: SamplingParams, num_draft_tokens: int,
                 eos_token_ids: Sequence[int] = (),
                 on_tokens: Callable[[list[int], list[TokenKind]], None] | None = None,
                 contrastive: ContrastiveParams | None = None) -> LoopResult:
        stats = LoopStats()
        ids: list[int] = []
        kinds: list[TokenKind] = []
        reason = "length"
        for out in self.rounds(prompt_ids, max_new_tokens, sampling, num_draft_tokens,
                               eos_token_ids, stats, contrastive=contrastive):
            ids += out.tokens
            kinds += out.kinds
            if on_tokens:
                on_tokens(out.tokens, out.kinds)
            reason = out.finish_reason or reason
        return LoopResult(ids, kinds, reason, stats)


def _as_router(x, name: str) -> Router:
    return x if isinstance(x, Router) else Router.from_clients({f"{name}-0": x})


class Generation:
    """One generation: its committed ids, its links to both services, its pre-drafts,
    the confidence exit's threshold, and its record."""

    def __init__(self, loop: SpeculativeLoop, prompt: list[int], sampling: SamplingParams,
                 k_max: int, stats: LoopStats | None,
                 contrastive: ContrastiveParams | None = None, tenant: str | None = None,
                 speculative: bool = False):
        self.loop, self.policy, self.sampling = loop, loop.policy, sampling
        self.contrastive = contrastive
        self.committed = TokenPrefix(prompt)
        self.generated = 0
        self.session_id = uuid.uuid4().hex
        self.uniforms = generator(sampling.seed, "uniforms")
        self.round_index = 0
        self.record = Recorder(stats if stats is not None else LoopStats(), loop.metrics,
                               k_max)
        self.meter = WireBytes()  # this generation's bytes on the wire
        self.pins = Pins()
        self.target = TargetLink(loop.target, self.pins, self.session_id, self.record,
                                 self.meter)
        if not self.target.pin():
            raise Unavailable("no target replica is reachable; retry later")
        self.draft = DraftLink(loop.draft, self.pins, self.session_id, self.record,
                               self.meter, loop.draft_backoff_s) \
            if loop.draft is not None else None
        self.predrafts = PreDrafts(loop.executor, self.draft, self.record, sampling,
                                   self.policy.top_n) \
            if loop.executor is not None and self.draft is not None else None
        self.exit = ConfidenceExit(self.policy.exit_threshold,
                                   self.policy.exit_target_acceptance) \
            if self.policy.confidence_exit and self.draft is not None and contrastive is None \
            else None
        self.drafters = Drafters(self.policy.drafter, prompt, loop.lookup,
                                 self.draft is not None, loop.output_cache, tenant,
                                 sampling.greedy) \
            if speculative and loop.drafts_by_lookup else None

    @property
    def exit_below(self) -> float:
        return self.exit.threshold if self.exit is not None else 0.0

    def round(self, k: int, remaining: int, lookup_k: int = 0) -> RoundResult:
        """One round of at most k drafts from the draft model, or lookup_k from the
        look-up; `remaining` tokens are still wanted."""
        self.round_index += 1
        if self.contrastive is not None:
            return contrastive_round(self, k, remaining, self.contrastive)
        committed = list(self.committed.tokens)  # a snapshot: commit() extends the original
        round_seed = derive_seed(self.sampling.seed, "round", self.round_index)
        # Always draw K uniforms, so the random stream does not depend on outcomes.
        u = torch.rand(max(k, 0), generator=self.uniforms, dtype=torch.float64).tolist()
        found = self.drafters.lookup(committed, lookup_k) if self.drafters is not None \
            else NO_LOOKUP
        if found and (self.draft is None or not self.draft.ready() or self.drafters.choose(
                found, self.predrafts is not None and self.predrafts.ready_for(committed))
                == LOOKUP):
            return lookup_round(self, found, round_seed, u, committed)
        if self.drafters is not None and not self.drafters.uses_model:
            k = 0  # --drafter lookup and no match: a target-only round
        max_propose = self.loop.max_propose
        pipelining = self.predrafts is not None and 0 < k < max_propose
        proposal = self.predrafts.take(committed, k) if self.predrafts is not None else None
        propose_s, proposed, draft_step_s = None, 0, 0.0
        if pipelining and self.round_index == 1 and remaining >= 3 and \
                self.policy.prefill_overlap and max_propose >= 3 and self.draft.ready():
            # Overlap the two prefills: the target decodes the first token alone while the
            # draft prefills and proposes from the prompt, its own first token standing in
            # for the target's (lead=1); round 2 uses those drafts when the guess holds.
            self.predrafts.start(self.committed, committed, min(k, max_propose - 2),
                                 self.exit_below, lead=1, prefill=True,
                                 **self.guess_for(self.round_index + 1))
            k = 0
        if proposal is None and k > 0 and self.draft is not None:
            t0 = time.perf_counter()
            proposal = self.draft.propose(
                self.committed, k + 1 if pipelining else k, self.sampling, self.policy.top_n,
                self.exit_below,
                guess_seed=self.bonus_seed(self.round_index) if pipelining else None)
            if proposal is not None:
                propose_s, proposed = time.perf_counter() - t0, len(proposal.tokens)
        exited_early = proposal is not None and proposal.exited_early
        if proposal is not None:
            # Pipelining: the last token is the draft's guess at the bonus, not a draft.
            # Not after a confidence exit: the token it was unsure of must be verified like
            # the others (choosing which drafts to verify by their own probability would
            # bias the output away from the target's distribution), so no guess is left.
            guess_last = pipelining and not exited_early
            n = min(k, len(proposal.tokens) - (1 if guess_last else 0))
            guess = proposal.tokens[n] if guess_last and len(proposal.tokens) > n else None
            draft_step_s = proposal.step_seconds
            drafts = Proposal(proposal.tokens[:n], proposal.dists[:n], proposal.cached_len)
            proposal = drafts if n else None  # none left: a target-only round
            # Assume all n drafts are accepted and the bonus equals the guess: draft the
            # next round on the draft's core while the target verifies this one. Not when
            # the next round could not use it (this one may end the generation, or leave
            # room for only a target-only token).
            if pipelining and guess is not None and n + 2 < remaining:
                self.predrafts.start(self.committed, committed + drafts.tokens + [guess], k,
                                     self.exit_below, **self.guess_for(self.round_index + 1))
            else:
                guess = None
        drafts = proposal.tokens if proposal is not None else []
        t0 = time.perf_counter()
        result = self.target.verify(self.committed, drafts,
                                    proposal.dists if proposal is not None else [],
                                    self.sampling, round_seed,
                                    bonus_seed=self.bonus_seed(self.round_index)
                                    if drafts and self.predrafts is not None else None)
        verify_s = time.perf_counter() - t0
        if not drafts:
            decision = Decision([result.bonus_token], [TokenKind.TARGET], 0)
        else:
            q = [proposal.draft_prob(i) for i in range(len(drafts))]
            decision = decide(drafts, q, result, u[:len(drafts)])
            if proposal is not None and guess is not None:  # why the pre-draft may miss
                self.record.outcome(decision.num_accepted < len(drafts),
                                    decision.tokens[-1] != guess)
            if self.exit is not None:
                self.exit.observe(len(drafts), decision.num_accepted)
        return RoundResult(decision, len(drafts), verify_s, propose_s, proposed, exited_early,
                           (result.pass_sessions, result.pass_tokens, result.pass_seconds),
                           draft_step_s)

    def bonus_seed(self, round_index: int) -> int | None:
        """Sampled rounds: the seed of round `round_index`'s coupled bonus, with which the
        draft draws its guess at it (specdec.coupling; a guess that agrees lets the
        pipeline's next round start at once). None when greedy (no draws)."""
        if self.sampling.greedy or not self.policy.couple_bonus:
            return None
        return derive_seed(self.sampling.seed, "bonus", round_index)

    def guess_for(self, round_index: int) -> dict:
        """PreDrafts.start's options for a pre-draft whose last token guesses the bonus
        of round `round_index`."""
        seed = self.bonus_seed(round_index)
        return dict(guess_seed=seed, guess_last=seed is not None)

    def commit(self, tokens: list[int]) -> None:
        self.committed.extend(tokens)
        if self.drafters is not None:
            self.drafters.committed(tokens)
        self.generated += len(tokens)
        self.record.committed(len(tokens))

    def release(self) -> None:
        """Call off a pre-draft in flight, then free every session this generation opened;
        never hides its own outcome."""
        if self.predrafts is not None:
            self.predrafts.drop()  # a busy draft session is freed when its request returns
        self.pins.release_all(self.session_id)
