"""specdec.runtime.session: Session bookkeeping and SessionStore under the cache-sync rule."""

from __future__ import annotations

import random
import threading
import time

import pytest

from specdec import digest
from specdec.errors import Aborted, FailedPrecondition, NotFound, ResourceExhausted
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


# -- Session --------------------------------------------------------------------------


def test_new_session_bookkeeping():
    s = Session("a", object())
    assert s.cached_len == 0
    assert s.tokens == []
    assert s.prefix == [digest.EMPTY]


def test_session_append_and_truncate_keep_prefix_digests_consistent():
    rng = random.Random(0)
    s = Session("a", object())
    expected: list[int] = []

    def check() -> None:
        assert s.tokens == expected
        assert s.cached_len == len(expected)
        assert s.prefix == [0] + digest.prefix_digests(expected)
        assert len(s.prefix) == len(s.tokens) + 1
        for n in range(len(expected) + 1):
            assert s.digest_of(n) == digest.digest(expected[:n])
        assert isinstance(s.held, digest.TokenPrefix)  # the one prefix-digest tracker

    for _ in range(40):
        if rng.random() < 0.6:
            chunk = [rng.randrange(50_000) for _ in range(rng.randrange(0, 6))]
            s.append(chunk)
            expected += chunk
        else:
            n = rng.randrange(0, len(expected) + 1)
            s.truncate(n)
            del expected[n:]
        check()
    s.truncate(0)
    expected.clear()
    check()
    s.append([1, 2, 3])
    expected += [1, 2, 3]
    check()


def test_session_truncate_beyond_length_is_noop():
    s = Session("a", object())
    s.append([4, 5])
    s.truncate(10)
    assert s.tokens == [4, 5]
    assert s.prefix == [0] + digest.prefix_digests([4, 5])


# -- SessionStore: check-out rules ----------------------------------------------------


def test_new_session_with_keep_len_zero():
    store, _ = make_store()
    s = store.checkout("a", 0, 0)
    assert s.session_id == "a"
    assert s.cached_len == 0
    assert isinstance(s.cache, Cache)
    assert len(store) == 1
    st = store.stats()
    assert (st.live, st.checked_out) == (1, 1)
    store.put_back(s)
    st = store.stats()
    assert (st.live, st.checked_out) == (1, 0)


@pytest.mark.parametrize("keep_len", [1, 5])
def test_unknown_session_with_keep_len_is_not_found(keep_len):
    store, _ = make_store()
    with pytest.raises(NotFound) as info:
        store.checkout("nope", keep_len, 123)
    assert info.value.metadata == {"cached_len": "0"}
    assert len(store) == 0


@pytest.mark.parametrize("keep_len", [4, 9])
def test_keep_len_beyond_cached_len_is_failed_precondition(keep_len):
    store, _ = make_store()
    s = fill(store, "a", [1, 2, 3])
    with pytest.raises(FailedPrecondition) as info:
        store.checkout("a", keep_len, d([1, 2, 3, 4]))
    assert info.value.metadata == {"cached_len": "3"}
    # Untouched and still available.
    assert store.stats().checked_out == 0
    again = store.checkout("a", 3, d([1, 2, 3]))
    assert again is s and again.tokens == [1, 2, 3]


@pytest.mark.parametrize("keep_len, wrong", [(3, [1, 2, 4]), (2, [2, 1]), (1, [9]),
                                             (3, [1, 2, 3, 4])])
def test_wrong_digest_is_failed_precondition_and_session_untouched(keep_len, wrong):
    store, _ = make_store()
    s = fill(store, "a", [1, 2, 3])
    cache = s.cache
    with pytest.raises(FailedPrecondition) as info:
        store.checkout("a", keep_len, d(wrong))
    assert info.value.metadata == {"cached_len": "3"}
    assert len(store) == 1
    assert store.stats().checked_out == 0
    again = store.checkout("a", 3, d([1, 2, 3]))
    assert again is s
    assert again.cache is cache
    assert again.tokens == [1, 2, 3]
    assert again.prefix == [0] + digest.prefix_digests([1, 2, 3])


