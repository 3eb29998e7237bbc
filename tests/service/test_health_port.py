"""--health-port: a model service with mutual TLS still answers plaintext health probes
(Kubernetes' gRPC probes cannot do TLS) on a port that serves nothing else."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec import certs
from specdec.v1 import draft_pb2, draft_pb2_grpc
from tests.procs import start_service
from tests.service._metrics_helpers import free_port

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _check(address: str, service: str = "", wait: bool = False) -> int:
    """One probe. `wait`: keep trying to connect for up to 10 s, as a kubelet's probe
    retries (once, in CI, the first probe after the ready line was refused)."""
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10 if wait else 5,
            wait_for_ready=wait).status


def test_health_port_answers_in_plaintext_and_serves_nothing_else(tmp_path):
    pki = certs.make_dev_certs(tmp_path, ["127.0.0.1"], days=2, roles=("draft",))
    health_port = free_port()
    proc = start_service("draft_service", "--model", "tiny-random-draft",
                         "--tls-cert", str(pki["draft"][0]), "--tls-key", str(pki["draft"][1]),
                         "--tls-client-ca", str(pki["ca"][0]),
                         "--health-port", str(health_port), "--grace", "3")
    health = f"127.0.0.1:{health_port}"
    try:
        assert f"health-port={health_port}" in proc.output
        assert _check(health, wait=True) == SERVING
        assert _check(health, "specdec.v1.DraftService") == SERVING
        # The TLS port refuses a plaintext caller, and the health port has no model RPC.
        for address in (proc.address, health):
            with grpc.insecure_channel(address) as channel:
                with pytest.raises(grpc.RpcError) as err:
                    draft_pb2_grpc.DraftServiceStub(channel).Propose(
                        draft_pb2.ProposeRequest(session_id="s"), timeout=5)
            expected = grpc.StatusCode.UNAVAILABLE if address == proc.address \
                else grpc.StatusCode.UNIMPLEMENTED
            assert err.value.code() == expected, address
        # SIGTERM: the probe stops seeing SERVING (NOT_SERVING while the service drains,
        # then no answer once it has exited; with nothing in flight the drain is short).
        proc.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        status = SERVING
        while time.monotonic() < deadline and status == SERVING:
            try:
                status = _check(health)
            except grpc.RpcError as e:
                status = e.code()
            time.sleep(0.02)
        # A probe in flight as the server closes its connections ends CANCELLED (seen
        # once in make test); it is "no answer" too.
        assert status in (NOT_SERVING, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert proc.proc.wait(10) == 0, proc.output[-2000:]  # and it exits cleanly
    finally:
        if proc.proc.poll() is None:
            proc.stop()
