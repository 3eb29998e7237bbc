"""TargetEngine: Verify without gRPC.

One forward pass over new_tokens (committed tail + K drafts) gives p_1..p_{K+1}; the
engine returns p_i(x_i), a recovered sample from norm(max(0, p_i - q_i)) per position
and a bonus sample from p_{K+1}, drawn from a generator seeded by round_seed. The
coordinator makes the decisions. Concurrent Verify calls share forward passes: the
model's continuous scheduler (specdec.runtime.batching) runs every queued one together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from specdec import coupling
from specdec.contrastive import ContrastiveParams, Head, head
from specdec.errors import Cancelled, require
from specdec.grammar import Grammars, mask
from specdec.logprobs import MAX_TOP_LOGPROBS, logprobs_of
from specdec.penalties import penalise
from specdec.runtime.batching import Pass
from specdec.runtime.cached_model import CachedModel, ServiceInfo
from specdec.sampling import Q_TOTAL, SamplingParams, generator, process_logits
from specdec.sync import SyncRequest
from specdec.verify import SparseQ, TargetRound, greedy_round, target_round


@dataclass
class VerifyArgs(SyncRequest):
    num_draft: int = 0
    # q per draft as decoded (specdec.wire.dist_from_proto), unchecked; empty when greedy.
    draft_dists: list[SparseQ] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    round_seed: int = 0
    bonus_seed: int | None = None  # sampled: the bonus by coupled Gumbel-max
    # Contrastive decoding: return V_head with the expert's values at the K+1 positions
    # (specdec.contrastive.head) instead of a round; draft_dists must then be empty.
    contrastive: ContrastiveParams | None = None
    logprobs: int | None = None  # the raw model's log-probabilities, with this many top
    prompt_logprobs: bool = False  # ... also of the fed committed tokens

    @property
    def rows(self) -> int:
        """The positions whose logits the request needs: the K+1 of the round, or with
        prompt_logprobs every fed one."""
        return len(self.new_tokens) if self.prompt_logprobs else self.num_draft + 1


@dataclass
class VerifyResult:
    round: TargetRound
    cached_len: int
    ran_in: Pass | None = None  # the forward pass that served it
    heads: list[Head] | None = None  # contrastive requests: V_head per position


class TargetEngine:
    def __init__(self, model: CachedModel, max_draft_tokens: int = 16):
        self.model = model
        self.max_draft_tokens = max_draft_tokens
        self.grammars = Grammars(lambda: model.backend.loaded.tokenizer, model.vocab_size)

    def info(self) -> ServiceInfo:
        return self.model.info(self.max_draft_tokens)

    def _check_dist(self, i: int, token: int, q: SparseQ) -> SparseQ:
        where = f"draft_dists[{i}]"
        if q.counts is not None:  # the compact form (Quantize-Sample-Verify)
            ids = q.token_ids.tolist()
            self.model.check_tokens(ids, f"{where}.id_deltas (decoded ids)")
            require(bool((q.token_ids[1:] > q.token_ids[:-1]).all()),
                    f"{where}: ids must be strictly ascending (id_deltas after the first "
                    "must be >= 1)")
            require(bool((q.counts >= 1).all()), f"{where}: counts must be >= 1")
            total = int(q.counts.sum())
            require(total == Q_TOTAL, f"{where}: counts must sum to {Q_TOTAL}, got {total}")
        else:  # the float form
            ids, probs = q.token_ids.tolist(), q.probs.tolist()
            self.model.check_tokens(ids, f"{where}.token_ids")
            require(len(set(ids)) == len(ids), f"{where}: token_ids has duplicates")
            require(all(math.isfinite(p) and p >= 0.0 for p in probs),
                    f"{where}: probs must be finite and >= 0")
            total = math.fsum(probs)
            require(abs(total - 1.0) < 1e-3, f"{where}: probs must sum to 1, got {total:.6f}")
        require(q.prob_of(token) > 0.0,
                f"{where} gives probability 0 to its own draft token {token}; "
                "send the distribution the token was sampled from")
        return q

    def validate(self, args: VerifyArgs) -> list[SparseQ] | None:
        """INVALID_ARGUMENT for a malformed request; returns the parsed q's (None = greedy)."""
        k = args.num_draft
        require(0 <= k <= self.max_draft_tokens,
                f"num_draft must be in [0, {self.max_draft_tokens}], got {k}")
        require(k < len(args.new_tokens),
                f"num_draft = {k} needs more than {k} new_tokens: the token before the first "
                f"draft must be fed in the same request (got {len(args.new_tokens)})")
        args.sampling.validate()
        require(0 <= args.round_seed < 2**64, "round_seed must fit in 64 bits")
        require(args.bonus_seed is None or not args.sampling.greedy,
                "bonus_seed is for sampled rounds; leave it unset when greedy")
        self.model.check_sync(args)
        if args.logprobs is not None:
            require(0 <= args.logprobs <= MAX_TOP_LOGPROBS,
                    f"logprobs must be in [0, {MAX_TOP_LOGPROBS}] (the top tokens per "
                    f"position; unset = none), got {args.logprobs}")
        require(not args.prompt_logprobs or args.logprobs is not None,
                "prompt_logprobs needs logprobs (how many top tokens, 0 or more)")
        if args.sampling.logit_bias:
            self.model.check_tokens([t for t, _ in args.sampling.logit_bias],
                                    "sampling.logit_bias (its keys)")
        drafts = args.new_tokens[len(args.new_tokens) - k:] if k else []
        if args.contrastive is not None:
            require(args.logprobs is None and not args.sampling.penalised
                    and args.sampling.grammar is None,
                    "logprobs, penalties, logit_bias and grammar are for speculative rounds, "
                    "not contrastive ones")
            args.contrastive.validate()
            require(not args.draft_dists,
                    "draft_dists must be empty with contrastive: the coordinator verifies "
                    "the drafts against the contrastive distribution, not the target's p")
            return None
        if args.sampling.greedy:
            require(not args.draft_dists,
                    "draft_dists must be empty for greedy sampling (temperature = 0)")
            return None
        require(len(args.draft_dists) == k,
                f"need one draft_dist per draft: num_draft = {k}, got {len(args.draft_dists)}")
        pairs = zip(drafts, args.draft_dists, strict=True)
        return [self._check_dist(i, x, q) for i, (x, q) in enumerate(pairs)]

    def verify(self, args: VerifyArgs, busy_wait_s: float = 0.0,
               cancelled: Callable[[], bool] | None = None) -> VerifyResult:
        """A session another request holds is waited for up to `busy_wait_s`, then
        ABORTED (the same rule as the draft's). A request whose caller has gone
        (`cancelled()`) before its forward pass starts is dropped with CANCELLED and leaves
        the session as it was told to keep it."""
        draft_q = self.validate(args)
        k = args.num_draft
        needed = args.keep_len + len(args.new_tokens)
        # Counts the request until it is done (the HPA's load metric).
        with self.model.metrics.inflight(), \
                self.model.store.use(args.session_id, args.keep_len, args.keep_digest,
                                     needed, busy_wait_s=busy_wait_s) as s:
            self._grammar(args, s)  # compiled (or refused) before the pass
            try:
                # A target-only round's next Verify follows within milliseconds (the
                # coordinator needs nothing else first), so the scheduler may keep it in
                # the same pass as its peers; a speculative round's waits on the draft.
                logits = self.model.sync(s, args, keep_last=args.rows, more=k == 0,
                                         cancelled=cancelled)
            except Cancelled:
                logits = None  # nothing was fed: the session is put back as kept
            if logits is not None:  # (a failure here drops the session, matcher and all)
                return self._result(args, draft_q, logits, s)
        raise Cancelled("the client called this request off")

    def _grammar(self, args: VerifyArgs, s) -> None:
        """The session's matcher for the request's grammar (specdec.grammar)."""
        self.grammars.state(s, args.sampling.grammar, args.sampling.prompt_len,
                            starting=args.keep_len == 0)

    def verify_batch(self, batch: list[VerifyArgs], busy_wait_s: float = 0.0,
                     cancelled: Callable[[], bool] | None = None,
                     ) -> list[VerifyResult | Exception]:
        """Verify every item in one forward pass (budget permitting); per item its result
        or its own error, exactly what `verify` would have given it alone. An item that
        fails (malformed, a resync, a pass of its own that failed) never affects the
        others: it is checked, checked out, fed and put back or dropped by itself."""
        out: list[VerifyResult | Exception | None] = [None] * len(batch)
        held = []  # (item index, args, parsed q, session)
        seen: set[str] = set()
        with self.model.metrics.inflight(len(batch)):
            try:
                for i, args in enumerate(batch):
                    try:
                        require(args.session_id not in seen,
                                f"items[{i}]: session {args.session_id!r} appears twice in "
                                "one batch; send one item per session")
                        seen.add(args.session_id)
                        draft_q = self.validate(args)
                        s = self.model.store.checkout(
                            args.session_id, args.keep_len, args.keep_digest,
                            args.keep_len + len(args.new_tokens), busy_wait_s)
                        try:
                            self._grammar(args, s)
                        except Exception:
                            self.model.store.drop(s)
                            raise
                    except Exception as exc:  # noqa: BLE001 - this item's own status
                        out[i] = exc
                        continue
                    self.model.crop(s, args.keep_len)
                    held.append((i, args, draft_q, s))
                fed = self.model.feed_many(
                    [(s, args.new_tokens, args.rows) for _, args, _, s in held],
                    cancelled)
            except BaseException:
                for _, _, _, s in held:
                    self.model.store.drop(s)
                raise
            for (i, args, draft_q, s), (logits, error) in zip(held, fed, strict=True):
                if error is None:
                    try:
                        out[i] = self._result(args, draft_q, logits, s)
                    except Exception as exc:  # noqa: BLE001 - this item's own status
                        error = exc
                if error is None or isinstance(error, Cancelled):
                    self.model.store.put_back(s)  # cancelled: nothing was fed
                else:
                    self.model.store.drop(s)
                if error is not None:
                    out[i] = error
        return out

    def _result(self, args: VerifyArgs, draft_q: list[SparseQ] | None,
                logits: torch.Tensor, s) -> VerifyResult:
        """The round from the logits of the K+1 positions (contrastive: the heads)."""
        k = args.num_draft
        drafts = args.new_tokens[len(args.new_tokens) - k:] if k else []
        ran_in = s.last_pass
        if args.contrastive is not None:
            heads = [head(row, args.contrastive) for row in logits]
            return VerifyResult(TargetRound([], [], 0), s.cached_len, ran_in, heads)
        fed = args.new_tokens
        prompt_rows, logits = logits[:len(logits) - k - 1], logits[len(logits) - k - 1:]
        # Every position's penalties count the tokens before it, drafts included
        # (specdec.penalties): the distribution target-only decoding would use there.
        params = args.sampling
        processed = penalise(logits, params, s.tokens[:len(s.tokens) - k], drafts) \
            if params.penalised else logits  # (no copy of the session's ids without them)
        if s.grammar is not None:  # row r allows what follows the first r drafts
            s.grammar.sync(s.tokens[:len(s.tokens) - k])
            processed = mask(processed, s.grammar.masks(drafts, processed.shape[1]))
        if params.greedy:
            result = greedy_round(processed, drafts)
        else:
            p = process_logits(processed, params)
            result = target_round(p, drafts, draft_q, generator(args.round_seed, "verify"))
            if args.bonus_seed is not None:
                # Gumbel-max with the seed's noise: an exact draw from p_{K+1}, coupled
                # with the draft's guess at it (the recovered draws are unchanged).
                bonus = coupling.draw(torch.arange(p.shape[1]), p[k], args.bonus_seed)
                result = replace(result, bonus_token=bonus)
        if args.logprobs is not None:
            asked = [[x, r] for x, r in zip(drafts, result.recovered_tokens, strict=True)]
            result = replace(result, logprobs=logprobs_of(
                logits, asked + [[result.bonus_token]], args.logprobs))
            if args.prompt_logprobs:  # row t scores the fed token after it
                result = replace(result, prompt_logprobs=logprobs_of(
                    prompt_rows, [[t] for t in fed[1:len(fed) - k]], args.logprobs))
        return VerifyResult(result, s.cached_len, ran_in)

    def release(self, session_id: str) -> bool:
        return self.model.release(session_id)
