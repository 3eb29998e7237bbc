"""Separate hosts on one machine: Linux network namespaces joined by veth pairs.

`Network(nodes, links)` makes one network namespace per node (named
specdec-<pid>-<n>-<node>, so parallel runs never clash), brings loopback up in each, and
joins the pairs in `links` with a veth pair each: point to point, one /30 per link out of a
/24 chosen for the run (10.64.0.0/10, skipping any the root namespace already routes).
The node "root" is the root namespace (where the caller runs); a link to it lets the
caller reach a node. There is no bridge and no forwarding: a node reaches only the nodes
it has a link to, every hop crosses a real network stack (veth, IP, TCP), and a node
without a link to another cannot reach it at all.

    with Network(["coord", "draft"], [("coord", "draft"), ("root", "coord")]) as net:
        net.address("draft", "coord")   # draft's IP on its link to coord
        net.start("draft", "draft_service", [...])   # ip netns exec <ns> python -m ...
        net.run("coord", ["ip", "addr"])

`default_routes={"coord": "root"}` adds a default route in a node via that link. Ray needs
one: it takes its node IP from the route to 8.8.8.8 and, without any, from the host name,
which may resolve to an address the namespace does not have.

Latency: `net.set_rtt(a, b, rtt_ms, jitter_ms)` puts half the RTT on each end's egress with
the netem qdisc, where the kernel has it (`netem_available()`); otherwise
specdec_tools.netns.services puts a specdec_tools.delay_proxy in front of each service.

Teardown (on exit, failure included): the processes started here are stopped, then the
namespaces deleted, which deletes their veth ends and so the root's. A run killed before
its teardown leaves namespaces behind; the next Network deletes those whose pid is gone.
`namespaces_permitted()` says whether this can work here (root, `ip`, veth, no seccomp or
user-namespace refusal) and, if not, why, for tests to skip with.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from specdec import launcher

log = logging.getLogger(__name__)

ROOT = "root"
PREFIX = "specdec-"
_STALE = re.compile(rf"^{PREFIX}(\d+)-")
_POOL = ipaddress.ip_network("10.64.0.0/10")
ETC_NETNS = Path("/etc/netns")  # `ip netns exec NS` mounts /etc/netns/NS/* over /etc/*
_counter = itertools.count()


class NetnsError(RuntimeError):
    """An `ip`/`tc` command failed; the message says which and why."""


def ip_binary() -> str | None:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.path.exists(p)), None)


def _cmd(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    run = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and run.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (exit {run.returncode}): "
                         f"{(run.stderr or run.stdout).strip()}")
    return run


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _cmd([ip_binary() or "ip", *args], check)


@functools.lru_cache(maxsize=1)
def namespaces_permitted() -> tuple[bool, str]:
    """(True, "") if this process can make network namespaces with veth pairs, else
    (False, why): not root, no `ip`, or the kernel/container refusing (EPERM ...)."""
    if os.environ.get("SPECDEC_NO_NETNS"):
        return False, "SPECDEC_NO_NETNS is set"
    if not os.path.exists("/proc/self/ns/net"):
        return False, "no network namespaces here (not Linux?)"
    if os.geteuid() != 0:
        return False, "making network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    if ip_binary() is None:
        return False, "the `ip` command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe-{next(_counter)}"
    try:
        _ip("netns", "add", probe)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot create a network namespace: {exc}"
    try:
        _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        _ip("-n", probe, "link", "set", "lo", "up")
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot create a veth pair in a network namespace: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return True, ""


@functools.lru_cache(maxsize=1)
def netem_available() -> bool:
    """Whether `tc qdisc ... netem` works (a kernel with sch_netem); probed on the loopback
    of a throwaway namespace. False where namespaces are not permitted or tc is missing."""
    if not namespaces_permitted()[0] or shutil.which("tc") is None:
        return False
    probe = f"{PREFIX}{os.getpid()}-probe-{next(_counter)}"
    try:
        _ip("netns", "add", probe)
        run = _ip("netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                  "delay", "1ms", check=False)
        if run.returncode != 0:
            log.info("no netem here (%s): delays go through specdec_tools.delay_proxy",
                     run.stderr.strip())
        return run.returncode == 0
    except NetnsError:
        return False
    finally:
        _ip("netns", "del", probe, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete the namespaces an earlier run left (specdec-<pid>-... whose pid is gone),
    and the /etc/netns folders such a run made for them (specdec_tools.netns.lan)."""
    if ETC_NETNS.is_dir():
        for folder in ETC_NETNS.iterdir():
            m = _STALE.match(folder.name)
            if m and not _alive(int(m.group(1))):
                shutil.rmtree(folder, ignore_errors=True)
    names = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines()
             if line.strip()]
    gone = [n for n in names if (m := _STALE.match(n)) and not _alive(int(m.group(1)))]
    for name in gone:
        pids = _ip("netns", "pids", name, check=False).stdout.split()
        log.warning("deleting network namespace %s left by an earlier run%s", name,
                    f" (processes {', '.join(pids)} still run in it: not killed here; the "
                    "namespace lasts until they exit)" if pids else "")
        _ip("netns", "del", name, check=False)
    return gone


