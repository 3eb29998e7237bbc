"""Replica discovery through DNS (a stub resolver) over real loopback servers."""

from __future__ import annotations

import grpc
import pytest

from coordinator.loop import LoopStats, SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from coordinator.remote.clients import DraftClient, TargetClient
from coordinator.remote.routing import DnsAddresses, Router, address_source
from specdec.sampling import SamplingParams
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig

PROMPT = [4, 8, 15, 16, 23, 42]


@pytest.fixture()
def two_targets():
    servers = []
    for _ in range(2):
        server, port, engine = create_target(TargetConfig(model="tiny-random", port=0))
        server.start()
        servers.append((server, f"127.0.0.1:{port}", engine))
    yield servers
    for server, _, _ in servers:
        server.stop(0)


class StubResolver:
    def __init__(self, answer):
        self.answer = list(answer)
        self.calls = 0

    def __call__(self, host, port):
        self.calls += 1
        assert (host, port) == ("specdec-target.default.svc", 50052)
        return list(self.answer)


def test_address_source_parses_dns_and_static_entries():
    source = address_source("dns:specdec-target.default.svc:50052")
    assert isinstance(source, DnsAddresses) and source.port == 50052
    with pytest.raises(ValueError, match="dns:NAME:PORT"):
        address_source("dns:no-port")


def test_failed_lookup_keeps_the_last_answer():
    answers = [["10.0.0.1:1", "10.0.0.2:1"], OSError("SERVFAIL")]

    def resolver(host, port):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    source = DnsAddresses("x", 1, refresh_s=0, resolver=resolver)
    assert source.addresses() == ["10.0.0.1:1", "10.0.0.2:1"]
    assert source.addresses() == ["10.0.0.1:1", "10.0.0.2:1"]


def test_a_vanished_replica_gets_no_new_generations_and_running_ones_repin(
        two_targets, draft_server):
    addresses = [a for _, a, _ in two_targets]
    resolver = StubResolver(addresses)
    source = DnsAddresses("specdec-target.default.svc", 50052, refresh_s=0, resolver=resolver)
    router = Router(source, make_client=TargetClient)
    draft = DraftClient(grpc.insecure_channel(draft_server[0]))
    loop = SpeculativeLoop(draft, router, LoopPolicy(pipeline=False))
    baseline = loop.generate(PROMPT, 40, SamplingParams(), 0).token_ids

    stats = LoopStats()
    rounds = loop.rounds(PROMPT, 40, SamplingParams(), 4, stats=stats)
    ids = list(next(rounds).tokens)
    pinned = [r for r in router.replicas() if r.pinned]
    assert len(pinned) == 1
    gone = pinned[0].address
    resolver.answer = [a for a in addresses if a != gone]  # its pod is being replaced
    for out in rounds:
        ids += out.tokens
    assert ids == baseline
    assert stats.target_repins == 1

    engines = {a: e for _, a, e in two_targets}
    before = engines[gone].model.store.stats()
    for _ in range(3):
        assert loop.generate(PROMPT, 12, SamplingParams(), 4).token_ids == baseline[:12]
    after = engines[gone].model.store.stats()
    assert (after.live, after.released) == (before.live, before.released)  # nothing new
    assert resolver.calls > 3


def test_a_new_replica_with_another_tokenizer_is_refused(two_targets, caplog):
    """Replicas that appear after start-up are checked like those at start-up: a pod
    serving another tokenizer never gets a generation; a matching one does."""
    import dataclasses

    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service

    (_, first, _), (_, second, engine) = two_targets
    service = build_service(CoordinatorConfig(target=first))
    router = service.loop.target
    resolver = StubResolver([first])
    router.source = DnsAddresses("specdec-target.default.svc", 50052, refresh_s=0,
                                 resolver=resolver)
    real_info = engine.info
    engine.info = lambda: dataclasses.replace(real_info(), tokenizer_digest="other")
    resolver.answer = [first, second]  # a pod of another model comes up
    with caplog.at_level("WARNING", logger="coordinator.remote.routing"):
        assert {r.address for r in router.replicas()} == {first}
    assert any(second in m and "tokenizer other" in m for m in caplog.messages)
    assert router.acquire().address == first and router.acquire().address == first

    engine.info = real_info  # the pod is fixed; asked again after RECHECK_S
    router._refused[second] = 0.0  # (skip the 30 s wait)
    assert {r.address for r in router.replicas()} == {first, second}
    assert router.acquire().address == second  # least loaded now


def test_a_pool_with_no_usable_replica_resolves_again_at_once(two_targets):
    """A rollout's new pod is listed before the old one is gone: when the replicas known
    are all excluded or down, the router looks the name up again instead of waiting out
    the refresh period."""
    (_, first, _), (_, second, _) = two_targets
    resolver = StubResolver([first])
    source = DnsAddresses("specdec-target.default.svc", 50052, refresh_s=3600,
                          resolver=resolver)
    router = Router(source, TargetClient)
    assert router.acquire().address == first
    resolver.answer = [first, second]  # a new replica, not seen yet (refresh: an hour)
    replica = router.acquire(exclude=[first])
    assert replica is not None and replica.address == second
    assert resolver.calls == 2
