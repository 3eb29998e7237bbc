"""specdec.runtime.session: Session bookkeeping and SessionStore check-out (cache-sync rule)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from specdec import digest
from specdec.errors import Aborted, FailedPrecondition, NotFound
from specdec.runtime.session import Session
from tests.unit._session_helpers import Cache, d, fill, make_store

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
