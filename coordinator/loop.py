"""The speculative decoding loop over a draft and a target service.

One `generate` call is one generation: rounds of Propose -> Verify -> decide, with the
pure math of specdec.verify, until max_new_tokens or an end-of-sequence token.
K = 0 is target-only decoding through the same Verify call (num_draft = 0), so both
paths share everything but the draft. Each service's cache is kept in step with the
committed ids by the cache-sync rule (coordinator.session); a FAILED_PRECONDITION or
NOT_FOUND reply makes the loop forget what it believed and re-prefill, once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import torch

from coordinator.clients import DraftClient, SyncRequest, TargetClient
from coordinator.session import CacheView, Committed
from specdec.sampling import SamplingParams, derive_seed, generator
from specdec.verify import Decision, TokenKind, decide

RESYNC_CODES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)


@dataclass
class LoopStats:
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0  # rounds that ended in a recovered token
    resyncs: int = 0
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


class SpeculativeLoop:
    def __init__(self, draft: DraftClient | None, target: TargetClient, top_n: int = 0):
        self.draft = draft
        self.target = target
        self.top_n = top_n

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        num_draft_tokens: int,
        eos_token_ids: Sequence[int] = (),
        on_tokens: Callable[[list[int], list[TokenKind]], None] | None = None,
    ) -> LoopResult:
        run = _Generation(self, list(prompt_ids), sampling, num_draft_tokens)
        t0 = time.perf_counter()
        try:
            while True:
                remaining = max_new_tokens - len(run.generated)
                decision = run.round(min(num_draft_tokens, remaining - 1))
                tokens, kinds = decision.tokens[:remaining], decision.kinds[:remaining]
                stop = next((i for i, t in enumerate(tokens) if t in eos_token_ids), None)
                if stop is not None:
                    tokens, kinds = tokens[: stop + 1], kinds[: stop + 1]
                run.commit(tokens, kinds)
                if on_tokens:
                    on_tokens(tokens, kinds)
                if stop is not None:
                    reason = "eos"
                    break
                if len(run.generated) >= max_new_tokens:
                    reason = "length"
                    break
        finally:
            run.release()
        run.stats.seconds = time.perf_counter() - t0
        return LoopResult(run.generated, run.kinds, reason, run.stats)


class _Generation:
    """State of one generation: committed ids, cache views, random streams, stats."""

    def __init__(self, loop: SpeculativeLoop, prompt: list[int], sampling: SamplingParams,
                 k: int):
        self.loop = loop
        self.sampling = sampling
        self.committed = Committed(prompt)
        self.prompt_len = len(prompt)
        self.generated: list[int] = []
        self.kinds: list[TokenKind] = []
        self.session_id = uuid.uuid4().hex
        self.draft_view = CacheView()
        self.target_view = CacheView()
        self.uniforms = generator(sampling.seed, "uniforms")
        self.round_index = 0
        self.stats = LoopStats(accepted_per_position=[0] * max(k, 0))
        self._used_draft = False
        clients = [c for c in (loop.draft, loop.target) if c is not None]
        self._bytes_at_start = [(c.bytes.sent, c.bytes.received) for c in clients]

    def _sync(self, view: CacheView) -> SyncRequest:
        keep_len, keep_digest, new_tokens = view.plan(self.committed)
        return SyncRequest(self.session_id, keep_len, keep_digest, new_tokens)

    def _call(self, view: CacheView, rpc: Callable[[SyncRequest], object]):
        """Run rpc with the planned sync; on a resync error forget the view and retry once."""
        try:
            return rpc(self._sync(view))
        except grpc.RpcError as e:
            if e.code() not in RESYNC_CODES:
                raise
            self.stats.resyncs += 1
            view.forget()
            return rpc(self._sync(view))

    def round(self, k: int) -> Decision:
        self.round_index += 1
        self.stats.rounds += 1
        committed = self.committed.tokens
        round_seed = derive_seed(self.sampling.seed, "round", self.round_index)
        if k <= 0 or self.loop.draft is None:
            result, _ = self._call(self.target_view, lambda s: self.loop.target.verify(
                s, [], [], self.sampling, round_seed))
            self.target_view.holds(committed)
            return Decision([result.bonus_token], [TokenKind.TARGET], 0)

        self._used_draft = True
        proposal = self._call(self.draft_view, lambda s: self.loop.draft.propose(
            s, k, self.sampling, self.loop.top_n))
        drafts = proposal.tokens
        self.draft_view.holds(committed + drafts[:-1])
        result, _ = self._call(self.target_view, lambda s: self.loop.target.verify(
            s, drafts, proposal.dists, self.sampling, round_seed))
        self.target_view.holds(committed + drafts)
        # Always draw K uniforms, so the random stream does not depend on outcomes.
        u = torch.rand(k, generator=self.uniforms, dtype=torch.float64).tolist()
        q = [proposal.draft_prob(i) for i in range(k)]
        decision = decide(drafts, q, result, u)
        self.stats.drafted_tokens += k
        self.stats.accepted_tokens += decision.num_accepted
        self.stats.rejections += decision.num_accepted < k
        for i in range(decision.num_accepted):
            self.stats.accepted_per_position[i] += 1
        return decision

    def commit(self, tokens: list[int], kinds: list[TokenKind]) -> None:
        self.committed.extend(tokens)
        self.generated.extend(tokens)
        self.kinds.extend(kinds)

    def release(self) -> None:
        """Free both sessions; failures here never hide the generation's own outcome."""
        clients = [self.loop.target] + ([self.loop.draft] if self._used_draft else [])
        for client in clients:
            try:
                client.release(self.session_id)
            except grpc.RpcError:
                pass
        everyone = [c for c in (self.loop.draft, self.loop.target) if c is not None]
        for client, (sent, received) in zip(everyone, self._bytes_at_start, strict=True):
            self.stats.bytes_sent += client.bytes.sent - sent
            self.stats.bytes_received += client.bytes.received - received