@pytest.mark.parametrize("keep_len", [0, 1, 2, 3])
def test_matching_prefix_checks_out(keep_len):
    store, _ = make_store()
    tokens = [10, 20, 30]
    s = fill(store, "a", tokens)
    got = store.checkout("a", keep_len, d(tokens[:keep_len]))
    assert got is s
    # The caller crops; then the state is that of the kept prefix plus new tokens.
    got.truncate(keep_len)
    got.append([99])
    store.put_back(got)
    new = tokens[:keep_len] + [99]
    assert store.checkout("a", len(new), d(new)) is s


def test_keep_len_zero_on_existing_session_restarts_it():
    store, _ = make_store()
    s = fill(store, "a", [1, 2, 3])
    got = store.checkout("a", 0, 0)
    assert got.session_id == "a"
    assert len(store) == 1  # a restart, not a second session
    got.truncate(0)
    got.append([7, 8])
    store.put_back(got)
    with pytest.raises(FailedPrecondition):
        store.checkout("a", 2, d([1, 2]))
    assert store.checkout("a", 2, d([7, 8])).tokens == [7, 8]
    assert s.session_id == "a"


def test_concurrent_checkout_of_same_session_is_aborted():
    store, _ = make_store()
    s = store.checkout("a", 0, 0)
    with pytest.raises(Aborted):
        store.checkout("a", 0, 0)
    with pytest.raises(Aborted):
        store.checkout("a", 5, 123)  # busy wins over any other check
    other = store.checkout("b", 0, 0)  # other sessions are unaffected
    store.put_back(other)
    s.append([1])
    store.put_back(s)
    assert store.checkout("a", 1, d([1])) is s


def test_concurrent_threads_one_wins():
    store, _ = make_store()
    n = 8
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = store.checkout("shared", 0, 0)
        except Aborted as e:
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, Session)]
    assert len(winners) == 1
    assert sum(isinstance(r, Aborted) for r in results) == n - 1
    assert len(store) == 1


# -- bounds ---------------------------------------------------------------------------


def test_max_sessions_cap_and_release():
    store, _ = make_store(max_sessions=2)
    fill(store, "a", [1])
    busy = store.checkout("b", 0, 0)  # checked-out sessions count too
    with pytest.raises(ResourceExhausted):
        store.checkout("c", 0, 0)
    assert len(store) == 2
    # Existing sessions still work at the cap.
    a = store.checkout("a", 1, d([1]))
    store.put_back(a)
    store.put_back(busy)
    assert store.release("a") is True
    assert len(store) == 1
    c = store.checkout("c", 0, 0)
    assert c.session_id == "c"
    with pytest.raises(ResourceExhausted):
        store.checkout("d", 0, 0)


def test_cap_frees_after_drop():
    store, _ = make_store(max_sessions=1)
    s = store.checkout("a", 0, 0)
    with pytest.raises(ResourceExhausted):
        store.checkout("b", 0, 0)
    store.drop(s)
    store.put_back(store.checkout("b", 0, 0))
    assert len(store) == 1


def test_idle_ttl_eviction_on_next_checkout():
    store, clock = make_store(ttl_s=10.0)
    fill(store, "a", [1, 2])  # last used at 1000
    clock.now = 1005.0
    fill(store, "b", [3])  # last used at 1005
    clock.now = 1010.0  # a idle exactly ttl: kept (strictly older expires)
    store.put_back(store.checkout("a", 2, d([1, 2])))  # a now last used at 1010
    clock.now = 1015.5  # b idle 10.5 > 10; a idle 5.5
    store.put_back(store.checkout("c", 0, 0))
    st = store.stats()
    assert st.evicted_idle == 1
    assert st.live == 2
    with pytest.raises(NotFound):
        store.checkout("b", 1, d([3]))
    assert store.checkout("a", 2, d([1, 2])).tokens == [1, 2]


