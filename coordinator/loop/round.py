"""One generation's part of one lockstep step (coordinator.loop.engine), and what it
streams: the round's drafts and uniforms, its Verify (planned from the target's view,
re-planned after a repair), the target's verdict and the draft's reply to the round's
pre-draft."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from coordinator.drafters.base import NO_DRAFTS, Drafts
from coordinator.remote.clients import ItemFailure, target_round_of, verify_request
from coordinator.remote.link import RESYNC_CODES
from specdec.digest import TokenPrefix
from specdec.errors import InvalidArgument, ResourceExhausted, Unavailable
from specdec.sampling import derive_seed
from specdec.verify import Decision, TokenKind


@dataclass
class RoundOutput:
    tokens: list[int]
    kinds: list[TokenKind]
    finish_reason: str | None  # set on the last round
    # Asked for: specdec.logprobs.TokenLogprobs per token; the first round's also those
    # of the prompt's tokens after the first.
    logprobs: list | None = None
    prompt_logprobs: list | None = None


@dataclass
class Round:
    """One generation's part of one step."""

    gen: object  # the coordinator.loop.generation.Generation it belongs to
    k: int  # the planner's K (a cap on the drafts verified)
    drafts: Drafts
    index: int
    u: list[float]  # one uniform per draft
    request: object = None  # target_pb2.VerifyRequest, planned from the target's view
    predraft: object = None  # the drafter's request for the next round (if any)
    partial: bool = False  # a chunk of a long prefill: nothing is decided
    verdict: object = None  # TargetRound, once verified
    error: BaseException | None = None  # the generation fails with this
    reply: object = None  # the draft service's reply to `predraft`
    decision: Decision | None = None
    output: RoundOutput | None = None
    sent: list[int] = field(default_factory=list)  # the ids the Verify leaves the target with
    seconds: float = 0.0

    @property
    def round_seed(self) -> int:
        return derive_seed(self.gen.sampling.seed, "round", self.index)

    def plan_request(self) -> None:
        """The round's Verify, planned from the target's view (again after a repair):
        the same drafts and seeds whichever replica answers."""
        gen = self.gen
        prefix = TokenPrefix(self.sent) if self.partial else gen.committed
        drafts = [] if self.partial else list(self.drafts.tokens)
        sync = gen.target.plan(prefix)
        self.request = verify_request(sync, drafts, list(self.drafts.dists), gen.sampling,
                                      0 if self.partial else self.round_seed,
                                      bonus_seed=None if self.partial
                                      else gen.bonus_seed(self.index),
                                      logprobs=gen.logprobs,
                                      prompt_logprobs=gen.scoring_prompt(sync.keep_len))

    def verified(self, response) -> None:
        """The target's answer: its view follows, the verdict is kept."""
        link = self.gen.target
        link.router.mark_ok(link.replica)
        link.view.served(self.sent, response.cached_len)
        self.gen.meter.count(self.request, response)
        self.verdict = target_round_of(response)
        if self.request.prompt_logprobs:
            self.gen.scored_prompt(self.request.keep_len, self.verdict.prompt_logprobs)
            if self.partial:  # the chunk's last row scores the next chunk's first token:
                link.view.truncate(len(self.sent) - 1)  # the next chunk feeds it again

    def repair(self, failure: ItemFailure, tried: list[str]) -> bool:
        """Fix what made the Verify fail and re-plan it (True: send it again), or set the
        round's error: a refusal fails the generation; a resync cuts or forgets the
        target's view; a failed replica is replaced (UNAVAILABLE when none is left)."""
        link, code = self.gen.target, failure.code
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            self.error = InvalidArgument(f"target refused the request: {failure.message}")
            return False
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            self.error = ResourceExhausted(f"target is full: {failure.message}")
            return False
        if code in RESYNC_CODES and not failure.whole:
            link.record.resync("verify")
            held = failure.cached_len
            if held is not None and held < self.request.keep_len:
                link.view.truncate(held)
            else:
                link.view.forget()
        else:
            try:
                link.repin(code, failure.message, tried)
            except Unavailable as e:
                self.error = e
                return False
        self.plan_request()
        return True

    def drafted(self, reply, seconds: float) -> None:
        """The draft service's answer to the round's pre-draft (or its failure)."""
        self.reply = reply
        self.gen.record.rpc("propose", seconds)
        if not isinstance(reply, ItemFailure):
            self.gen.meter.count(self.predraft.request, reply)


def trim(drafts: Drafts, n: int) -> Drafts:
    """At most n of the drafts (the next one then stands as the guess)."""
    if len(drafts) <= n:
        return drafts
    if n <= 0:
        return NO_DRAFTS
    return Drafts(drafts.tokens[:n], drafts.dists[:n], drafts.probs[:n], drafts.source,
                  drafts.tokens[n], False, drafts.pipelined, drafts.step_seconds)
