"""DraftEngine: Propose without gRPC.

Feeds the new tokens, then samples K tokens one at a time from the processed
distribution truncated to its most likely tokens (those holding top_mass of the mass,
at most top_n) and quantised to integer counts (Quantize-Sample-Verify): the sparse q
it reports is exactly what it sampled from. With a confidence exit (`exit_below`), it
stops after the first token it drew with probability below the threshold: the round is
cut where the draft starts guessing.
Its cache ends holding everything but the last token returned, which it has not fed;
the next request's keep_len drops rejected drafts or feeds it when all were accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from draft_service.amateur import Amateur, ScoreArgs, ScoreResult
from draft_service.state import DraftState
from specdec import coupling
from specdec.errors import Cancelled, require
from specdec.grammar import Grammars, mask
from specdec.penalties import penalise
from specdec.propose import ProposeOptions
from specdec.runtime.cached_model import CachedModel, ServiceInfo
from specdec.sampling import (
    DEFAULT_TOP_MASS,
    DEFAULT_TOP_N,
    Q_TOTAL,
    SamplingParams,
    generator,
    process_logits,
    quantise,
    sample_counts,
    truncate,
)
from specdec.sync import SyncRequest
from specdec.verify import SparseQ, argmax

if TYPE_CHECKING:
    from draft_service.skip_climb import SkipClimber


@dataclass
class ProposeArgs(SyncRequest, ProposeOptions):
    """A Propose: the cache sync, the sampling parameters and the options
    (specdec.propose.ProposeOptions)."""

    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class ProposeResult:
    tokens: list[int]
    dists: list[SparseQ]  # empty when greedy
    cached_len: int
    step_seconds: float = 0.0  # mean duration of the passes its steps ran in


class DraftEngine:
    def __init__(self, model: CachedModel, max_draft_tokens: int = 16,
                 default_top_n: int = DEFAULT_TOP_N, climber: SkipClimber | None = None,
                 default_top_mass: float = DEFAULT_TOP_MASS):
        self.model = model
        model.store.new_state = DraftState  # what a draft session keeps beside its cache
        # skipping on the fly: the climber picks the set, the backend's layers apply it
        self.climber = climber
        self.dynamic = model.backend.dynamic_skip if climber else None
        self.max_draft_tokens = max_draft_tokens
        self.default_top_n = default_top_n
        self.default_top_mass = default_top_mass
        self.amateur = Amateur(model, max_draft_tokens + 1)
        self.grammars = Grammars(lambda: model.backend.loaded.tokenizer, model.vocab_size)

    def info(self) -> ServiceInfo:
        return self.model.info(self.max_draft_tokens, self.default_top_n)

    def validate(self, args: ProposeArgs) -> tuple[int, float]:
        """INVALID_ARGUMENT for a malformed request; returns the effective top_n and
        top_mass."""
        k = args.num_tokens
        require(1 <= k <= self.max_draft_tokens,
                f"num_tokens must be in [1, {self.max_draft_tokens}], got {k}")
        args.sampling.validate()
        require(args.top_n >= 0, f"top_n must be >= 0 (0 = default), got {args.top_n}")
        require(0.0 <= args.top_mass <= 1.0,  # False for NaN
                f"top_mass must be in [0, 1] (0 = default), got {args.top_mass}")
        require(0.0 <= args.exit_below <= 1.0,
                f"exit_below must be in [0, 1] (0 = off), got {args.exit_below}")
        require(0.0 <= args.min_p <= 1.0, f"min_p must be in [0, 1] (0 = off), got {args.min_p}")
        if args.sampling.logit_bias:
            self.model.check_tokens([t for t, _ in args.sampling.logit_bias],
                                    "sampling.logit_bias (its keys)")
        # The cache will hold the new tokens and K - 1 drafts.
        self.model.check_sync(args, extra_positions=k - 1)
        return args.top_n or self.default_top_n, args.top_mass or self.default_top_mass

    def propose(self, args: ProposeArgs, cancelled: Callable[[], bool] = lambda: False,
                busy_wait_s: float = 0.0) -> ProposeResult:
        """`cancelled()` is checked before the request touches the session and before each
        draft step: a request its client has called off does nothing, or stops early and
        leaves the session consistent (what was fed stays). A session another request
        still holds (most likely a called-off pre-draft finishing its step) is waited for
        up to `busy_wait_s` (the server passes the call's remaining deadline) before
        ABORTED."""
        top_n, top_mass = self.validate(args)
        if cancelled():  # e.g. it waited behind other sessions' work
            raise Cancelled("the client called this request off")
        with self.model.store.use(args.session_id, args.keep_len, args.keep_digest,
                                  self._needed(args), busy_wait_s=busy_wait_s) as s:
            steps = self._start(args, s, top_n, top_mass, cancelled)
            try:
                tokens, more = next(steps)
                while True:
                    # Steps run in lockstep with other sessions' (specdec.runtime.batching):
                    # `more` says this session's next step follows at once.
                    logits = self.model.feed(s, tokens, 1, more=more)[0]
                    tokens, more = steps.send(logits)
            except StopIteration as done:
                result = done.value
            finally:
                self.model.done_stepping(s)
            self._finish(s, args, result)
        return result

    def propose_batch(self, batch: list[ProposeArgs],
                      cancelled: Callable[[], bool] = lambda: False,
                      busy_wait_s: float = 0.0) -> list[ProposeResult | Exception]:
        """Every item's Propose at once: one forward pass per drafted position for all the
        items still drafting (an item whose K is smaller, or whose confidence exit fired,
        leaves the later passes). Per item its result or its own error, exactly what
        `propose` would have given it alone; a failing item never affects the others."""
        out: list[ProposeResult | Exception | None] = [None] * len(batch)
        live: dict[int, tuple] = {}  # item -> (args, session, its steps, what it feeds next)
        seen: set[str] = set()
        try:
            for i, args in enumerate(batch):
                try:
                    require(args.session_id not in seen,
                            f"items[{i}]: session {args.session_id!r} appears twice in one "
                            "batch; send one item per session")
                    seen.add(args.session_id)
                    top_n, top_mass = self.validate(args)
                    if cancelled():
                        raise Cancelled("the client called this request off")
                    s = self.model.store.checkout(args.session_id, args.keep_len,
                                                  args.keep_digest, self._needed(args),
                                                  busy_wait_s)
                except Exception as exc:  # noqa: BLE001 - this item's own status
                    out[i] = exc
                    continue
                try:
                    steps = self._start(args, s, top_n, top_mass, cancelled)
                    live[i] = (args, s, steps, next(steps))
                except Exception as exc:  # noqa: BLE001 - e.g. its grammar does not compile
                    self.model.store.drop(s)
                    out[i] = exc
            while live:
                items = list(live.items())
                fed = self.model.feed_many([(s, tokens, 1)
                                            for _, (_, s, _, (tokens, _)) in items])
                for (i, (args, s, steps, _)), (logits, error) in zip(items, fed, strict=True):
                    try:
                        if error is not None:
                            raise error
                        live[i] = (args, s, steps, steps.send(logits[0]))
                    except StopIteration as done:
                        del live[i]
                        self._finish(s, args, done.value)
                        self.model.store.put_back(s)
                        out[i] = done.value
                    except Exception as exc:  # noqa: BLE001 - this item's own status
                        del live[i]
                        self.model.store.drop(s)
                        out[i] = exc
        except BaseException:
            for _, s, _, _ in live.values():
                self.model.store.drop(s)
            raise
        return out

    @staticmethod
    def _needed(args: ProposeArgs) -> int:
        """Positions the session holds after the request (the KV budget's reservation)."""
        return args.keep_len + len(args.new_tokens) + args.num_tokens - 1

    def _start(self, args: ProposeArgs, s, top_n: int, top_mass: float,
               cancelled: Callable[[], bool]) -> Generator[tuple[list[int], bool],
                                                           torch.Tensor, ProposeResult]:
        """Crop a checked-out session to keep_len and return its drafting steps."""
        self.model.crop(s, args.keep_len)
        # the request's grammar: compiled (or refused) before any pass
        self.grammars.state(s, args.sampling.grammar, args.sampling.prompt_len,
                            starting=args.keep_len == 0)
        if self.dynamic is not None:
            self._observe(s, args)
            self.dynamic.set(self.climber.skip_set())
        return self._steps(args, s, top_n, top_mass, cancelled)

    def _steps(self, args: ProposeArgs, s, top_n: int, top_mass: float,
               cancelled: Callable[[], bool]) -> Generator[tuple[list[int], bool],
                                                           torch.Tensor, ProposeResult]:
        """One Propose as steps: yields (tokens to feed, whether another step follows),
        is sent the logits row [V] of the last token fed, and returns the result. The
        caller feeds (alone or beside other sessions' steps) and keeps the session."""
        params = args.sampling
        # Seeded by the request's content: the same request on the same state gives the
        # same answer (safe to retry), and different prefixes draw independently.
        gen = generator(params.seed, "draft", args.keep_len + len(args.new_tokens),
                        args.fed_digest)
        tokens: list[int] = []
        dists: list[SparseQ] = []
        k = args.num_tokens
        logits = yield list(args.new_tokens), k > 1
        passes = [s.last_pass.seconds]
        grammar = s.grammar  # (set by _start)
        if grammar is not None and not grammar.sync(s.tokens, strict=False):
            grammar = None  # a pre-draft's assumed drafts left the grammar: never committed
        for i in range(k):
            if args.keep_logits:
                s.state.keep_rows(s.cached_len, [logits], self.amateur.max_rows)
            # The target's penalties, bias and grammar, on q too (for acceptance; the
            # target applies them to p at every position, which keeps it lossless).
            logits = penalise(logits[None], params, s.tokens)[0]
            if grammar is not None:
                logits = mask(logits, grammar.masks([], logits.shape[0])[0])
            if params.greedy:
                x = argmax(logits[None])[0]
                confidence = float(torch.softmax(logits.float(), -1)[x]) \
                    if args.exit_below > 0 else 1.0
            else:
                ids, q = truncate(process_logits(logits, params), top_n, top_mass)
                if args.min_p > 0:  # q is sorted, most likely first
                    ids = ids[:int((q >= args.min_p * q[0]).sum())]
                # Quantize-Sample-Verify: draw from the counts that are sent
                counts = quantise(q[:len(ids)])
                seed = args.lead_seed if i == 0 and args.lead_seed is not None else \
                    args.guess_seed if i == (k - 1 if args.guess_last else 0) else None
                j = coupling.draw(ids, counts.double(), seed) \
                    if seed is not None else sample_counts(counts, gen)
                x, confidence = int(ids[j]), int(counts[j]) / Q_TOTAL
                dists.append(SparseQ.quantised(ids, counts))
            tokens.append(x)
            s.state.next_token = (s.cached_len, x)  # a read-only Score may ask for it
            if grammar is not None and (x in grammar.eos or not grammar.consume(x)):
                break  # the end of the text: nothing may follow it
            if i + 1 == k or confidence < args.exit_below or cancelled():
                break  # x is returned but not fed: the cache ends before it
            logits = yield [x], i + 2 < k
            passes.append(s.last_pass.seconds)
        # The first pass may be a prefill; the steps after it say what a token costs.
        steps = passes[1:] or passes
        return ProposeResult(tokens, dists, s.cached_len, sum(steps) / len(steps))

    def _finish(self, s, args: ProposeArgs, result: ProposeResult) -> None:
        if self.dynamic is not None:
            s.state.drafted_with = (self.climber.m, args.keep_len + len(args.new_tokens),
                              tuple(result.tokens), time.perf_counter())

    def _observe(self, s, args: ProposeArgs) -> None:
        """Tell the climber how the session's previous round went: how many of its drafts
        the coordinator kept (read off this request's prefix) and how long the round
        took, Propose to Propose."""
        last = s.state.drafted_with
        if last is None:
            return
        s.state.drafted_with = None
        m, start, tokens, t0 = last
        if args.keep_len < start:  # the session went back further: not a round's outcome
            return
        truth = list(tokens[:args.keep_len - start]) + list(args.new_tokens)
        accepted = 0
        while accepted < min(len(tokens), len(truth)) and truth[accepted] == tokens[accepted]:
            accepted += 1
        self.climber.observe(m, accepted, time.perf_counter() - t0)

    def score(self, args: ScoreArgs, cancelled: Callable[[], bool] = lambda: False,
              busy_wait_s: float = 0.0) -> ScoreResult:
        """The amateur's values on V_head (contrastive decoding; draft_service.amateur)."""
        return self.amateur.score(args, cancelled, busy_wait_s)

    def release(self, session_id: str) -> bool:
        return self.model.release(session_id)
