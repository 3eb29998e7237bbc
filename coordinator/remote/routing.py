"""Pick draft and target replicas for a generation.

KV caches live in the replica that built them, so a generation is pinned to one draft
and one target replica. Replicas are chosen least-loaded (fewest generations pinned
from this coordinator replica), skipping those that failed recently; on failure, or
when its address leaves the source (a pod being replaced), the generation is re-pinned
to another one. Where addresses come from is pluggable: a static list, or a headless
Service's DNS records on Kubernetes (`dns:NAME:PORT`, re-resolved periodically).
A replica that appears later is admitted only once `admit` accepts it (the coordinator
checks that its vocabulary and tokenizer match the ones it started with).

Channels are plaintext, or TLS with `tls` (specdec.tls.ClientTLS). The name checked
against a replica's certificate is the host it is dialled by, except for replicas found
through DNS: they are dialled by IP, so the DNS name they were found under is checked
(a headless Service's certificate names the Service, not its pods' IPs). When the TLS
files change (a rotated client certificate), the next refresh gives every replica a client
on a new channel; calls already running finish on the old one.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from specdec.tls import ClientTLS, open_channel

log = logging.getLogger(__name__)

# A replica refused by `admit` (or not answering it) is asked again after this long.
RECHECK_S = 30.0

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    ("grpc.max_send_message_length", 8 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    # The router backs a failed replica off itself (Router.mark_failed). gRPC's own
    # reconnect back-off grows to 120 s by default, so a replica restarted on the same
    # address stayed unreachable long after it was back (measured: docs/benchmarks.md,
    # "Figures behind the code's choices"); keep the channel's short.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def backoff_s(base_s: float, failures: int, max_doublings: int,
              cap_s: float = math.inf) -> float:
    """Exponential back-off: `base_s` after the first failure, doubled for each further
    one at most `max_doublings` times, never above `cap_s`."""
    return min(cap_s, base_s * 2 ** min(max(failures - 1, 0), max_doublings))


class AddressSource(Protocol):
    def addresses(self) -> list[str]: ...


def server_name(source: AddressSource, address: str) -> str | None:
    """The name a replica's TLS certificate must carry when it is not the host in its
    address (a source may say, with a `server_name(address)` method), else None."""
    name_of = getattr(source, "server_name", None)
    return name_of(address) if name_of is not None else None


@dataclass
class StaticAddresses:
    items: Sequence[str]

    def addresses(self) -> list[str]:
        return list(self.items)


def parse_addresses(text: str) -> list[str]:
    """'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2'] (blank entries dropped)."""
    return [a.strip() for a in text.split(",") if a.strip()]


def system_resolver(host: str, port: int) -> list[str]:
    """IPv4/IPv6 addresses of `host` (every A/AAAA record: one per pod behind a headless
    Service)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out = []
    for family, _, _, _, sockaddr in infos:
        ip = sockaddr[0]
        address = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if address not in out:
            out.append(address)
    return sorted(out)


@dataclass
class DnsAddresses:
    """The pods behind a DNS name (a Kubernetes headless Service), re-resolved every
    `refresh_s`. A failed lookup keeps the last answer (DNS blips do not empty a pool)."""

    host: str
    port: int
    refresh_s: float = 5.0
    resolver: Callable[[str, int], list[str]] = system_resolver
    clock: Callable[[], float] = time.monotonic
    _cached: list[str] = field(default_factory=list)
    _at: float = float("-inf")

    def addresses(self) -> list[str]:
        now = self.clock()
        if now - self._at >= self.refresh_s:
            try:
                self._cached = list(self.resolver(self.host, self.port))
            except OSError:
                pass
            self._at = now
        return list(self._cached)

    def server_name(self, address: str) -> str | None:
        """Its pods are dialled by IP; their certificate names the DNS name."""
        return self.host if address in self._cached else None

    def expire(self) -> None:
        """The next `addresses()` resolves again, whatever the refresh period."""
        self._at = float("-inf")


@dataclass
class CombinedAddresses:
    sources: list[AddressSource]

    def addresses(self) -> list[str]:
        out: list[str] = []
        for source in self.sources:
            out += [a for a in source.addresses() if a not in out]
        return out

    def server_name(self, address: str) -> str | None:
        names = (server_name(source, address) for source in self.sources)
        return next((name for name in names if name), None)

    def expire(self) -> None:
        for source in self.sources:
            expire(source)


def expire(source: AddressSource) -> None:
    """Make a source that caches (DNS) look again at its next `addresses()`."""
    how = getattr(source, "expire", None)
    if how is not None:
        how()


def address_source(text: str, refresh_s: float = 5.0) -> AddressSource:
    """'h:p,h2:p2' (static) and/or 'dns:name:port' entries (resolved periodically)."""
    static: list[str] = []
    sources: list[AddressSource] = []
    for entry in parse_addresses(text):
        if entry.startswith("dns:"):
            host, _, port = entry[len("dns:"):].rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"bad DNS address {entry!r}; expected dns:NAME:PORT")
            sources.append(DnsAddresses(host, int(port), refresh_s))
        else:
            static.append(entry)
    if static:
        sources.insert(0, StaticAddresses(static))
    return sources[0] if len(sources) == 1 else CombinedAddresses(sources)


@dataclass
class Replica:
    address: str
    client: Any
    pinned: int = 0  # generations currently pinned here
    down_until: float = 0.0  # skipped until then after a failure
    failures: int = 0


