"""A backend plus its session store: the cache-sync rule applied to real KV caches.

Both engines (draft and target) are built on this: validate the sync fields of a
request, check the session out, crop its cache to keep_len, feed new_tokens in one
forward pass, and put it back, or drop it if anything failed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from specdec import digest as digests
from specdec.errors import InvalidArgument, require
from specdec.metrics import ModelMetrics
from specdec.runtime.session import Session, SessionStore
from specdec.sync import SyncRequest


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


class CachedModel:
    def __init__(self, backend, max_sessions: int = 64, session_ttl_s: float = 600.0,
                 max_cached_tokens: int = 0):
        self.backend = backend
        self.vocab_size = backend.vocab_size
        self.max_context = backend.max_context
        self.store = SessionStore(backend.new_cache, max_sessions, session_ttl_s,
                                  max_cached_tokens=max_cached_tokens)
        # One forward pass at a time: the model's compute is the bottleneck anyway, and
        # this keeps per-thread library state (e.g. torch's) out of the picture.
        self._compute = threading.Lock()
        # Forward passes and tokens fed; the null object unless --metrics-port is set
        # (service_cli.start_metrics).
        self.metrics: ModelMetrics = ModelMetrics()

    def info(self, max_draft_tokens: int, default_top_n: int = 0) -> ServiceInfo:
        b = self.backend
        return ServiceInfo(b.loaded.model_id, b.vocab_size, b.loaded.tokenizer_digest,
                           b.max_context, b.name, str(b.device), max_draft_tokens,
                           self.store.max_sessions, default_top_n)

    def release(self, session_id: str) -> bool:
        require(bool(session_id), "session_id must not be empty")
        return self.store.release(session_id)

    def check_tokens(self, tokens: list[int], what: str) -> None:
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        require(not bad, f"{what} holds token ids outside the vocabulary [0, "
                         f"{self.vocab_size}): {bad[:5]}")

    def check_sync(self, args: SyncRequest, extra_positions: int = 0) -> None:
        """INVALID_ARGUMENT for a malformed sync request; nothing is touched."""
        require(bool(args.session_id), "session_id must not be empty")
        require(len(args.session_id) <= 256, "session_id is longer than 256 characters")
        require(args.keep_len >= 0, f"keep_len must be >= 0, got {args.keep_len}")
        require(0 <= args.keep_digest < 2**64, "keep_digest must fit in 64 bits")
        require(args.keep_len > 0 or args.keep_digest == digests.EMPTY,
                "keep_len = 0 requires keep_digest = 0 (the digest of the empty prefix)")
        require(len(args.new_tokens) >= 1,
                "new_tokens must hold at least one token (the next input)")
        self.check_tokens(args.new_tokens, "new_tokens")
        total = args.keep_len + len(args.new_tokens) + extra_positions
        if total > self.max_context:
            raise InvalidArgument(
                f"request needs {total} positions, beyond max_context = {self.max_context} "
                "for this model; shorten the prompt or the generation"
            )

    def sync(self, session: Session, args: SyncRequest, keep_last: int) -> torch.Tensor:
        """Crop to keep_len, feed new_tokens, return logits of the last keep_last positions."""
        with self._compute:
            self.backend.crop(session.cache, args.keep_len)
            session.truncate(args.keep_len)
            t0 = time.perf_counter()
            logits = self.backend.forward(session.cache, args.new_tokens, keep_last)
            seconds = time.perf_counter() - t0
        self.metrics.forward(seconds, len(args.new_tokens))
        session.append(args.new_tokens)
        return logits

    def step(self, session: Session, token: int) -> torch.Tensor:
        """Feed one more token; logits [V] of it."""
        with self._compute:
            t0 = time.perf_counter()
            logits = self.backend.forward(session.cache, [token], 1)[0]
            seconds = time.perf_counter() - t0
        self.metrics.forward(seconds, 1)
        session.append([token])
        return logits
