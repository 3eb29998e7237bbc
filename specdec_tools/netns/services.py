"""A specdec service in a network namespace (specdec_tools.netns.network), reached from one
peer over its veth,
with added RTT between them: netem on the link where the kernel has it, else a delay proxy.

    with Network(["draft", "coord"], [("draft", "coord")]) as net:
        ep = start_service(net, "draft", "coord", "draft_service", ["--model", ...],
                           port=50051, rtt_ms=10)
        ep.address        # draft's IP on the draft-coord link, port 50051
        ep.set_rtt(20)    # later: another RTT, same address

netem: the service listens on its link address; `Network.set_rtt` puts RTT/2 on each end.
Delay proxy (no netem): the service listens on 127.0.0.1:PORT inside its namespace and a
`python -m specdec_tools.delay_proxy` beside it, in the same namespace, listens on the link
address with the same port and forwards there, RTT/2 each way. Either way the peer dials
the same address, which crosses the veth; certificates name that address. With the
proxy, the TCP handshake itself is not delayed (see specdec_tools.delay_proxy), and changing the
RTT restarts the proxy (connections through it drop; gRPC channels reconnect).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from specdec import launcher
from specdec_tools.netns.network import Network, netem_available

log = logging.getLogger(__name__)

NETEM, PROXY = "netem", "delay proxy"


def delay_method() -> str:
    """How added RTT gets onto a link here: NETEM or PROXY."""
    return NETEM if netem_available() else PROXY


@dataclass
class Endpoint:
    net: Network
    node: str
    peer: str
    port: int
    method: str
    service: launcher.ServiceProcess
    proxy: launcher.ServiceProcess | None = None
    rtt_ms: float = 0.0
    jitter_ms: float = 0.0

    @property
    def ip(self) -> str:
        return self.net.address(self.node, self.peer)

    @property
    def address(self) -> str:
        """What `peer` dials: the node's link IP and the service's port."""
        return f"{self.ip}:{self.port}"

    def set_rtt(self, rtt_ms: float, jitter_ms: float = 0.0) -> None:
        """Added round-trip time between the service and its peer from now on."""
        if self.method == NETEM:
            self.net.set_rtt(self.node, self.peer, rtt_ms, jitter_ms)
        else:
            if self.proxy is not None:
                self.proxy.stop()
            self.proxy = self.net.start(
                self.node, "specdec_tools.delay_proxy",
                ["--listen", self.address, "--backend", f"127.0.0.1:{self.port}",
                 "--rtt-ms", f"{rtt_ms:g}", "--jitter-ms", f"{jitter_ms:g}"],
                timeout=30, name=f"delay proxy for {self.service.name}")
        self.rtt_ms, self.jitter_ms = rtt_ms, jitter_ms
        log.info("%s at %s: RTT %g ms (jitter %g ms) to %s by %s", self.service.name,
                 self.address, rtt_ms, jitter_ms, self.peer, self.method)


def start_service(net: Network, node: str, peer: str, module: str, args: Sequence[str],
                  port: int, *, rtt_ms: float = 0.0, jitter_ms: float = 0.0,
                  method: str | None = None, timeout: float = 120.0, env: dict | None = None,
                  name: str | None = None, echo: bool = False) -> Endpoint:
    """`python -m module args --host H --port PORT` in `node`, reached by `peer` at
    `Endpoint.address` with `rtt_ms` added (by `method`, default `delay_method()`).
    `args` may hold a --host/--port of their own: the ones appended here win."""
    method = method or delay_method()
    if method not in (NETEM, PROXY):
        raise ValueError(f"unknown delay method {method!r} (use {NETEM!r} or {PROXY!r})")
    if port <= 0:
        raise ValueError("start_service needs a fixed port (the proxy listens on the same one)")
    host = net.address(node, peer) if method == NETEM else "127.0.0.1"
    service = net.start(node, module, [*args, "--host", host, "--port", str(port)],
                        timeout=timeout, env=env, name=name, echo=echo)
    ep = Endpoint(net, node, peer, port, method, service)
    ep.set_rtt(rtt_ms, jitter_ms)
    return ep
