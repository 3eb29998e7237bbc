"""Per-session KV caches under the cache-sync rule (docs/design.md).

A request names a session and says "keep the first keep_len tokens of your cache, whose
digest is keep_digest, drop the rest, then feed new_tokens". The store checks that
promise in O(1) against per-position digests, hands the session out to exactly one
request at a time (check-out), and takes it back only when the work succeeded: a
failed forward pass drops the session instead of leaving a half-updated cache.

Bounded: at most `max_sessions` live sessions; idle ones expire after `ttl_s` (checked on
every check-out and by an optional reaper thread); and at most `max_cached_tokens`
positions cached over all sessions (the KV-memory budget): a request that needs more
evicts idle sessions, least recently used first, and gets RESOURCE_EXHAUSTED only if
requests in flight hold the rest. Nothing is evicted while checked out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from specdec.digest import TokenPrefix
from specdec.errors import Aborted, FailedPrecondition, NotFound, ResourceExhausted


@dataclass
class Session:
    session_id: str
    cache: Any  # backend-specific KV cache
    # The cached token ids and the digest of every prefix of them (specdec.digest).
    held: TokenPrefix = field(default_factory=TokenPrefix)
    last_used: float = 0.0
    last_pass: Any = None  # the scheduler's record of the pass that fed it last
    # What the service owning the store keeps per session beside the KV cache (the
    # draft's draft_service.state.DraftState; None for the target): made by the store's
    # `new_state`, and told of every truncation.
    state: Any = None
    # The request's grammar matcher (specdec.grammar.GrammarState; None without one): a
    # function of `tokens`, re-synced by every request that uses it.
    grammar: Any = None

    @property
    def tokens(self) -> list[int]:
        return self.held.tokens

    @property
    def prefix(self) -> list[int]:
        """prefix[i] is the digest of tokens[:i]; always len(tokens) + 1 entries."""
        return self.held.prefix

    @property
    def cached_len(self) -> int:
        return len(self.held)

    def digest_of(self, length: int) -> int:
        """The digest of the first `length` cached tokens."""
        return self.held.digest_of(length)

    def truncate(self, length: int) -> None:
        """Forget the bookkeeping of positions >= length (the caller crops the cache)."""
        self.held.truncate(length)
        if self.state is not None:
            self.state.truncate(length)

    def append(self, tokens: list[int]) -> None:
        self.held.extend(tokens)


@dataclass
class StoreStats:
    live: int
    checked_out: int
    evicted_idle: int
    evicted_for_memory: int
    released: int
    cached_tokens: int


class SessionStore:
    def __init__(
        self,
        new_cache: Callable[[], Any],
        max_sessions: int = 64,
        ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        max_cached_tokens: int = 0,  # 0 = no budget
    ):
        self._new_cache = new_cache
        # Each new session's `state` (the draft service sets its DraftState here).
        self.new_state: Callable[[], Any] = lambda: None
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.max_cached_tokens = max_cached_tokens
        self._clock = clock
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)  # a busy session came back
        self._idle: dict[str, Session] = {}  # sessions at rest, least recently used first
        self._busy: dict[str, int] = {}  # checked out -> positions reserved for the request
        self._out: dict[str, Session] = {}  # the checked-out sessions themselves
        self._release_on_return: set[str] = set()
        self._evicted_idle = 0
        self._evicted_for_memory = 0
        self._released = 0
        self._reaper_stop = threading.Event()

    # -- check-out / put-back --------------------------------------------------------

    def checkout(self, session_id: str, keep_len: int, keep_digest: int,
                 needed_tokens: int = 0, busy_wait_s: float = 0.0) -> Session:
        """Take a session out of the store, validated against (keep_len, keep_digest).

        keep_len == 0 creates the session or restarts it. `needed_tokens` is how many
        positions the session will cache once the request is done (for the budget).
        Raises NotFound, FailedPrecondition, ResourceExhausted or Aborted without
        changing the session (idle sessions may be evicted to make room). A session busy
        with another request is waited for up to `busy_wait_s` before Aborted.
        The caller must crop the cache to keep_len (via `session.truncate` and the
        backend) and then call `put_back` or `drop`.
        """
        with self._lock:
            if session_id in self._busy and busy_wait_s > 0:
                deadline = time.monotonic() + busy_wait_s
                while session_id in self._busy and time.monotonic() < deadline:
                    self._returned.wait(deadline - time.monotonic())
            now = self._clock()
            self._evict_expired(now)
            if session_id in self._busy:
                raise Aborted(
                    f"session {session_id!r} is busy with another request; "
                    "retry when that request has finished"
                )
            session = self._idle.get(session_id)
            if session is None:
                if keep_len > 0:
                    raise NotFound(
                        f"session {session_id!r} is unknown or was evicted; "
                        "start it again with keep_len = 0 and the whole prefix",
                        cached_len=0,
                    )
                if len(self._idle) + len(self._busy) >= self.max_sessions:
                    raise ResourceExhausted(
                        f"session cap reached ({self.max_sessions} live sessions); "
                        "release finished sessions or retry later"
                    )
                session = Session(session_id, self._new_cache(), state=self.new_state())
            else:
                if keep_len > session.cached_len:
                    raise FailedPrecondition(
                        f"session {session_id!r} holds {session.cached_len} tokens, fewer "
                        f"than keep_len = {keep_len}; resend with keep_len <= "
                        f"{session.cached_len}",
                        cached_len=session.cached_len,
                    )
                if session.digest_of(keep_len) != keep_digest:
                    raise FailedPrecondition(
                        f"session {session_id!r}: digest of the first {keep_len} cached "
                        f"tokens differs from keep_digest (the server holds "
                        f"{session.cached_len} tokens of another prefix); resync with a "
                        "shorter keep_len or keep_len = 0",
                        cached_len=session.cached_len,
                    )
            self._make_room(session_id, needed_tokens)
            self._idle.pop(session_id, None)
            self._busy[session_id] = needed_tokens
            self._out[session_id] = session
            return session

    def peek(self, session_id: str) -> tuple[Session, bool]:
        """The session without taking it, and whether a request holds it: for a look-up
        that reads beside that request and changes nothing. NotFound if unknown."""
        with self._lock:
            session = self._idle.get(session_id) or self._out.get(session_id)
            if session is None:
                raise NotFound(f"session {session_id!r} is unknown or was evicted; start it "
                               "again with keep_len = 0 and the whole prefix", cached_len=0)
            return session, session_id in self._out

    def _make_room(self, session_id: str, needed: int) -> None:
        """Evict idle sessions (LRU) until `needed` more positions fit in the budget."""
        if self.max_cached_tokens <= 0:
            return
        if needed > self.max_cached_tokens:
            raise ResourceExhausted(
                f"request needs {needed} cached positions, more than this server's whole "
                f"budget (max_cached_tokens = {self.max_cached_tokens})"
            )
        others = [s for sid, s in self._idle.items() if sid != session_id]
        used = sum(s.cached_len for s in others) + sum(self._busy.values())
        for victim in others:
            if used + needed <= self.max_cached_tokens:
                break
            del self._idle[victim.session_id]
            used -= victim.cached_len
            self._evicted_for_memory += 1
        if used + needed > self.max_cached_tokens:
            raise ResourceExhausted(
                f"KV-cache budget full: {used} of {self.max_cached_tokens} positions are held "
                f"by requests in flight, this one needs {needed}; retry later"
            )

    def put_back(self, session: Session) -> None:
        with self._lock:
            self._busy.pop(session.session_id, None)
            self._out.pop(session.session_id, None)
            self._returned.notify_all()
            if session.session_id in self._release_on_return:
                self._release_on_return.discard(session.session_id)
                self._released += 1
                return
            session.last_used = self._clock()
            self._idle[session.session_id] = session

    def drop(self, session: Session) -> None:
        """Forget a checked-out session (its work failed; its cache may be half-updated)."""
        with self._lock:
            self._busy.pop(session.session_id, None)
            self._out.pop(session.session_id, None)
            self._release_on_return.discard(session.session_id)
            self._returned.notify_all()

    @contextmanager
    def use(self, session_id: str, keep_len: int, keep_digest: int,
            needed_tokens: int = 0, busy_wait_s: float = 0.0) -> Iterator[Session]:
        """Check out, yield, then put back on success or drop on any exception."""
        session = self.checkout(session_id, keep_len, keep_digest, needed_tokens, busy_wait_s)
        try:
            yield session
        except BaseException:
            self.drop(session)
            raise
        self.put_back(session)

    # -- lifecycle -------------------------------------------------------------------

    def release(self, session_id: str) -> bool:
        """Free a session. A checked-out one is freed when its request returns."""
        with self._lock:
            if self._idle.pop(session_id, None) is not None:
                self._released += 1
                return True
            if session_id in self._busy:
                self._release_on_return.add(session_id)
                return True
            return False

    def _evict_expired(self, now: float) -> None:
        expired = [s for s, sess in self._idle.items() if now - sess.last_used > self.ttl_s]
        for sid in expired:
            del self._idle[sid]
        self._evicted_idle += len(expired)

    def evict_expired(self) -> int:
        """Drop idle sessions past their TTL; returns how many."""
        with self._lock:
            before = self._evicted_idle
            self._evict_expired(self._clock())
            return self._evicted_idle - before

    def start_reaper(self, interval_s: float | None = None) -> threading.Thread:
        """Evict expired idle sessions in the background, even when no request comes."""
        interval = interval_s or max(1.0, min(60.0, self.ttl_s / 4))

        def reap():
            while not self._reaper_stop.wait(interval):
                self.evict_expired()

        thread = threading.Thread(target=reap, name="session-reaper", daemon=True)
        thread.start()
        return thread

    def stop_reaper(self) -> None:
        self._reaper_stop.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle) + len(self._busy)

    def idle_ids(self) -> list[str]:
        """The sessions at rest (no request is using them), least recently used first."""
        with self._lock:
            return list(self._idle)

    def stats(self) -> StoreStats:
        with self._lock:
            cached = sum(s.cached_len for s in self._idle.values()) + sum(self._busy.values())
            return StoreStats(len(self._idle) + len(self._busy), len(self._busy),
                              self._evicted_idle, self._evicted_for_memory, self._released,
                              cached)