def _used_networks() -> list:
    out = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for word in _ip(*args, check=False).stdout.split():
            try:
                out.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    return [n for n in out if n.prefixlen > 0]


def _pick_subnet(seed: int) -> ipaddress.IPv4Network:
    blocks = list(_POOL.subnets(new_prefix=24))
    used = _used_networks()
    for i in range(len(blocks)):
        block = blocks[(seed + i) % len(blocks)]
        if not any(block.overlaps(n) for n in used):
            return block
    raise NetnsError(f"no free /24 left in {_POOL} for a test network")


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    a_dev: str
    b_dev: str
    a_ip: str
    b_ip: str
    prefix_len: int = 30

    def end(self, node: str) -> tuple[str, str]:
        """(device, IP) of `node`'s end."""
        return (self.a_dev, self.a_ip) if node == self.a else (self.b_dev, self.b_ip)


class Namespaces:
    """What every set of namespaces here shares: names (specdec-<pid>-<n>-<node>), a
    context manager that builds them on entry (after deleting what killed runs left) and
    removes everything on exit, and running processes inside. Subclasses build."""

    def __init__(self, nodes: Sequence[str]):
        self.nodes = list(nodes)
        self.run_id = next(_counter)
        self.tag = f"{os.getpid()}-{self.run_id}"
        self._stack = ExitStack()

    def ns(self, node: str) -> str | None:
        """The namespace's name (None for ROOT)."""
        return None if node == ROOT else f"{PREFIX}{self.tag}-{node}"

    def prefix(self, node: str) -> list[str]:
        """The command prefix that runs a command in `node`'s namespace."""
        return [] if node == ROOT else [ip_binary() or "ip", "netns", "exec", self.ns(node)]

    def __enter__(self):
        ok, why = namespaces_permitted()
        if not ok:
            raise NetnsError(f"network namespaces are not available: {why}")
        cleanup_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        raise NotImplementedError

    @staticmethod
    def _delete_ns(name: str) -> None:
        run = _ip("netns", "del", name, check=False)
        if run.returncode != 0:
            log.warning("could not delete network namespace %s: %s", name, run.stderr.strip())

    def close(self) -> None:
        """Stop what was started here, then delete the namespaces (idempotent)."""
        self._stack.close()

    def start(self, node: str, module: str, args: Sequence[str], timeout: float = 120.0,
              env: dict | None = None, name: str | None = None,
              echo: bool = False) -> launcher.ServiceProcess:
        """`python -m module args` in `node`'s namespace, once ready (its ready line);
        stopped (SIGTERM) when the namespaces close, before they go."""
        proc = launcher.start(module, args, timeout=timeout, echo=echo, env=env,
                              name=name or f"{module}@{node}", prefix=self.prefix(node))
        self._stack.callback(proc.stop)
        log.info("netns: %s ready in %s at %s", name or module, node, proc.address)
        return proc

    def run(self, node: str, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(argv) in `node`'s namespace."""
        return subprocess.run([*self.prefix(node), *argv], **kwargs)


class Network(Namespaces):
    """Namespaces for `nodes` joined by `links` (pairs of nodes, ROOT allowed); a context
    manager that builds them on entry and removes everything on exit."""

    def __init__(self, nodes: Sequence[str], links: Sequence[tuple[str, str]],
                 default_routes: dict[str, str] | None = None):
        for a, b in links:
            for node in (a, b):
                if node != ROOT and node not in nodes:
                    raise ValueError(f"link {a}-{b}: {node!r} is not one of the nodes")
        super().__init__(nodes)
        self.pairs = [tuple(x) for x in links]
        self.default_routes = dict(default_routes or {})
        self.links: list[Link] = []
        self.subnet: ipaddress.IPv4Network | None = None

    # -- names and addresses ---------------------------------------------------------

    def link(self, a: str, b: str) -> Link:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        raise KeyError(f"no link between {a} and {b}")

    def address(self, node: str, peer: str) -> str:
        """`node`'s IP on its link to `peer` (where `peer` reaches it)."""
        return self.link(node, peer).end(node)[1]

    def addresses(self) -> list[str]:
        return [ip for link in self.links for ip in (link.a_ip, link.b_ip)]

    # -- building --------------------------------------------------------------------

    def _build(self) -> None:
        # Runs at once have nearby pids: consecutive pids get different /24s.
        self.subnet = _pick_subnet(os.getpid() + self.run_id * 4099)
        for node in self.nodes:
            _ip("netns", "add", self.ns(node))
            self._stack.callback(self._delete_ns, self.ns(node))
            _ip("-n", self.ns(node), "link", "set", "lo", "up")
        slots = self.subnet.subnets(new_prefix=30)
        for i, (a, b) in enumerate(self.pairs):
            net = next(slots)
            a_ip, b_ip = (str(h) for h in list(net.hosts())[:2])
            # A root end needs a name unique on the machine; a namespace's only in it.
            a_dev = f"sd{os.getpid()}.{self.run_id}.{i}" if a == ROOT else f"to-{b}"[:15]
            b_dev = f"sd{os.getpid()}.{self.run_id}.{i}" if b == ROOT else f"to-{a}"[:15]
            if len(a_dev) > 15 or len(b_dev) > 15:
                raise NetnsError(f"interface name {a_dev!r} or {b_dev!r} is over 15 characters")
            _ip("link", "add", a_dev, *self._netns_arg(a), "type", "veth",
                "peer", "name", b_dev, *self._netns_arg(b))
            link = Link(a, b, a_dev, b_dev, a_ip, b_ip)
            self.links.append(link)
            if ROOT in (a, b):
                self._stack.callback(_ip, "link", "del", a_dev if a == ROOT else b_dev,
                                     check=False)
            for node in (a, b):
                dev, addr = link.end(node)
                self._in(node, "addr", "add", f"{addr}/30", "dev", dev)
                self._in(node, "link", "set", dev, "up")
            log.info("netns link %s (%s %s) <-> %s (%s %s)", a, a_dev, a_ip, b, b_dev, b_ip)
        for node, via in self.default_routes.items():
            self._in(node, "route", "add", "default", "via", self.address(via, node))
        log.info("netns: namespaces %s in %s", ", ".join(self.ns(n) for n in self.nodes),
                 self.subnet)

    def _netns_arg(self, node: str) -> list[str]:
        return [] if node == ROOT else ["netns", self.ns(node)]

    def _in(self, node: str, *args: str) -> subprocess.CompletedProcess:
        return _ip(*([] if node == ROOT else ["-n", self.ns(node)]), *args)

    # -- latency on a link -----------------------------------------------------------

    def set_rtt(self, a: str, b: str, rtt_ms: float, jitter_ms: float = 0.0) -> None:
        """netem on both ends of the a-b link: RTT/2 (+ jitter/2) each way; 0 removes it.
        NetnsError where the kernel has no netem (see netem_available()). netem's jitter
        delays each packet on its own, so it may reorder packets (TCP puts them back)."""
        link = self.link(a, b)
        for node in (a, b):
            dev = link.end(node)[0]
            if rtt_ms <= 0 and jitter_ms <= 0:
                self._in_tc(node, "qdisc", "del", "dev", dev, "root", check=False)
                continue
            delay = [f"{rtt_ms / 2:g}ms"] + ([f"{jitter_ms / 2:g}ms"] if jitter_ms > 0 else [])
            self._in_tc(node, "qdisc", "replace", "dev", dev, "root", "netem", "delay", *delay)
        log.info("netem: %s <-> %s RTT %g ms (jitter %g ms)", a, b, rtt_ms, jitter_ms)

    def _in_tc(self, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _cmd([*self.prefix(node), "tc", *args], check)
