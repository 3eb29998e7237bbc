"""coordinator.remote.link.Link.call: a resync is planned from what the server says it holds."""

from __future__ import annotations

import grpc
import pytest

from coordinator.record import LoopStats, Recorder
from coordinator.remote.clients import CACHED_LEN_KEY, WireBytes
from coordinator.remote.link import Link
from coordinator.remote.routing import Pins, Router
from specdec.digest import TokenPrefix
from specdec.metrics import LoopMetrics

COMMITTED = list(range(100, 110))  # 10 committed ids


class Refusal(grpc.RpcError):
    """What a server's cache-sync refusal looks like to a client."""

    def __init__(self, code: grpc.StatusCode, cached_len: int | None):
        self._code, self._cached_len = code, cached_len

    def code(self):
        return self._code

    def details(self):
        return "refused"

    def trailing_metadata(self):
        return () if self._cached_len is None else ((CACHED_LEN_KEY, str(self._cached_len)),)


class Server:
    """Answers with the scripted refusals, then succeeds; records every request."""

    def __init__(self, *refusals: Refusal):
        self.refusals, self.requests = list(refusals), []

    def __call__(self, client, sync):
        self.requests.append(sync)
        if self.refusals:
            raise self.refusals.pop(0)
        return "ok"


def link_holding(tokens: list[int]) -> tuple[Link, LoopStats]:
    stats = LoopStats()
    link = Link(Router.from_clients({"t-0": object()}), Pins(), "s",
                Recorder(stats, LoopMetrics(), 4), WireBytes())
    assert link.pin()
    link.view.holds(tokens)
    return link, stats


def test_a_server_holding_less_is_resynced_from_its_cached_len():
    link, stats = link_holding(COMMITTED[:9])
    server = Server(Refusal(grpc.StatusCode.FAILED_PRECONDITION, cached_len=6))
    assert link.call(TokenPrefix(COMMITTED), server) == "ok"
    first, retry = server.requests
    assert first.keep_len == 9
    assert retry.keep_len == 6 and retry.new_tokens == COMMITTED[6:]  # only the tail
    assert stats.resyncs == 1


@pytest.mark.parametrize("refusal", [
    Refusal(grpc.StatusCode.FAILED_PRECONDITION, cached_len=12),  # holds another prefix
    Refusal(grpc.StatusCode.FAILED_PRECONDITION, cached_len=None),
    Refusal(grpc.StatusCode.NOT_FOUND, cached_len=0),  # evicted or restarted
], ids=["digest-mismatch", "no-metadata", "not-found"])
def test_otherwise_the_retry_re_prefills(refusal):
    link, stats = link_holding(COMMITTED[:9])
    server = Server(refusal)
    link.call(TokenPrefix(COMMITTED), server)
    assert server.requests[-1].keep_len == 0 and server.requests[-1].new_tokens == COMMITTED
    assert stats.resyncs == 1


def test_a_partial_resync_that_fails_again_falls_back_to_a_full_re_prefill():
    link, stats = link_holding(COMMITTED[:9])
    server = Server(Refusal(grpc.StatusCode.FAILED_PRECONDITION, cached_len=6),
                    Refusal(grpc.StatusCode.FAILED_PRECONDITION, cached_len=6))
    link.call(TokenPrefix(COMMITTED), server)
    assert [r.keep_len for r in server.requests] == [9, 6, 0]
    assert stats.resyncs == 2


def test_a_full_re_prefill_refused_again_is_an_error():
    link, _ = link_holding([])
    server = Server(Refusal(grpc.StatusCode.NOT_FOUND, 0), Refusal(grpc.StatusCode.NOT_FOUND, 0))
    with pytest.raises(grpc.RpcError):
        link.call(TokenPrefix(COMMITTED), server)
    assert len(server.requests) == 2


def test_other_errors_are_not_resynced():
    link, stats = link_holding(COMMITTED[:9])
    server = Server(Refusal(grpc.StatusCode.UNAVAILABLE, None))
    with pytest.raises(grpc.RpcError):
        link.call(TokenPrefix(COMMITTED), server)
    assert len(server.requests) == 1 and stats.resyncs == 0


def test_after_a_success_the_view_is_what_the_reply_says_the_server_holds():
    link, _ = link_holding([])
    link.view.served(COMMITTED + [1, 2, 3], cached_len=12)
    assert link.view.tokens == COMMITTED + [1, 2]