def test_expired_session_is_not_found_for_its_own_checkout():
    store, clock = make_store(ttl_s=10.0)
    fill(store, "a", [1, 2])
    clock.now += 10.001
    with pytest.raises(NotFound):
        store.checkout("a", 2, d([1, 2]))
    assert store.stats().evicted_idle == 1
    assert len(store) == 0


def test_no_eviction_while_checked_out():
    store, clock = make_store(ttl_s=10.0)
    fill(store, "a", [1])
    a = store.checkout("a", 1, d([1]))
    clock.now += 100
    store.put_back(store.checkout("b", 0, 0))  # runs eviction; a is busy
    assert store.evict_expired() == 0
    assert store.stats().evicted_idle == 0
    store.put_back(a)  # last_used refreshed to now
    clock.now += 9
    assert store.evict_expired() == 0
    assert store.checkout("a", 1, d([1])) is a


def test_evict_expired_returns_count():
    store, clock = make_store(ttl_s=5.0)
    for sid in "abc":
        fill(store, sid, [1])
    clock.now += 3
    fill(store, "d", [2])
    clock.now += 3  # a, b, c idle 6 > 5; d idle 3
    assert store.evict_expired() == 3
    assert store.evict_expired() == 0
    st = store.stats()
    assert (st.live, st.evicted_idle) == (1, 3)


def test_eviction_frees_room_under_the_cap():
    store, clock = make_store(max_sessions=1, ttl_s=5.0)
    fill(store, "a", [1])
    with pytest.raises(ResourceExhausted):
        store.checkout("b", 0, 0)
    clock.now += 6
    b = store.checkout("b", 0, 0)
    assert b.session_id == "b"


# -- use() ----------------------------------------------------------------------------


def test_use_puts_back_on_success():
    store, _ = make_store()
    with store.use("a", 0, 0) as s:
        assert store.stats().checked_out == 1
        s.append([5, 6])
    assert store.stats().checked_out == 0
    with store.use("a", 2, d([5, 6])) as again:
        assert again is s


class Boom(Exception):
    pass


def test_use_drops_on_exception():
    store, _ = make_store()
    fill(store, "a", [5, 6])
    with pytest.raises(Boom):
        with store.use("a", 2, d([5, 6])) as s:
            s.append([7])  # half-updated state
            raise Boom()
    assert len(store) == 0
    assert store.stats().checked_out == 0
    with pytest.raises(NotFound):
        store.checkout("a", 2, d([5, 6]))
    fresh = store.checkout("a", 0, 0)
    assert fresh is not s
    assert fresh.cache is not s.cache
    assert fresh.cached_len == 0


def test_use_does_not_check_out_on_sync_error():
    store, _ = make_store()
    fill(store, "a", [5, 6])
    with pytest.raises(FailedPrecondition):
        with store.use("a", 2, d([6, 5])):
            pytest.fail("body must not run")
    assert store.checkout("a", 2, d([5, 6])).tokens == [5, 6]


# -- release --------------------------------------------------------------------------


def test_release_idle_and_unknown():
    store, _ = make_store()
    fill(store, "a", [1])
    assert store.release("a") is True
    assert len(store) == 0
    assert store.stats().released == 1
    assert store.release("a") is False
    assert store.release("never") is False
    assert store.stats().released == 1
    with pytest.raises(NotFound):
        store.checkout("a", 1, d([1]))


def test_release_of_checked_out_session_drops_it_on_return():
    store, _ = make_store()
    s = store.checkout("a", 0, 0)
    s.append([1, 2])
    assert store.release("a") is True
    assert len(store) == 1  # still working
    assert store.stats().released == 0
    store.put_back(s)
    assert len(store) == 0
    assert store.stats().released == 1
    with pytest.raises(NotFound):
        store.checkout("a", 2, d([1, 2]))
    # A later session with the same id starts fresh and is kept normally.
    again = store.checkout("a", 0, 0)
    assert again is not s
    store.put_back(again)
    assert len(store) == 1


