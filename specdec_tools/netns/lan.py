"""Hosts on one LAN on one machine: a network namespace per node, all on one bridge.

specdec_tools.netns.network joins namespaces point to point, one /30 per pair, with no forwarding. A
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

from specdec_tools.netns.network import (
    ETC_NETNS,
    Namespaces,
    _ip,
    _pick_subnet,
)

log = logging.getLogger(__name__)

BASE_HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"


class Lan(Namespaces):
    """Namespaces for `nodes` on one bridged /24 with the root namespace; a context
    manager that builds them on entry and removes everything on exit."""

    def __init__(self, nodes: Sequence[str]):
        if len(set(nodes)) != len(nodes) or "lan" in nodes:
            raise ValueError(f"node names must be distinct and not 'lan': {list(nodes)}")
        super().__init__(nodes)
        self.root_dev = f"sdl{self.tag}"[:15]
        self._addresses: dict[str, str] = {}
        self.root_ip = ""

    def address(self, node: str) -> str:
        """`node`'s address on the LAN (every node and the caller reach it)."""
        return self._addresses[node]

    def _build(self) -> None:
        subnet = _pick_subnet(os.getpid() + self.run_id * 4099)
        hosts = [str(h) for h in subnet.hosts()]
        switch = self.ns("lan")
        for ns in [switch] + [self.ns(n) for n in self.nodes]:
            _ip("netns", "add", ns)
            self._stack.callback(self._delete_ns, ns)
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
            self.set_hosts(node, {})
        log.info("lan %s: %s on %s (root %s)", self.tag, ", ".join(
            f"{n}={a}" for n, a in self._addresses.items()), subnet, self.root_ip)

    # -- names -----------------------------------------------------------------------

    def set_hosts(self, node: str, records: dict[str, Sequence[str]]) -> None:
        """`node`'s /etc/hosts from now on: each name resolves to its addresses (a
        name with none is absent), and the machine's host name to the node's own address
        (as on a real host: without it, every look-up of it waits for a DNS server the
        namespace cannot reach). Written in place: the bind mount follows the inode."""
        own = f"{self.address(node)} {socket.gethostname()}\n"
        lines = [BASE_HOSTS, own] + [f"{ip} {name}\n" for name, ips in records.items()
                                     for ip in ips]
        with open(ETC_NETNS / self.ns(node) / "hosts", "w") as f:
            f.write("".join(lines))

    # -- running things inside -------------------------------------------------------

    def popen(self, node: str, argv: Sequence[str], env: dict | None = None,
              **kwargs) -> subprocess.Popen:
        """Any command in `node` (in its own process group), stopped at teardown if it is
        still running (`stop_group`)."""
        proc = subprocess.Popen([*self.prefix(node), *argv], start_new_session=True,
                                env={**os.environ, **(env or {})}, **kwargs)
        self._stack.callback(stop_group, proc)
        return proc


def stop_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM a `Lan.popen` process's whole group, SIGKILL it after `timeout` seconds;
    nothing if it has exited."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
