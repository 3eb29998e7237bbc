"""A backend plus its session store: the cache-sync rule applied to real KV caches.

Both engines (draft and target) are built on this: validate the sync fields of a
request, check the session out, crop its cache to keep_len, feed new_tokens in one
forward pass, and put it back, or drop it if anything failed. Forward passes go through
the service's continuous scheduler (specdec.runtime.batching), which runs the steps of
all concurrent requests together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec import digest as digests
from specdec.errors import InvalidArgument, require
from specdec.metrics import ModelMetrics
from specdec.runtime.backend import Backend
from specdec.runtime.batching import Pass, Scheduler
from specdec.runtime.session import Session, SessionStore
from specdec.service_config import DEFAULT_MAX_BATCH_TOKENS
from specdec.sync import SyncRequest


def feed_in_pieces(backend: Backend, cache, tokens: list[int], keep_last: int,
                   budget: int) -> torch.Tensor:
    """Feed `tokens` in passes of at most `budget` tokens (the last one long enough for
    the `keep_last` rows asked for); its logits. A pass's working memory in OpenVINO's
    CPU plugin stays at the largest pass it has run: on Qwen2.5-Coder-0.5B, a 2,048-token
    pass left ~240 MiB more than passes of 512 did. A failed pass crops the cache back to
    where it stood, as one failed pass leaves it."""
    n = len(tokens)
    cut = n - max(n % budget or budget, min(keep_last, n))
    start = backend.cache_len(cache)
    try:
        for i in range(0, cut, budget):
            backend.forward_batch([(cache, tokens[i:min(i + budget, cut)], 1)])
        return backend.forward_batch([(cache, tokens[cut:], keep_last)])[0]
    except BaseException:
        backend.crop(cache, start)
        raise


@dataclass(frozen=True)
class ServiceInfo:
    model_id: str
    vocab_size: int
    tokenizer_digest: str
    max_context: int
    backend: str
    device: str
    max_draft_tokens: int
    max_sessions: int
    default_top_n: int = 0
    batch_dependent_logits: bool = False  # see common.proto ModelInfo
    skip_layers: tuple[int, ...] = ()  # a layer-skip draft's skipped decoder layers


class CachedModel:
    def __init__(self, backend: Backend, max_sessions: int = 64, session_ttl_s: float = 600.0,
                 max_cached_tokens: int = 0,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, linger_s: float = 0.0):
        self.backend = backend
        self.vocab_size = backend.vocab_size
        self.max_context = backend.max_context
        self.store = SessionStore(backend.new_cache, max_sessions, session_ttl_s,
                                  max_cached_tokens=max_cached_tokens)
        # Forward passes, batch sizes and queue waits; the null object unless
        # --metrics-port is set (service_cli.start_metrics).
        self.metrics: ModelMetrics = ModelMetrics()
        # One thread runs every forward pass, batching the steps of concurrent requests.
        self.scheduler = Scheduler(self._forward_batch, max_batch_tokens, linger_s,
                                   on_pass=self._on_pass,
                                   name=f"{backend.name}-scheduler")

    def _forward_batch(self, items: list) -> list[torch.Tensor]:
        """One pass; a lone step over the token budget (the scheduler runs it alone: a
        long prompt) in passes of at most the budget (`feed_in_pieces`)."""
        budget = self.scheduler.max_batch_tokens
        if len(items) == 1 and len(items[0][1]) > budget:
            return [feed_in_pieces(self.backend, *items[0], budget)]
        return self.backend.forward_batch(items)

    def info(self, max_draft_tokens: int, default_top_n: int = 0) -> ServiceInfo:
        b = self.backend
        return ServiceInfo(b.loaded.model_id, b.vocab_size, b.loaded.tokenizer_digest,
                           b.max_context, b.name, str(b.device), max_draft_tokens,
                           self.store.max_sessions, default_top_n,
                           b.batch_dependent_logits, tuple(b.skip_layers))

    def release(self, session_id: str) -> bool:
        require(bool(session_id), "session_id must not be empty")
        return self.store.release(session_id)

    def check_tokens(self, tokens: list[int], what: str) -> None:
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        require(not bad, f"{what} holds token ids outside the vocabulary [0, "
                         f"{self.vocab_size}): {bad[:5]}")

    def check_sync(self, args: SyncRequest, extra_positions: int = 0,
                   feed: bool = True) -> None:
        """INVALID_ARGUMENT for a malformed sync request; nothing is touched. `feed`
        False: new_tokens may be empty (a read of what the session holds)."""
        require(bool(args.session_id), "session_id must not be empty")
        require(len(args.session_id) <= 256, "session_id is longer than 256 characters")
        require(args.keep_len >= 0, f"keep_len must be >= 0, got {args.keep_len}")
        require(0 <= args.keep_digest < 2**64, "keep_digest must fit in 64 bits")
        require(args.keep_len > 0 or args.keep_digest == digests.EMPTY,
                "keep_len = 0 requires keep_digest = 0 (the digest of the empty prefix)")
        require(len(args.new_tokens) >= 1 or not feed,
                "new_tokens must hold at least one token (the next input)")
        self.check_tokens(args.new_tokens, "new_tokens")
        total = args.keep_len + len(args.new_tokens) + extra_positions
        if total > self.max_context:
            raise InvalidArgument(
                f"request needs {total} positions, beyond max_context = {self.max_context} "
                "for this model; shorten the prompt or the generation"
            )

    def _on_pass(self, done: Pass) -> None:
        self.metrics.forward(done.seconds, done.tokens)
        self.metrics.batch(done.sessions, done.tokens, done.queue_wait_s)

    def sync(self, session: Session, args: SyncRequest, keep_last: int, more: bool = False,
             cancelled=None) -> torch.Tensor:
        """Crop to keep_len, feed new_tokens, return logits of the last keep_last positions.

        `more`: another step of this session follows at once (a draft's next token);
        `cancelled()` true before the pass starts raises Cancelled with nothing fed.
        """
        self.crop(session, args.keep_len)
        return self._feed(session, args.new_tokens, keep_last, more, cancelled)

    def feed_many(self, feeds: list[tuple[Session, list[int], int]], cancelled=None,
                  ) -> list[tuple[torch.Tensor | None, BaseException | None]]:
        """Feed several sessions their tokens in one scheduler submission (a batch call's
        step: they share a pass), each after what it holds: (session, tokens, keep_last)
        -> per session (logits of its last keep_last positions, None) or (None, its own
        error). A session whose step failed holds what it held before."""
        results = self.scheduler.run_many(
            [(s, (s.cache, tokens, keep_last)) for s, tokens, keep_last in feeds], cancelled)
        out = []
        for (session, tokens, _), (logits, ran_in, error) in zip(feeds, results, strict=True):
            if error is None:
                session.last_pass = ran_in
                session.append(tokens)
            out.append((logits, error))
        return out

    def crop(self, session: Session, length: int) -> None:
        """Keep the first `length` cached positions."""
        self.backend.crop(session.cache, length)
        session.truncate(length)

    def feed(self, session: Session, tokens: list[int], keep_last: int,
             cancelled=None, more: bool = False) -> torch.Tensor:
        """Feed `tokens` after what the session holds; logits of the last keep_last.
        `more`: another step of this session follows at once."""
        return self._feed(session, tokens, keep_last, more, cancelled)

    def step(self, session: Session, token: int, more: bool = False,
             cancelled=None) -> torch.Tensor:
        """Feed one more token; logits [V] of it."""
        return self._feed(session, [token], 1, more, cancelled)[0]

    def _feed(self, session: Session, tokens: list[int], keep_last: int, more: bool,
              cancelled) -> torch.Tensor:
        logits, session.last_pass = self.scheduler.run_step(
            session, (session.cache, tokens, keep_last), more, cancelled)
        session.append(tokens)
        return logits

    def done_stepping(self, session: Session) -> None:
        """This session announced a next step (more=True) it will not send."""
        self.scheduler.leave(session)

    def warm_up(self, max_tokens: int, prefill: int = 32) -> float:
        """Run a throwaway session through the passes a service sees first, before it
        serves: a prefill, then passes of 1 to `max_tokens` new tokens (each cropped back)
        and one of two sessions. OpenVINO's CPU plugin prepares its kernels per input
        shape on first use, so the first pass of a shape costs many times a later one
        (measured: docs/design.md, "The first pass of each shape"). Returns the seconds
        it took."""
        b = self.backend
        t0 = time.perf_counter()
        prefill = max(1, min(prefill, self.max_context - max_tokens - 1))
        tokens = [1 + i % max(1, self.vocab_size - 1) for i in range(prefill + max_tokens)]
        a, other = b.new_cache(), b.new_cache()
        b.forward_batch([(a, tokens[:prefill], 1)])
        for n in range(1, max_tokens + 1):
            b.forward_batch([(a, tokens[prefill:prefill + n], n)])
            b.crop(a, prefill)
        b.forward_batch([(a, tokens[prefill:prefill + 1], 1), (other, tokens[:4], 1)])
        return time.perf_counter() - t0

    def close(self) -> None:
        self.scheduler.close()
