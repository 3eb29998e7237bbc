"""specdec_tools.netns.lan: hosts on one bridged LAN, reachable from each other and from the
caller, with per-host /etc/hosts records that change while processes run; nothing left
behind. Skipped, with the reason, where network namespaces cannot be made."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdec_tools.netns.lan import ETC_NETNS, Lan
from specdec_tools.netns.network import namespaces_permitted

PERMITTED, WHY = namespaces_permitted()
pytestmark = pytest.mark.skipif(not PERMITTED, reason=f"no network namespaces: {WHY}")

ECHO = ("import socket\ns=socket.create_server(('0.0.0.0',7))\nprint('up',flush=True)\n"
        "while True:\n c,_=s.accept(); c.sendall(c.recv(16)); c.close()")


def _ask(lan: Lan, node: str, host: str) -> str:
    code = f"import socket\ns=socket.create_connection(({host!r},7),timeout=5)\n" \
           "s.sendall(b'hi'); print(s.recv(16).decode())"
    cmd = [sys.executable, "-c", code]
    run = subprocess.run(cmd if node == "root" else [*lan.prefix(node), *cmd],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_hosts_reach_each_other_and_the_caller_and_resolve_names_that_change():
    with Lan(["a", "b"]) as lan:
        names = {lan.ns("a"), lan.ns("b"), lan.ns("lan")}
        server = lan.popen("b", [sys.executable, "-c", ECHO], stdout=subprocess.PIPE,
                           text=True)
        assert server.stdout.readline().strip() == "up"
        assert _ask(lan, "a", lan.address("b")) == "hi"  # host to host, over the bridge
        assert _ask(lan, "root", lan.address("b")) == "hi"  # the caller is on the LAN
        lan.set_hosts("a", {"specdec-target": [lan.address("b")]})
        assert _ask(lan, "a", "specdec-target") == "hi"  # the record, from inside a
        lan.set_hosts("a", {"specdec-target": []})  # the record goes, in place
        # (read, not resolved: an absent name would wait for a DNS server the host
        # cannot reach)
        hosts = lan.run("a", ["cat", "/etc/hosts"], capture_output=True, text=True).stdout
        assert "specdec-target" not in hosts and "localhost" in hosts
        own = lan.run("a", [sys.executable, "-c", "import socket; print(socket."
                            "gethostbyname(socket.gethostname()))"],
                      capture_output=True, text=True)
        assert own.stdout.strip() == lan.address("a")  # its host name is its address
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)
    assert not any((ETC_NETNS / n).exists() for n in names)
