"""The speculative decoding loop over draft and target replicas.

One generation is rounds of Propose -> Verify -> decide, with the pure math of
specdec.verify, until max_new_tokens or an end-of-sequence token. K = 0 is
target-only decoding through the same Verify call (num_draft = 0), so both paths share
everything but the draft.

Caches: each service's session is kept in step with the committed ids by the
cache-sync rule (coordinator.session); a FAILED_PRECONDITION or NOT_FOUND reply makes
the loop forget what it believed and re-prefill.

Faults: a failing draft never fails a generation: the loop decodes target-only and
tries a draft again after a back-off (another replica if the first is down). A failing
target is replaced by another replica, which re-prefills from the committed ids and
repeats the round with the same round seed; with none left the generation fails with
UNAVAILABLE. Greedy output is the same with or without faults.

Metrics: every count kept in LoopStats (per generation) is also reported, at the same
place, to the loop's LoopMetrics (process-wide; a null object unless the coordinator
serves --metrics-port), with round and RPC latencies and the generations running.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import grpc
import torch

from coordinator.adaptive import AdaptiveK, ConfidenceExit
from coordinator.clients import (
    Cancel,
    DraftClient,
    Proposal,
    SyncRequest,
    TargetClient,
    WireBytes,
)
from coordinator.routing import Replica, Router
from coordinator.session import CacheView, Committed
from specdec.errors import InvalidArgument, ResourceExhausted, Unavailable
from specdec.metrics import LoopMetrics
from specdec.sampling import SamplingParams, derive_seed, generator
from specdec.verify import Decision, TargetRound, TokenKind, decide

log = logging.getLogger(__name__)

RESYNC_CODES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
# A called-off pre-draft holds the draft session until its current step ends; the next
# Propose on it is ABORTED meanwhile and retried this long.
BUSY_RETRY_S = 10.0


@dataclass
class LoopStats:
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0  # rounds that ended in a recovered token
    resyncs: int = 0  # re-prefills after FAILED_PRECONDITION / NOT_FOUND
    draft_fallbacks: int = 0  # rounds decoded target-only because the draft failed
    target_repins: int = 0
    k_per_round: list[int] = field(default_factory=list)  # the K each round used
    predrafts_started: int = 0  # pre-drafts sent (each is then used or wasted)
    pipelined_rounds: int = 0  # rounds whose drafts were pre-drafted during the last Verify
    predrafts_wasted: int = 0  # pre-drafts thrown away (a rejection or another bonus)
    confidence_exits: int = 0  # rounds the draft cut short (confidence below the threshold)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)


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
                 top_n: int = 0, draft_backoff_s: float = 1.0,
                 metrics: LoopMetrics | None = None, pipeline: bool = False,
                 max_propose: int = 16, adaptive: bool = False,
                 confidence_exit: ConfidenceExit | None = None):
        self.pipeline = pipeline
        self.adaptive = adaptive  # choose K per round (coordinator.adaptive); K = the start
        # Pipelined: round 1 is the target's alone while the draft prefills (see round()).
        self.prefill_overlap = True
        # The confidence exit's starting state; each generation adapts its own copy.
        self.confidence_exit = confidence_exit
        self.max_propose = max_propose  # the draft's max_draft_tokens (K+1 when pipelining)
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="predraft") \
            if pipeline else None
        self.draft = _as_router(draft, "draft") if draft is not None else None
        self.target = _as_router(target, "target")
        self.top_n = top_n
        self.draft_backoff_s = draft_backoff_s
        self.metrics = metrics if metrics is not None else LoopMetrics()

    def rounds(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        num_draft_tokens: int,
        eos_token_ids: Sequence[int] = (),
        stats: LoopStats | None = None,
    ) -> Iterator[RoundOutput]:
        """Run a generation round by round. Closing the iterator early (a stop string,
        a cancelled client) releases both sessions at once."""
        k_max = self.max_propose - (1 if self.pipeline else 0)
        adaptive = AdaptiveK(max(1, k_max), num_draft_tokens, self.pipeline) \
            if self.adaptive and num_draft_tokens > 0 and self.draft is not None else None
        run = _Generation(self, list(prompt_ids), sampling,
                          max(num_draft_tokens, k_max if adaptive else 0), stats)
        metrics = run.metrics
        metrics.generation_started()
        t0 = time.perf_counter()
        try:
            while True:
                remaining = max_new_tokens - len(run.generated)
                started = time.perf_counter()
                k = min(adaptive.k if adaptive else num_draft_tokens, remaining - 1)
                decision = run.round(k, remaining)
                metrics.round(time.perf_counter() - started)
                run.stats.k_per_round.append(run.last_k)
                if adaptive is not None and run.last_verify_s is not None and \
                        run.round_index > 1:  # round 1's Verify is mostly prefill
                    rejected = any(kind == TokenKind.RECOVERED for kind in decision.kinds)
                    adaptive.observe(run.last_k, decision.num_accepted, rejected,
                                     run.last_propose_s, run.last_verify_s, run.last_proposed)
                tokens, kinds = decision.tokens[:remaining], decision.kinds[:remaining]
                stop = next((i for i, t in enumerate(tokens) if t in eos_token_ids), None)
                if stop is not None:
                    tokens, kinds = tokens[: stop + 1], kinds[: stop + 1]
                run.commit(tokens, kinds)
                reason = "eos" if stop is not None else (
                    "length" if len(run.generated) >= max_new_tokens else None)
                run.stats.seconds = time.perf_counter() - t0
                yield RoundOutput(tokens, kinds, reason)
                if reason:
                    return
        finally:
            metrics.generation_finished()
            run.release()
            run.stats.seconds = time.perf_counter() - t0

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 sampling: SamplingParams, num_draft_tokens: int,
                 eos_token_ids: Sequence[int] = (),
                 on_tokens: Callable[[list[int], list[TokenKind]], None] | None = None,
                 ) -> LoopResult:
        stats = LoopStats()
        ids: list[int] = []
        kinds: list[TokenKind] = []
        reason = "length"
        for out in self.rounds(prompt_ids, max_new_tokens, sampling, num_draft_tokens,
                               eos_token_ids, stats):
            ids += out.tokens
            kinds += out.kinds
            if on_tokens:
                on_tokens(out.tokens, out.kinds)
            reason = out.finish_reason or reason
        return LoopResult(ids, kinds, reason, stats)


def _as_router(x, name: str) -> Router:
    return x if isinstance(x, Router) else Router.from_clients({f"{name}-0": x})


@dataclass
class _PreDraft:
    """A pre-draft in flight: the next round's drafts, on an assumption."""

    future: Future  # -> (Proposal, the ids the draft then holds)
    assumed: list[int]  # the committed ids it assumed (all accepted, bonus = its guess)
    cancel: Cancel
    surely_held: list[int]  # what the draft holds however far it got when called off
    lead: int = 0  # its first tokens are guesses too (the prefill round's pre-draft)