def test_release_of_checked_out_session_then_drop():
    store, _ = make_store()
    s = store.checkout("a", 0, 0)
    store.release("a")
    store.drop(s)
    assert len(store) == 0
    store.put_back(store.checkout("a", 0, 0))
    assert len(store) == 1  # the pending release did not leak into the new session


def test_stats_counters():
    store, clock = make_store(ttl_s=10.0)
    fill(store, "a", [1])
    fill(store, "b", [1])
    c = store.checkout("c", 0, 0)
    st = store.stats()
    assert (st.live, st.checked_out, st.evicted_idle, st.released) == (3, 1, 0, 0)
    store.release("b")
    clock.now += 11
    assert store.evict_expired() == 1  # a; c is busy
    st = store.stats()
    assert (st.live, st.checked_out, st.evicted_idle, st.released) == (1, 1, 1, 1)
    store.put_back(c)
    st = store.stats()
    assert (st.live, st.checked_out, st.evicted_idle, st.released) == (1, 0, 1, 1)


# -- KV-cache budget -------------------------------------------------------------------


def _fill(store, sid, n):
    s = store.checkout(sid, 0, 0, needed_tokens=n)
    s.append(list(range(n)))
    store.put_back(s)


def test_budget_evicts_least_recently_used_idle_sessions():
    store = SessionStore(object, max_sessions=10, max_cached_tokens=100)
    _fill(store, "a", 40)
    _fill(store, "b", 40)
    # "a" is used again, so "b" is now the least recently used.
    s = store.checkout("a", 40, digest.digest(range(40)), needed_tokens=41)
    s.append([1])
    store.put_back(s)
    _fill(store, "c", 50)  # 41 + 40 + 50 > 100: evicts "b" only
    assert set(store._idle) == {"a", "c"}
    stats = store.stats()
    assert stats.evicted_for_memory == 1 and stats.cached_tokens == 91


def test_budget_never_evicts_sessions_in_flight():
    store = SessionStore(object, max_sessions=10, max_cached_tokens=100)
    busy = store.checkout("busy", 0, 0, needed_tokens=80)
    with pytest.raises(ResourceExhausted, match="budget full"):
        store.checkout("new", 0, 0, needed_tokens=30)
    assert "new" not in store._idle and len(store) == 1
    store.put_back(busy)


def test_budget_refuses_a_request_larger_than_the_whole_budget():
    store = SessionStore(object, max_sessions=10, max_cached_tokens=100)
    _fill(store, "a", 10)
    with pytest.raises(ResourceExhausted, match="whole budget"):
        store.checkout("a", 10, digest.digest(range(10)), needed_tokens=101)
    assert store._idle["a"].cached_len == 10  # untouched


def test_reaper_evicts_idle_sessions_without_traffic():
    store = SessionStore(object, max_sessions=10, ttl_s=0.05)
    _fill(store, "a", 3)
    store.start_reaper(interval_s=0.02)
    try:
        deadline = time.monotonic() + 5
        while len(store) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(store) == 0 and store.stats().evicted_idle == 1
    finally:
        store.stop_reaper()


def test_a_busy_session_can_be_waited_for():
    store, _ = make_store()
    s = store.checkout("a", 0, 0)
    s.append([1])
    threading.Timer(0.05, store.put_back, args=(s,)).start()
    t0 = time.monotonic()
    again = store.checkout("a", 1, d([1]), busy_wait_s=5.0)  # returned after ~50 ms
    assert again is s and time.monotonic() - t0 < 4.0
    with pytest.raises(Aborted):  # still busy when the wait ends
        store.checkout("a", 1, d([1]), busy_wait_s=0.05)
