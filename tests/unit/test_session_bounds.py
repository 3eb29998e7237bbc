"""specdec.runtime.session: SessionStore bounds: cap, idle TTL, KV-cache budget, reaper."""

from __future__ import annotations

import time

import pytest

from specdec import digest
from specdec.errors import NotFound, ResourceExhausted
from specdec.runtime.session import SessionStore
from tests.unit._session_helpers import d, fill, make_store

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