class _Generation:
    """State of one generation: committed ids, pinned replicas, cache views, stats."""

    def __init__(self, loop: SpeculativeLoop, prompt: list[int], sampling: SamplingParams,
                 k: int, stats: LoopStats | None):
        self.loop = loop
        self.sampling = sampling
        self.committed = Committed(prompt)
        self.generated: list[int] = []
        self.kinds: list[TokenKind] = []
        self.session_id = uuid.uuid4().hex
        self.uniforms = generator(sampling.seed, "uniforms")
        self.round_index = 0
        self.stats = stats if stats is not None else LoopStats()
        self.metrics = loop.metrics
        self.stats.accepted_per_position = [0] * max(k, 0)
        self.meter = WireBytes()  # this generation's bytes on the wire
        self.touched: list[tuple[Router, Replica]] = []  # sessions to release at the end
        self.target = self._pin(loop.target, ())
        if self.target is None:
            raise Unavailable("no target replica is reachable; retry later")
        self.target_view = CacheView()
        self.draft: Replica | None = None
        self.draft_view = CacheView()
        self.draft_retry_at = 0.0
        self.draft_failures = 0
        # Latencies of the last round, for adaptive K (propose None when pre-drafted).
        self.last_k, self.last_propose_s, self.last_verify_s = 0, None, None
        self.last_proposed = 0  # tokens the last fresh Propose drafted (K, K+1 pipelined)
        self.pending: _PreDraft | None = None
        self.exit = replace(loop.confidence_exit) \
            if loop.confidence_exit is not None and loop.draft is not None else None

    @property
    def exit_below(self) -> float:
        return self.exit.threshold if self.exit is not None else 0.0

    # -- replicas ----------------------------------------------------------------------

    def _pin(self, router: Router, exclude) -> Replica | None:
        replica = router.acquire(exclude)
        if replica is not None:
            self.touched.append((router, replica))
        return replica

    def _draft_replica(self) -> Replica | None:
        """The pinned draft, or a new one once the back-off after a failure is over."""
        if self.loop.draft is None or time.monotonic() < self.draft_retry_at:
            return None
        if self.draft is not None and not self.loop.draft.is_live(self.draft):
            self.draft = None  # its pod left the pool: pick another
        if self.draft is None:
            self.draft = self._pin(self.loop.draft, ())
            self.draft_view = CacheView()
        return self.draft

    def _draft_failed(self, error: grpc.RpcError) -> None:
        log.warning("draft %s failed (%s: %s); decoding target-only for now",
                    self.draft.address, error.code().name, error.details())
        self.stats.draft_fallbacks += 1
        self.metrics.draft_fallback()
        self.draft_failures += 1
        if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            self.loop.draft.mark_failed(self.draft)
            self.draft = None  # re-pin (maybe elsewhere) after the back-off
        backoff = self.loop.draft_backoff_s * 2 ** min(self.draft_failures - 1, 5)
        self.draft_retry_at = time.monotonic() + backoff

    # -- calls -------------------------------------------------------------------------

    def _sync(self, view: CacheView) -> SyncRequest:
        keep_len, keep_digest, new_tokens = view.plan(self.committed)
        return SyncRequest(self.session_id, keep_len, keep_digest, new_tokens)

    def _call(self, view: CacheView, name: str, rpc: Callable[[SyncRequest], object]):
        """Run rpc with the planned sync; on a resync error forget the view and retry once;
        while the session is busy (ABORTED: a called-off pre-draft finishing its step),
        retry shortly.

        name ("propose" or "verify") labels its metrics."""
        give_up, pause = time.monotonic() + BUSY_RETRY_S, 0.001
        resynced = False
        while True:
            try:
                return self._timed(name, rpc, self._sync(view))
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.ABORTED and time.monotonic() < give_up:
                    time.sleep(pause)
                    pause = min(2 * pause, 0.008)
                    continue
                if e.code() not in RESYNC_CODES or resynced:
                    raise
                resynced = True
                self.stats.resyncs += 1
                self.metrics.resync(name)
                view.forget()

    def _timed(self, name: str, rpc: Callable[[SyncRequest], object], sync: SyncRequest):
        """One RPC attempt, its latency reported whether it succeeds or fails."""
        started = time.perf_counter()
        try:
            return rpc(sync)
        finally:
            self.metrics.rpc(name, time.perf_counter() - started)

    def _verify(self, drafts: list[int], proposal: Proposal | None,
                round_seed: int) -> TargetRound:
        """Verify on the pinned target; on failure re-pin and repeat (same round seed)."""
        dists = proposal.dists if proposal else []
        tried: list[str] = []
        if not self.loop.target.is_live(self.target):
            # Its pod is going away (e.g. a rollout): move now, while it still answers.
            moved = self._pin(self.loop.target, [self.target.address])
            if moved is not None:
                log.info("target %s left the pool; re-pinned to %s", self.target.address,
                         moved.address)
                self.target, self.target_view = moved, CacheView()
                self.stats.target_repins += 1
                self.metrics.target_repin()
        while True:
            client: TargetClient = self.target.client
            try:
                result, _ = self._call(self.target_view, "verify", lambda s, c=client: c.verify(
                    s, drafts, dists, self.sampling, round_seed, self.meter))
                self.loop.target.mark_ok(self.target)
                return result
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument(f"target refused the request: {e.details()}") from e
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise ResourceExhausted(f"target is full: {e.details()}") from e
                log.warning("target %s failed (%s: %s); re-pinning", self.target.address,
                            code.name, e.details())
                self.loop.target.mark_failed(self.target)
                tried.append(self.target.address)
                replica = self._pin(self.loop.target, tried)
                if replica is None:
                    raise Unavailable(
                        f"no target replica left to continue the generation (tried "
                        f"{', '.join(tried)}; last error {code.name}: {e.details()})"
                    ) from e
                self.stats.target_repins += 1
                self.metrics.target_repin()
                self.target = replica
                self.target_view = CacheView()

    # -- one round ---------------------------------------------------------------------

    def round(self, k: int, remaining: int) -> Decision:
        """One round of at most k drafts; `remaining` tokens are still wanted."""
        self.round_index += 1
        self.stats.rounds += 1
        committed = list(self.committed.tokens)  # a snapshot: commit() extends the original
        round_seed = derive_seed(self.sampling.seed, "round", self.round_index)
        # Always draw K uniforms, so the random stream does not depend on outcomes.
        u = torch.rand(max(k, 0), generator=self.uniforms, dtype=torch.float64).tolist()
        pipelining = self.loop.pipeline and 0 < k < self.loop.max_propose
        proposal = self._take_predraft(k)
        self.last_propose_s = None
        if pipelining and self.round_index == 1 and remaining >= 3 and \
                self.loop.prefill_overlap and \
                self.loop.max_propose >= 3 and self._draft_replica() is not None:
            # Overlap the two prefills: the target decodes the first token alone while the
            # draft prefills and proposes from the prompt, its own first token standing in
            # for the target's (lead=1); round 2 uses those drafts when the guess holds.
            self._start_predraft(committed, min(k, self.loop.max_propose - 2), lead=1)
            k = 0
        if proposal is None and k > 0:
            t0 = time.perf_counter()
            proposal = self._propose(k + 1 if pipelining else k)
            self.last_propose_s = time.perf_counter() - t0 if proposal is not None else None
            self.last_proposed = len(proposal.tokens) if proposal is not None else 0
        if proposal is not None:
            if proposal.exited_early:
                self.stats.confidence_exits += 1
                self.metrics.confidence_exit()
            # Pipelining: the last token is the draft's guess at the bonus, not a draft.
            # Not after a confidence exit: the token it was unsure of must be verified like
            # the others (choosing which drafts to verify by their own probability would
            # bias the output away from the target's distribution), so no guess is left.
            guess_last = pipelining and not proposal.exited_early
            n = min(k, len(proposal.tokens) - (1 if guess_last else 0))
            guess = proposal.tokens[n] if guess_last and len(proposal.tokens) > n else None
            drafts = Proposal(proposal.tokens[:n], proposal.dists[:n], proposal.cached_len)
            proposal = drafts if n else None  # none left: a target-only round
            # Assume all n drafts are accepted and the bonus equals the guess: draft the
            # next round on the draft's core while the target verifies this one. Not when
            # the next round could not use it (this one may end the generation, or leave
            # room for only a target-only token).
            if pipelining and guess is not None and n + 2 < remaining:
                self._start_predraft(committed + drafts.tokens + [guess], k)
        verify_started = time.perf_counter()
        self.last_k = len(proposal.tokens) if proposal is not None else 0
        if proposal is None:
            result = self._verify([], None, round_seed)
            self.last_verify_s = time.perf_counter() - verify_started
            self.target_view.holds(committed)
            return Decision([result.bonus_token], [TokenKind.TARGET], 0)

        drafts = proposal.tokens
        n = len(drafts)
        result = self._verify(drafts, proposal, round_seed)
        self.last_verify_s = time.perf_counter() - verify_started
        self.target_view.holds(committed + drafts)
        q = [proposal.draft_prob(i) for i in range(n)]
        decision = decide(drafts, q, result, u[:n])
        self.stats.drafted_tokens += n
        self.stats.accepted_tokens += decision.num_accepted
        self.stats.rejections += decision.num_accepted < n
        for i in range(decision.num_accepted):
            self.stats.accepted_per_position[i] += 1
        self.metrics.drafted(n, decision.num_accepted)
        if self.exit is not None:
            self.exit.observe(n, decision.num_accepted)
        return decision

    def _take_predraft(self, k: int) -> Proposal | None:
        """The pre-draft for this round if its assumption held (its K may differ: adaptive
        K); else it is called off. Either way records what the draft now holds."""
        pre, self.pending = self.pending, None
        if pre is None:
            return None
        committed = self.committed.tokens
        # A prefill's pre-draft (lead) is judged once its own first tokens are known, and
        # never called off: it may be about done, and a draft stopped mid-prefill would
        # hold nothing and prefill again.
        useful = k > 0 and (bool(pre.lead) or pre.assumed == committed)
        if not useful and not pre.lead:
            pre.cancel()
        try:
            proposal, view_tokens = pre.future.result()
        except grpc.FutureCancelledError:
            proposal, view_tokens = None, pre.surely_held
        except grpc.RpcError as e:
            self._count_predraft(used=False)
            self.draft_view.forget()
            if self.draft is not None and e.code() not in RESYNC_CODES + (
                    grpc.StatusCode.ABORTED,):
                self._draft_failed(e)  # the next Propose re-prefills; no back-off for those
            return None
        if not useful and not pre.lead:
            # Whether the call-off or the reply won the race, assume the same: the next
            # Propose then splits its work the same way, whatever the timing.
            view_tokens = pre.surely_held
        self.draft_view.holds(view_tokens)
        if useful and pre.lead:
            useful = pre.assumed + proposal.tokens[:pre.lead] == committed and \
                len(proposal.tokens) > pre.lead
            proposal = Proposal(proposal.tokens[pre.lead:], proposal.dists[pre.lead:],
                                proposal.cached_len, proposal.requested - pre.lead)
        self._count_predraft(useful)
        return proposal if useful else None

    def _count_predraft(self, used: bool) -> None:
        if used:
            self.stats.pipelined_rounds += 1
        else:
            self.stats.predrafts_wasted += 1
        self.metrics.predraft(used)

    def _start_predraft(self, assumed_tokens: list[int], k: int, lead: int = 0) -> None:
        """Propose k drafts and a guess on top of `assumed_tokens` plus the draft's own
        first `lead` tokens, which stand for tokens the target has not decided yet."""
        replica = self.draft
        if replica is None:
            return
        assumed = self.committed.extended(assumed_tokens[len(self.committed):])
        view = CacheView()
        view.holds(self.draft_view.tokens)
        client: DraftClient = replica.client
        exit_below = self.exit_below  # read now: the pre-draft must not depend on timing
        keep_len, keep_digest, new_tokens = view.plan(assumed)
        cancel = Cancel()

        def predraft():
            sync = SyncRequest(self.session_id, keep_len, keep_digest, new_tokens)
            proposal = client.propose(sync, lead + k + 1, self.sampling, self.loop.top_n,
                                      self.meter, exit_below, cancel)
            return proposal, assumed.tokens + proposal.tokens[:-1]

        # Called off at any point, the draft still holds the kept prefix: a request never
        # crops below its keep_len, and what it fed before stopping only adds to it.
        self.pending = _PreDraft(self.loop._executor.submit(predraft), list(assumed_tokens),
                                 cancel, assumed.tokens[:keep_len], lead)
        self.stats.predrafts_started += 1

    def _propose(self, k: int) -> Proposal | None:
        replica = self._draft_replica()
        if replica is None:
            return None
        client: DraftClient = replica.client
        try:
            proposal = self._call(self.draft_view, "propose", lambda s: client.propose(
                s, k, self.sampling, self.loop.top_n, self.meter, self.exit_below))
        except grpc.RpcError as e:
            self._draft_failed(e)
            return None
        self.draft_failures = 0
        self.draft_view.holds(self.committed.tokens + proposal.tokens[:-1])
        return proposal

    def commit(self, tokens: list[int], kinds: list[TokenKind]) -> None:
        self.committed.extend(tokens)
        self.generated.extend(tokens)
        self.kinds.extend(kinds)
        self.metrics.generated(len(tokens))

    def drop_predraft(self) -> None:
        """Call off a pre-draft in flight and count it wasted (the generation is over)."""
        pre, self.pending = self.pending, None
        if pre is None:
            return
        pre.cancel()
        try:
            pre.future.result()
        except (grpc.RpcError, grpc.FutureCancelledError):
            pass
        self._count_predraft(used=False)

    def release(self) -> None:
        """Free every session this generation opened; never hides its own outcome."""
        self.drop_predraft()  # called off; a busy draft session is freed when it returns
        for router, replica in self.touched:
            try:
                replica.client.release(self.session_id)
            except grpc.RpcError:
                pass
            router.release(replica)
        self.touched.clear()
        self.stats.bytes_sent = self.meter.sent
        self.stats.bytes_received = self.meter.received
