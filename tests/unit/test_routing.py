"""coordinator.remote.routing: address parsing and least-loaded replica choice with back-off."""

from __future__ import annotations

import grpc
import pytest

from coordinator.remote.routing import Replica, Router, StaticAddresses, parse_addresses


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Sentinel:
    def __init__(self, n: int):
        self.n = n


class MutableAddresses:
    def __init__(self, items):
        self.items = list(items)

    def addresses(self) -> list[str]:
        return list(self.items)


def make_router(addresses, clock=None, backoff_s: float = 2.0):
    made: list[tuple[grpc.Channel, Sentinel]] = []

    def make_client(channel):
        client = Sentinel(len(made))
        made.append((channel, client))
        return client

    source = addresses if hasattr(addresses, "addresses") else StaticAddresses(addresses)
    router = Router(source, make_client, backoff_s=backoff_s, clock=clock or FakeClock())
    return router, made


# -- parse_addresses -----------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("h1:1", ["h1:1"]),
    ("h1:1,h2:2", ["h1:1", "h2:2"]),
    (" h1:1 , h2:2 ", ["h1:1", "h2:2"]),
    ("h1:1,,h2:2,", ["h1:1", "h2:2"]),
    (",, ,", []),
    ("", []),
    ("\th1:1,\n h2:2\n", ["h1:1", "h2:2"]),
])
def test_parse_addresses(text, expected):
    assert parse_addresses(text) == expected


def test_static_addresses_returns_a_copy():
    src = StaticAddresses(("a:1", "b:2"))
    got = src.addresses()
    assert got == ["a:1", "b:2"]
    got.append("c:3")
    assert src.addresses() == ["a:1", "b:2"]


# -- clients -------------------------------------------------------------------------


def test_from_clients_uses_the_given_clients():
    c0, c1 = object(), object()
    router = Router.from_clients({"t0": c0, "t1": c1})
    r = router.acquire()
    assert (r.address, r.client) == ("t0", c0)
    r = router.acquire()
    assert (r.address, r.client) == ("t1", c1)
    assert {x.address: x.client for x in router.replicas()} == {"t0": c0, "t1": c1}


def test_make_client_gets_a_channel_once_per_address():
    router, made = make_router(["a:1", "b:2"])
    assert made == []  # nothing built before the first use
    replicas = router.replicas()
    assert [r.address for r in replicas] == ["a:1", "b:2"]
    assert len(made) == 2
    assert all(isinstance(ch, grpc.Channel) for ch, _ in made)
    assert [r.client for r in replicas] == [c for _, c in made]
    for _ in range(5):
        router.release(router.acquire())
    router.replicas()
    assert len(made) == 2


# -- least loaded --------------------------------------------------------------------


def test_acquire_picks_least_pinned_ties_by_address():
    router, _ = make_router(["a:1", "b:1", "c:1"])
    picks = [router.acquire().address for _ in range(7)]
    assert picks == ["a:1", "b:1", "c:1", "a:1", "b:1", "c:1", "a:1"]
    assert {r.address: r.pinned for r in router.replicas()} == {"a:1": 3, "b:1": 2, "c:1": 2}


def test_ties_are_broken_by_address_not_by_source_order():
    router, _ = make_router(["c:1", "a:1", "b:1"])
    assert router.acquire().address == "a:1"


def test_release_makes_a_replica_least_loaded_again():
    router, _ = make_router(["a:1", "b:1", "c:1"])
    a, b, c = router.acquire(), router.acquire(), router.acquire()
    assert (a.pinned, b.pinned, c.pinned) == (1, 1, 1)
    router.release(b)
    assert b.pinned == 0
    assert router.acquire() is b
    assert b.pinned == 1


def test_release_never_goes_below_zero():
    router, _ = make_router(["a:1"])
    r = router.acquire()
    router.release(r)
    router.release(r)
    assert r.pinned == 0
    assert router.acquire() is r and r.pinned == 1


def test_exclude_skips_replicas():
    router, _ = make_router(["a:1", "b:1", "c:1"])
    assert router.acquire(exclude=["a:1"]).address == "b:1"
    assert router.acquire(exclude=("a:1", "b:1")).address == "c:1"
    # a:1 is the least loaded now; excluding it picks among the others
    assert router.acquire(exclude=["a:1"]).address in ("b:1", "c:1")
    assert router.acquire().address == "a:1"


def test_acquire_none_when_all_excluded():
    router, _ = make_router(["a:1", "b:1"])
    assert router.acquire(exclude=["a:1", "b:1"]) is None
    assert all(r.pinned == 0 for r in router.replicas())


def test_acquire_none_without_addresses():
    router, made = make_router([])
    assert router.acquire() is None
    assert made == []


# -- failures and back-off -----------------------------------------------------------


def test_failed_replica_is_skipped_until_backoff_passes():
    clock = FakeClock(100.0)
    router, _ = make_router(["a:1", "b:1"], clock=clock, backoff_s=2.0)
    a = router.acquire()
    assert a.address == "a:1"
    router.release(a)
    router.mark_failed(a)
    assert a.down_until == 102.0
    assert router.acquire().address == "b:1"
    clock.now = 101.9
    assert router.acquire().address == "b:1"  # b has 2 pinned, a is still down
    clock.now = 102.0
    assert router.acquire() is a


