"""specdec.runtime.session: SessionStore.use(), release() and the stats counters."""

from __future__ import annotations

import pytest

from specdec.errors import FailedPrecondition, NotFound
from tests.unit._session_helpers import d, fill, make_store

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
