"""Draft, target and coordinator on "separate hosts": each in its own network namespace
(specdec_tools.netns.network), joined by veth links, mTLS between the coordinator and both model
services, 10 ms of RTT added on both links (netem or specdec_tools.delay_proxy). Greedy
speculative output equals target-only output and the same request's output on plain
loopback; a client in another namespace without a client certificate is refused.

Topology (one /30 per link; root is where pytest runs):

    root --- coord --- draft
               \\------ target

Skipped, with the reason, where network namespaces cannot be made (not root, no `ip`,
a container that refuses them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import grpc
import pytest

from specdec import certs, launcher
from specdec.pair import TINY_PAIR
from specdec.v1 import generate_pb2, generate_pb2_grpc
from specdec_tools.netns.network import ROOT, NetnsError, Network, namespaces_permitted
from specdec_tools.netns.services import start_service

PERMITTED, WHY = namespaces_permitted()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not PERMITTED, reason=f"no network namespaces: {WHY}")]

RTT_MS = 10.0
PROMPT = [7, 77, 177, 277]
N = 48
PORTS = {"draft": 50051, "target": 50052}
COORD_PORT = 50050


def request(k: int) -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(prompt_token_ids=PROMPT, max_new_tokens=N,
                                        num_draft_tokens=k)


def loopback_outputs() -> dict[int, list[int]]:
    """The same requests with draft and target as in-process servers on 127.0.0.1 and the
    coordinator loop in this process: {k: token ids}."""
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from draft_service.__main__ import create as create_draft
    from draft_service.config import DraftConfig
    from target_service.__main__ import create as create_target
    from target_service.config import TargetConfig

    draft, d_port, _ = create_draft(DraftConfig(model=TINY_PAIR.draft.model, port=0))
    target, t_port, _ = create_target(TargetConfig(model=TINY_PAIR.target.model, port=0))
    draft.start()
    target.start()
    try:
        service = build_service(CoordinatorConfig(draft=f"127.0.0.1:{d_port}",
                                                  target=f"127.0.0.1:{t_port}"))
        return {k: list(service.generate(request(k)).token_ids) for k in (0, 4)}
    finally:
        draft.stop(0)
        target.stop(0)


# -- the harness on its own (first: nothing else runs beside them) ------------------------

def test_a_network_is_gone_after_its_block_even_on_failure():
    def names() -> set[str]:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return {line.split()[0] for line in out.splitlines() if line.strip()}

    with pytest.raises(RuntimeError, match="on purpose"), \
            Network(["a", "b"], [("a", "b"), (ROOT, "a")]) as net:
        made = {net.ns("a"), net.ns("b")}
        assert made <= names()
        root_dev = net.link(ROOT, "a").a_dev
        raise RuntimeError("on purpose")
    assert not made & names()
    assert subprocess.run(["ip", "link", "show", root_dev], capture_output=True).returncode != 0
    with pytest.raises(ValueError, match="not one of the nodes"):
        Network(["a"], [("a", "z")])
    assert issubclass(NetnsError, RuntimeError)


def test_a_plain_link_between_namespaces_adds_no_delay_of_its_own():
    """The RTT the tests below measure is the one added: a bare veth link between two
    namespaces answers in well under it."""
    def client(ip: str) -> str:
        return (f"import socket,time\ns=socket.create_connection(({ip!r},7))\nbest=9\n"
                "for _ in range(20):\n t=time.perf_counter();s.sendall(b'x');s.recv(1)\n"
                " best=min(best,time.perf_counter()-t)\nprint(best)")

    with Network(["a", "b"], [("a", "b")]) as net:
        server = subprocess.Popen(
            [*net.prefix("b"), sys.executable, "-c",
             "import socket\ns=socket.create_server(('0.0.0.0',7))\nprint('up',flush=True)\n"
             "c,_=s.accept()\nwhile d:=c.recv(1): c.sendall(d)"],
            stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "up"
            run = net.run("a", [sys.executable, "-c", client(net.address("b", "a"))],
                          capture_output=True, text=True, timeout=30)
            assert run.returncode == 0, run.stderr
            assert float(run.stdout) < RTT_MS / 1000 / 2  # the best of 20 round trips
        finally:
            server.kill()
            server.wait()


def test_the_rtt_sweep_adds_its_rtt_between_namespaces():
    """specdec_tools.bench.rtt with a pair: its own target and draft in namespaces, the RTT on
    the links (not the coordinator's sleeps), and every token of target-only decoding
    pays it."""
    from specdec_tools.bench import rtt

    rows = rtt.sweep("unused:1", "unused:2", [0, 20], ["Hello there"], 4, 8, pair=TINY_PAIR,
                     pin=False, say=print)
    assert [r.rtt_ms for r in rows] == [0, 20]
    assert {r.method for r in rows} == {"network namespaces, delay proxy on each link"} or \
        {r.method for r in rows} == {"network namespaces, netem on each link"}
    # 8 tokens, one Verify each, 20 ms per call: under 50 tokens/s whatever the load (a
    # comparison with the 0 ms row is the bench's to make: under load it went either way)
    assert rows[1].target_only_tokens_per_s < 50
    text = rtt.markdown(rows, 4)
    assert "RTT added by: network namespaces" in text
    assert rtt.choose_method(None) == (
        "sleeps", "no pair to start in namespaces was given (sweep(..., pair=...))")


# -- three hosts: draft, target, coordinator -------------------------------------------

@pytest.fixture(scope="module")
def hosts():
    """The three namespaces with their services up; a dict of what the tests need."""
    with ExitStack() as stack:
        net = stack.enter_context(Network(
            ["coord", "draft", "target"],
            [("coord", "draft"), ("coord", "target"), (ROOT, "coord")],
            default_routes={"coord": ROOT}))  # Ray takes its node IP from the default route
        tmp = tempfile.mkdtemp(prefix="sdnetns")  # short: Ray's socket paths live under it
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        ips = {role: net.address(role, "coord") for role in ("draft", "target")}
        pki = certs.make_dev_certs(f"{tmp}/certs", [*ips.values(), "127.0.0.1"], days=1)
        ca = str(pki["ca"][0])

        def model_service(role: str):
            spec = getattr(TINY_PAIR, role)
            crt, key = pki[role]
            return start_service(net, role, "coord", spec.module,
                                 [*spec.args(), "--tls-cert", str(crt), "--tls-key", str(key),
                                  "--tls-client-ca", ca],
                                 PORTS[role], rtt_ms=RTT_MS, timeout=180, name=role)

        with ThreadPoolExecutor(2) as pool:
            started = {role: pool.submit(model_service, role) for role in ("draft", "target")}
            loopback = loopback_outputs()  # meanwhile, here
            endpoints = {role: f.result() for role, f in started.items()}
        crt, key = pki["coordinator-client"]
        coord_ip = net.address("coord", ROOT)
        coordinator = net.start(
            "coord", "coordinator",
            ["--draft", endpoints["draft"].address, "--target", endpoints["target"].address,
             "--host", coord_ip, "--port", str(COORD_PORT), "--http-port", "0",
             "--max-concurrency", "4", "--tls-ca", ca, "--tls-cert", str(crt),
             "--tls-key", str(key)],
            timeout=240, env={"TMPDIR": tmp}, name="coordinator")
        yield dict(net=net, endpoints=endpoints, coordinator=coordinator, pki=pki,
                   loopback=loopback)
        assert coordinator.stop() == 0, coordinator.output[-3000:]


def test_speculative_across_namespaces_equals_target_only_and_loopback(hosts):
    ep = hosts["endpoints"]
    assert {e.method for e in ep.values()} <= {"netem", "delay proxy"}
    assert all(e.rtt_ms == RTT_MS for e in ep.values())
    with grpc.insecure_channel(hosts["coordinator"].address) as channel:
        stub = generate_pb2_grpc.GeneratorStub(channel)
        base = stub.Generate(request(0), timeout=60)
        spec = stub.Generate(request(4), timeout=60)
    assert list(spec.token_ids) == list(base.token_ids)
    assert list(spec.token_ids) == hosts["loopback"][4] == hosts["loopback"][0]
    assert len(spec.token_ids) == N
    assert set(base.kinds) == {generate_pb2.TOKEN_KIND_TARGET}
    assert spec.stats.drafted_tokens > 0  # the draft in its namespace did draft
    assert spec.stats.accepted_tokens > 0


# Run in the coordinator's namespace: Info from a model service without a client
# certificate (refused?) and with the coordinator's (accepted, and how long it takes).
PROBE = r"""
import json, sys, time
import grpc
from specdec.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc
a = json.loads(sys.argv[1])
read = lambda p: open(p, "rb").read()
stub_of = {"draft": draft_pb2_grpc.DraftServiceStub, "target": target_pb2_grpc.TargetServiceStub}
opts = [("grpc.use_local_subchannel_pool", 1)]
out = {}
for role, address in a["services"].items():
    plain = grpc.ssl_channel_credentials(read(a["ca"]))
    try:
        stub_of[role](grpc.secure_channel(address, plain, opts)).Info(
            common_pb2.InfoRequest(), timeout=5)
        refused = None
    except grpc.RpcError as e:
        refused = e.code().name
    mine = grpc.ssl_channel_credentials(read(a["ca"]), read(a["key"]), read(a["cert"]))
    stub = stub_of[role](grpc.secure_channel(address, mine, opts))
    model = stub.Info(common_pb2.InfoRequest(), timeout=10).model_id
    t0 = time.perf_counter()
    for _ in range(5):
        stub.Info(common_pb2.InfoRequest(), timeout=10)
    out[role] = {"refused": refused, "model": model, "info_s": (time.perf_counter() - t0) / 5}
print(json.dumps(out))
"""


def test_a_client_without_a_certificate_is_refused_from_another_namespace(hosts):
    crt, key = hosts["pki"]["coordinator-client"]
    args = {"services": {r: e.address for r, e in hosts["endpoints"].items()},
            "ca": str(hosts["pki"]["ca"][0]), "cert": str(crt), "key": str(key)}
    run = hosts["net"].run("coord", [sys.executable, "-c", PROBE, json.dumps(args)],
                           capture_output=True, text=True, timeout=60, cwd=launcher.ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    for role in ("draft", "target"):
        assert result[role]["refused"] == "UNAVAILABLE", result
        assert result[role]["model"] == getattr(TINY_PAIR, role).model
        # The added RTT is on the path: every call pays it.
        assert result[role]["info_s"] >= 0.95 * RTT_MS / 1000, result
