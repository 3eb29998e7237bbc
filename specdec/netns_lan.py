"""Hosts on one LAN on one machine: a network namespace per node, all on one bridge.

specdec.netns joins namespaces point to point, one /30 per pair, with no forwarding. A
cluster wants a LAN instead: every node one address that every other node reaches, the
address its default route leaves from (Ray takes its node IP from the route to 8.8.8.8,
and a raylet must be reachable at that address by the other nodes and by its drivers).

`Lan(nodes)` makes one namespace per node (specdec-<pid>-<n>-<node>) and a switch
namespace (specdec-<pid>-<n>-lan) holding a Linux bridge, so no firewall of the host sees
the bridged traffic (a fresh namespace has no netfilter rules). Each node has one veth
into the bridge, the address .2, .3, ... of a /24 picked for the run, and a default route
via the root namespace, which is on the LAN too (.1): the caller reaches every node and
every node reaches the caller. Nodes reach each other over the bridge, as hosts on one
switch do.

Names: each node gets /etc/netns/<ns>/hosts, which `ip netns exec` mounts over
/etc/hosts for the processes it starts (and their children: a raylet's workers too).
`set_hosts(node, {"specdec-target": [ip, ...]})` rewrites it in place, so the system
resolver in that node answers the new records at its next lookup: a headless Service's
DNS records, as replicas come and go, for a coordinator's `dns:NAME:PORT` address list.

    with Lan(["head", "worker"]) as lan:
        lan.address("head")                       # e.g. 10.64.7.2
        proc = lan.popen("head", ["ray", "start", "--head", "--block", ...])
        svc = lan.start("worker", "target_service", [...])   # once ready

Teardown (on exit, failure included): processes started here are stopped, then the
namespaces and their /etc/netns folders are deleted (the veths go with them). The next
Lan or Network deletes what a killed run left behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from specdec import launcher
from specdec.netns import (
    _STALE,
    PREFIX,
    NetnsError,
    _alive,
    _counter,
    _ip,
    _pick_subnet,
    cleanup_stale,
    ip_binary,
    namespaces_permitted,
)

log = logging.getLogger(__name__)

ETC_NETNS = Path("/etc/netns")
BASE_HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"


def _remove_stale_etc() -> None:
    """/etc/netns folders a killed run left (specdec-<pid>-... whose pid is gone)."""
    if not ETC_NETNS.is_dir():
        return
    for folder in ETC_NETNS.iterdir():
        m = _STALE.match(folder.name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(folder, ignore_errors=True)


class Lan:
    """Namespaces for `nodes` on one bridged /24 with the root namespace; a context
    manager that builds them on entry and removes everything on exit."""

    def __init__(self, nodes: Sequence[str]):
        if len(set(nodes)) != len(nodes) or "lan" in nodes:
            raise ValueError(f"node names must be distinct and not 'lan': {list(nodes)}")
        self.nodes = list(nodes)
        self.tag = f"{os.getpid()}-{next(_counter)}"
        self.root_dev = f"sdl{self.tag}"[:15]
        self._addresses: dict[str, str] = {}
        self.root_ip = ""
        self._records: dict[str, dict] = {}
        self._stack = ExitStack()

    # -- names and addresses ---------------------------------------------------------

    def ns(self, node: str) -> str:
        return f"{PREFIX}{self.tag}-{node}"

    def prefix(self, node: str) -> list[str]:
        return [ip_binary() or "ip", "netns", "exec", self.ns(node)]

    def address(self, node: str) -> str:
        """`node`'s address on the LAN (every node and the caller reach it)."""
        return self._addresses[node]

    # -- building and teardown -------------------------------------------------------

    def __enter__(self) -> Lan:
        ok, why = namespaces_permitted()
        if not ok:
            raise NetnsError(f"network namespaces are not available: {why}")
        cleanup_stale()
        _remove_stale_etc()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        subnet = _pick_subnet(os.getpid() + int(self.tag.split("-")[1]) * 4099)
        hosts = [str(h) for h in subnet.hosts()]
        switch = self.ns("lan")
        for ns in [switch] + [self.ns(n) for n in self.nodes]:
            _ip("netns", "add", ns)
            self._stack.callback(_ip, "netns", "del", ns, check=False)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        # The root namespace's port: created in root, its peer moved into the switch.
        _ip("link", "add", self.root_dev, "type", "veth", "peer", "name", "root",
            "netns", switch)
        self._stack.callback(_ip, "link", "del", self.root_dev, check=False)
        self.root_ip = hosts[0]
        _ip("-n", switch, "link", "set", "root", "master", "br0", "up")
        _ip("addr", "add", f"{self.root_ip}/24", "dev", self.root_dev)
        _ip("link", "set", self.root_dev, "up")
        for i, node in enumerate(self.nodes, start=1):
            ns, port = self.ns(node), f"n{i}"
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            self._addresses[node] = hosts[i]
            _ip("-n", ns, "addr", "add", f"{hosts[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.root_ip)
            folder = ETC_NETNS / ns
            folder.mkdir(parents=True, exist_ok=True)
            self._stack.callback(shutil.rmtree, folder, ignore_errors=True)
            self._records[node] = {}
            self.set_hosts(node, {})
        log.info("lan %s: %s on %s (root %s)", self.tag, ", ".join(
            f"{n}={a}" for n, a in self._addresses.items()), subnet, self.root_ip)

    def close(self) -> None:
        """Stop what was started here, then delete the namespaces (idempotent)."""
        self._stack.close()

    # -- names -----------------------------------------------------------------------

    def set_hosts(self, node: str, records: dict[str, Sequence[str]]) -> None:
        """`node`'s /etc/hosts from now on: each name resolves to its addresses (a
        name with none is absent), and the machine's host name to the node's own address
        (as on a real host: without it, every look-up of it waits for a DNS server the
        namespace cannot reach). Written in place: the bind mount follows the inode."""
        self._records[node] = {name: list(ips) for name, ips in records.items()}
        own = f"{self.address(node)} {socket.gethostname()}\n"
        lines = [BASE_HOSTS, own] + [f"{ip} {name}\n" for name, ips in records.items()
                                     for ip in ips]
        with open(ETC_NETNS / self.ns(node) / "hosts", "w") as f:
            f.write("".join(lines))

    # -- running things inside -------------------------------------------------------

    def start(self, node: str, module: str, args: Sequence[str], timeout: float = 120.0,
              env: dict | None = None, name: str | None = None,
              echo: bool = False) -> launcher.ServiceProcess:
        """`python -m module args` in `node`, once ready (its ready line); stopped
        (SIGTERM) at teardown unless stopped before."""
        proc = launcher.start(module, args, timeout=timeout, echo=echo, env=env,
                              name=name or f"{module}@{node}", prefix=self.prefix(node))
        self._stack.callback(proc.stop)
        return proc

    def popen(self, node: str, argv: Sequence[str], env: dict | None = None,
              **kwargs) -> subprocess.Popen:
        """Any command in `node` (in its own process group), killed at teardown if it is
        still running."""
        proc = subprocess.Popen([*self.prefix(node), *argv], start_new_session=True,
                                env={**os.environ, **(env or {})}, **kwargs)

        def stop() -> None:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

        self._stack.callback(stop)
        return proc

    def run(self, node: str, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(argv) in `node`."""
        return subprocess.run([*self.prefix(node), *argv], **kwargs)
