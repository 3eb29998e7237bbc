"""Shared helpers for the SessionStore tests: a fake clock, distinct caches, fills."""

from __future__ import annotations

from specdec import digest
from specdec.runtime.session import Session, SessionStore


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Cache:
    """A distinct object per session so tests can tell caches apart."""

    created = 0

    def __init__(self) -> None:
        Cache.created += 1
        self.serial = Cache.created


def make_store(**kw) -> tuple[SessionStore, FakeClock]:
    clock = FakeClock()
    return SessionStore(Cache, clock=clock, **kw), clock


def fill(store: SessionStore, sid: str, tokens: list[int]) -> Session:
    """Create (or restart) a session holding `tokens`, and put it back."""
    s = store.checkout(sid, 0, 0)
    s.truncate(0)
    s.append(tokens)
    store.put_back(s)
    return s


def d(tokens: list[int]) -> int:
    return digest.digest(tokens)