def test_acquire_none_when_all_down_then_recovers():
    clock = FakeClock(0.0)
    router, _ = make_router(["a:1", "b:1"], clock=clock)
    for r in router.replicas():
        router.mark_failed(r)
    assert router.acquire() is None
    assert router.acquire(exclude=["a:1"]) is None
    clock.now = 2.0
    assert router.acquire() is not None


def test_backoff_doubles_up_to_60_seconds():
    clock = FakeClock(50.0)
    router, _ = make_router(["a:1"], clock=clock, backoff_s=2.0)
    (a,) = router.replicas()
    delays = []
    for _ in range(9):
        router.mark_failed(a)
        delays.append(a.down_until - clock.now)
        clock.now += 1000.0
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
    assert a.failures == 9


def test_backoff_starts_at_backoff_s():
    clock = FakeClock(0.0)
    router, _ = make_router(["a:1"], clock=clock, backoff_s=0.5)
    (a,) = router.replicas()
    router.mark_failed(a)
    assert a.down_until == 0.5
    router.mark_failed(a)
    assert a.down_until == 1.0


def test_backoff_is_counted_from_the_failure_time():
    clock = FakeClock(10.0)
    router, _ = make_router(["a:1"], clock=clock, backoff_s=2.0)
    (a,) = router.replicas()
    router.mark_failed(a)
    clock.now = 500.0
    router.mark_failed(a)
    assert a.down_until == 504.0


def test_mark_ok_resets_failures_and_backoff():
    clock = FakeClock(0.0)
    router, _ = make_router(["a:1", "b:1"], clock=clock)
    a = next(r for r in router.replicas() if r.address == "a:1")
    for _ in range(3):
        router.mark_failed(a)
    assert router.acquire().address == "b:1"
    router.mark_ok(a)
    assert (a.failures, a.down_until) == (0, 0.0)
    assert router.acquire() is a  # both have 1 pinned; a sorts first again
    router.mark_failed(a)
    assert a.down_until - clock.now == 2.0  # back-off restarts from the beginning


def test_recovered_replica_with_failures_loses_ties():
    clock = FakeClock(0.0)
    router, _ = make_router(["a:1", "b:1"], clock=clock)
    a = next(r for r in router.replicas() if r.address == "a:1")
    router.mark_failed(a)
    clock.now = 10.0
    assert router.acquire().address == "b:1"  # equal load, a failed recently
    assert router.acquire() is a  # a is less loaded now


# -- address changes -----------------------------------------------------------------


def test_removed_addresses_are_not_chosen():
    source = MutableAddresses(["a:1", "b:1"])
    router, _ = make_router(source)
    assert router.acquire().address == "a:1"
    source.items = ["b:1"]
    assert [router.acquire().address for _ in range(3)] == ["b:1"] * 3
    assert router.acquire(exclude=["b:1"]) is None


def test_added_addresses_are_picked_up_and_readded_keep_their_replica():
    source = MutableAddresses(["a:1"])
    router, made = make_router(source)
    a = router.acquire()
    source.items = ["a:1", "b:1"]
    b = router.acquire()
    assert b.address == "b:1" and len(made) == 2
    source.items = ["b:1"]
    assert router.acquire() is b
    source.items = ["a:1", "b:1"]
    assert router.acquire() is a  # a: 1 pinned, b: 2
    assert a.pinned == 2
    assert len(made) == 2


def test_replica_defaults():
    r = Replica("x:1", None)
    assert (r.pinned, r.down_until, r.failures) == (0, 0.0, 0)


def test_once_dns_has_been_looked_up_again_a_removed_replica_is_never_pinned():
    """Issue 30's pool-removal case: d2 leaves the draft Service's DNS records. Within
    the refresh period the coordinator still uses its last answer; from the next lookup
    on, no new pin goes to d2 and a generation pinned there moves at its next call."""
    from coordinator.record import LoopStats, Recorder
    from coordinator.remote.clients import WireBytes
    from coordinator.remote.link import DraftLink
    from coordinator.remote.routing import DnsAddresses, Pins
    from specdec.metrics import LoopMetrics

    clock = FakeClock()
    answer = ["d1:1", "d2:1"]
    source = DnsAddresses("specdec-draft", 1, refresh_s=1.0,
                          resolver=lambda host, port: list(answer), clock=clock)
    router, _ = make_router(source, clock=clock)
    links = [DraftLink(router, Pins(), f"s{i}", Recorder(LoopStats(), LoopMetrics(), 4),
                       WireBytes(), 0.1)
             for i in range(4)]
    assert all(link.ready() for link in links)
    assert sorted(link.replica.address for link in links) == ["d1:1", "d1:1", "d2:1", "d2:1"]
    answer[:] = ["d1:1"]  # published; the coordinator looked up 0.4 s ago
    clock.now += 0.4
    assert "d2:1" in source.addresses()  # its last answer: the window DNS allows
    clock.now += 0.6  # the refresh period has passed: the next use looks up again
    assert {router.acquire().address for _ in range(20)} == {"d1:1"}
    for link in links:
        assert link.ready() and link.replica.address == "d1:1"