@dataclass
class Router:
    """Least-loaded choice over the replicas of one service."""

    source: AddressSource
    make_client: Callable[[grpc.Channel], Any]
    backoff_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    # (address, client) -> None to admit a new replica, or why it is refused.
    admit: Callable[[str, Any], str | None] | None = None
    tls: ClientTLS | None = None  # None = plaintext channels
    _replicas: dict[str, Replica] = field(default_factory=dict)
    _refused: dict[str, float] = field(default_factory=dict)  # address -> ask again at
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _refresh_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_clients(cls, clients: dict[str, Any]) -> Router:
        """A router over clients that already exist (tests, benchmarks)."""
        router = cls(StaticAddresses(list(clients)), make_client=lambda channel: None)
        router._replicas = {a: Replica(a, c) for a, c in clients.items()}
        return router

    def _channel(self, address: str) -> grpc.Channel:
        return open_channel(address, CHANNEL_OPTIONS, self.tls,
                            server_name(self.source, address))

    def _renew_channels(self) -> None:
        """The TLS files changed: every replica gets a client on a new channel (the old
        channel is left to calls still running on it and closes when they let it go)."""
        with self._lock:
            replicas = list(self._replicas.values())
        for replica in replicas:
            replica.client = self.make_client(self._channel(replica.address))
        if replicas:
            log.info("new TLS channels to %d replica(s): %s", len(replicas),
                     ", ".join(r.address for r in replicas))

    def _refresh(self) -> None:
        """Add the source's new addresses, each once `admit` accepts it (asked outside the
        main lock: it is an RPC); renew the channels when the TLS files changed."""
        with self._refresh_lock:
            if self.tls is not None and self.tls.reload():
                self._renew_channels()
            now = self.clock()
            new = [a for a in self.source.addresses()
                   if a not in self._replicas and self._refused.get(a, now) <= now]
            for address in new:
                channel = self._channel(address)
                client = self.make_client(channel)
                reason = self.admit(address, client) if self.admit is not None else None
                if reason is not None:
                    if address not in self._refused:
                        log.warning("not using replica %s: %s (asking again every %.0f s)",
                                    address, reason, RECHECK_S)
                    self._refused[address] = now + RECHECK_S
                    channel.close()
                    continue
                self._refused.pop(address, None)
                with self._lock:
                    self._replicas[address] = Replica(address, client)

    def acquire(self, exclude: Sequence[str] = ()) -> Replica | None:
        """Pin a generation to the least-loaded healthy replica (None if there is none).
        With none, a DNS source resolves again at once (a rollout's new pod may already be
        listed) before giving up."""
        best = self._acquire(exclude)
        if best is None:
            expire(self.source)
            best = self._acquire(exclude)
        return best

    def _acquire(self, exclude: Sequence[str]) -> Replica | None:
        self._refresh()
        with self._lock:
            live = set(self.source.addresses())
            now = self.clock()
            candidates = [r for a, r in self._replicas.items()
                          if a in live and a not in exclude and r.down_until <= now]
            if not candidates:
                return None
            best = min(candidates, key=lambda r: (r.pinned, r.failures, r.address))
            best.pinned += 1
            return best

    def is_live(self, replica: Replica) -> bool:
        """Still listed by the address source (a pod being removed is not)."""
        return replica.address in self.source.addresses()

    def release(self, replica: Replica) -> None:
        with self._lock:
            replica.pinned = max(0, replica.pinned - 1)

    def mark_failed(self, replica: Replica, *, once_per_outage: bool = False) -> None:
        """Skip this replica for a while (doubling with repeated failures, up to 60 s).

        once_per_outage (what the loop's links pass): a failure reported while the replica
        is still backed off is not counted again. It comes from a generation that was
        pinned there before the outage (no new generation is given a backed-off replica),
        so it is the same outage: N generations seeing one crash back the replica off
        once, not N doublings (which reached the 60 s cap at once and kept a replica
        restarted within seconds idle for a minute)."""
        with self._lock:
            if once_per_outage and replica.down_until > self.clock():
                return
            replica.failures += 1
            delay = backoff_s(self.backoff_s, replica.failures, 10, cap_s=60.0)
            replica.down_until = self.clock() + delay

    def mark_ok(self, replica: Replica) -> None:
        with self._lock:
            replica.failures = 0
            replica.down_until = 0.0

    def replicas(self) -> list[Replica]:
        self._refresh()
        with self._lock:
            return list(self._replicas.values())


class Pins:
    """The replicas one generation is pinned to, over every router it used.

    A generation's KV caches live on the replicas it pinned; at its end `release_all`
    frees its session on each and unpins it (least-loaded counts stay right)."""

    def __init__(self) -> None:
        self._held: list[tuple[Router, Replica]] = []

    def acquire(self, router: Router, exclude: Sequence[str] = ()) -> Replica | None:
        """Pin to the least-loaded healthy replica not in `exclude` (None if none)."""
        replica = router.acquire(exclude)
        if replica is not None:
            self._held.append((router, replica))
        return replica

    def release_all(self, session_id: str) -> None:
        """Free the session on every replica pinned; a replica that is gone is skipped."""
        for router, replica in self._held:
            try:
                replica.client.release(session_id)
            except grpc.RpcError:
                pass
            router.release(replica)
        self._held.clear()
