"""TLS and mutual TLS between the coordinator and the model services: real servers on
loopback ports, real certificates made by specdec.certs, real handshakes (no mocks)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.config import from_args as coordinator_args
from coordinator.deploy.setup import build_service
from coordinator.remote.clients import TargetClient
from coordinator.remote.routing import DnsAddresses, Router, StaticAddresses
from draft_service.__main__ import create as create_draft
from draft_service.__main__ import main as draft_main
from draft_service.config import DraftConfig
from draft_service.config import from_args as draft_args
from specdec import certs, tls
from specdec.cli import main as cli_main
from specdec.v1 import common_pb2, draft_pb2_grpc, generate_pb2, target_pb2_grpc
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig
from tests.service.conftest import propose_req, verify_req

HOSTS = ["127.0.0.1", "localhost"]
# Each test channel its own connection: gRPC shares subchannels between channels with the
# same arguments, and a test about handshakes must make its own.
OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """`good`: the CA and certificates specdec uses; `other`: a stranger's CA, with a
    client certificate of its own."""
    good = certs.make_dev_certs(tmp_path_factory.mktemp("good"), HOSTS, days=2)
    other = certs.make_dev_certs(tmp_path_factory.mktemp("other"), HOSTS, days=2,
                                 roles=("coordinator-client",))
    return good, other


def _serve(create, cfg):
    server, port, _engine = create(cfg)
    server.start()
    return server, f"127.0.0.1:{port}"


def _tls_fields(pki, role: str, mutual: bool = True) -> dict:
    good, _ = pki
    crt, key = good[role]
    return {"tls_cert": str(crt), "tls_key": str(key),
            "tls_client_ca": str(good["ca"][0]) if mutual else ""}


@pytest.fixture(scope="module")
def mtls(pki):
    """A draft and a target that require a client certificate from the good CA."""
    draft, d_addr = _serve(create_draft, DraftConfig(model="tiny-random-draft", port=0,
                                                     max_sessions=8,
                                                     **_tls_fields(pki, "draft")))
    target, t_addr = _serve(create_target, TargetConfig(model="tiny-random", port=0,
                                                        max_sessions=8,
                                                        **_tls_fields(pki, "target")))
    yield {"draft": d_addr, "target": t_addr, "servers": (draft, target)}
    draft.stop(0)
    target.stop(0)


def credentials(ca: Path, pair: tuple[Path, Path] | None = None) -> grpc.ChannelCredentials:
    cert, key = pair if pair is not None else (None, None)
    return grpc.ssl_channel_credentials(
        ca.read_bytes(), key.read_bytes() if key else None,
        cert.read_bytes() if cert else None)


def info(channel, role: str, timeout: float = 5.0) -> common_pb2.ModelInfo:
    stub = (draft_pb2_grpc.DraftServiceStub if role == "draft"
            else target_pb2_grpc.TargetServiceStub)(channel)
    return stub.Info(common_pb2.InfoRequest(), timeout=timeout)


def refused(channel, role: str) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        info(channel, role)
    return e.value.code()


# -- who gets in ---------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["draft", "target"])
def test_plaintext_client_is_refused(mtls, role):
    with grpc.insecure_channel(mtls[role], options=OPTIONS) as channel:
        assert refused(channel, role) == UNAVAILABLE


@pytest.mark.parametrize("role", ["draft", "target"])
def test_tls_client_without_a_client_certificate_is_refused(mtls, pki, role):
    good, _ = pki
    with grpc.secure_channel(mtls[role], credentials(good["ca"][0]), OPTIONS) as channel:
        assert refused(channel, role) == UNAVAILABLE


@pytest.mark.parametrize("role", ["draft", "target"])
def test_client_certificate_from_another_ca_is_refused(mtls, pki, role):
    good, other = pki
    creds = credentials(good["ca"][0], other["coordinator-client"])
    with grpc.secure_channel(mtls[role], creds, OPTIONS) as channel:
        assert refused(channel, role) == UNAVAILABLE


def test_client_that_does_not_trust_the_servers_ca_is_refused(mtls, pki):
    good, other = pki
    creds = credentials(other["ca"][0], good["coordinator-client"])
    with grpc.secure_channel(mtls["target"], creds, OPTIONS) as channel:
        assert refused(channel, "target") == UNAVAILABLE


def test_the_right_client_certificate_gets_info_propose_and_verify(mtls, pki):
    good, _ = pki
    creds = credentials(good["ca"][0], good["coordinator-client"])
    with grpc.secure_channel(mtls["draft"], creds, OPTIONS) as d_ch, \
            grpc.secure_channel(mtls["target"], creds, OPTIONS) as t_ch:
        assert info(d_ch, "draft").model_id == "tiny-random-draft"
        assert info(t_ch, "target").model_id == "tiny-random"
        prompt = [5, 6, 7, 8]
        proposal = draft_pb2_grpc.DraftServiceStub(d_ch).Propose(
            propose_req("tls-1", prompt, k=3), timeout=10)
        assert len(proposal.tokens) == 3
        verdict = target_pb2_grpc.TargetServiceStub(t_ch).Verify(
            verify_req("tls-1", prompt + list(proposal.tokens), num_draft=3), timeout=10)
        assert len(verdict.target_probs) == 3
        for stub in (draft_pb2_grpc.DraftServiceStub(d_ch),
                     target_pb2_grpc.TargetServiceStub(t_ch)):
            assert stub.Release(common_pb2.ReleaseRequest(session_id="tls-1"),
                                timeout=5).released


def test_health_and_reflection_over_mtls_on_the_same_port(mtls, pki):
    good, _ = pki
    creds = credentials(good["ca"][0], good["coordinator-client"])
    with grpc.secure_channel(mtls["draft"], creds, OPTIONS) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "specdec.v1.DraftService"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (response,) = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([request]), timeout=5)
        names = {s.name for s in response.list_services_response.service}
        assert {"specdec.v1.DraftService", "grpc.health.v1.Health"} <= names
    with grpc.insecure_channel(mtls["draft"], options=OPTIONS) as channel:
        with pytest.raises(grpc.RpcError) as e:  # no plaintext way around it, health too
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                      timeout=5)
        assert e.value.code() == UNAVAILABLE


# -- the coordinator -----------------------------------------------------------------------

def greedy_ids(service, prompt: list[int], n: int = 48, k: int = 4) -> list[int]:
    req = generate_pb2.GenerateRequest(prompt_token_ids=prompt, max_new_tokens=n,
                                       num_draft_tokens=k)
    return list(service.generate(req).token_ids)


def test_coordinator_over_mtls_generates_what_it_generates_over_plaintext(
        mtls, pki, draft_server, target_server):
    good, _ = pki
    (cert, key), ca = good["coordinator-client"], good["ca"][0]
    secure = build_service(CoordinatorConfig(
        draft=mtls["draft"], target=mtls["target"], tls_ca=str(ca), tls_cert=str(cert),
        tls_key=str(key), startup_timeout=10))
    plain = build_service(CoordinatorConfig(draft=draft_server[0], target=target_server[0],
                                            startup_timeout=10))
    for prompt in ([3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8]):
        ids = greedy_ids(secure, prompt)
        assert len(ids) == 48
        assert ids == greedy_ids(plain, prompt)
    # It speculated over TLS: the draft was asked.
    assert secure.loop.draft.replicas()[0].client.bytes.sent > 0


def test_coordinator_with_a_stranger_client_certificate_fails_to_start_clearly(mtls, pki):
    good, other = pki
    cert, key = other["coordinator-client"]
    with pytest.raises(ConnectionError, match="TLS settings"):
        build_service(CoordinatorConfig(target=mtls["target"], tls_ca=str(good["ca"][0]),
                                        tls_cert=str(cert), tls_key=str(key),
                                        startup_timeout=1))


def test_router_renews_its_channels_when_the_client_certificate_rotates(mtls, pki, tmp_path):
    """A rotated client certificate reaches replicas the router already has: the old
    channel would keep presenting the old certificate on every reconnect."""
    good, other = pki
    mine = tmp_path / "coordinator-client"
    shutil.copy(other["coordinator-client"][0], f"{mine}.crt")  # not trusted by the servers
    shutil.copy(other["coordinator-client"][1], f"{mine}.key")
    client_tls = tls.ClientTLS(str(good["ca"][0]), f"{mine}.crt", f"{mine}.key")
    router = Router(StaticAddresses([mtls["target"]]), lambda ch: TargetClient(ch, 5),
                    tls=client_tls)
    (replica,) = router.replicas()
    with pytest.raises(grpc.RpcError) as e:
        replica.client.info()
    assert e.value.code() == UNAVAILABLE
    # The rotation: the trusted pair, each file renamed into place (key first).
    shutil.copy(good["coordinator-client"][1], f"{mine}.key.new")
    os.replace(f"{mine}.key.new", f"{mine}.key")
    shutil.copy(good["coordinator-client"][0], f"{mine}.crt.new")
    os.replace(f"{mine}.crt.new", f"{mine}.crt")
    (replica,) = router.replicas()  # a refresh, as every generation makes
    assert replica.client.info().model_id == "tiny-random"


def test_replicas_found_by_dns_are_checked_against_the_dns_name(mtls, pki):
    """A pod is dialled by IP; its certificate names the headless Service. The router
    checks that name: one the certificate does not carry is refused."""
    good, _ = pki
    (cert, key), ca = good["coordinator-client"], good["ca"][0]
    address = mtls["target"]
    port = int(address.rsplit(":", 1)[1])

    def router(name: str) -> Router:
        source = DnsAddresses(name, port, resolver=lambda host, p: [address])
        return Router(source, lambda ch: TargetClient(ch, 5),
                      tls=tls.ClientTLS(str(ca), str(cert), str(key)))

    (replica,) = router("specdec-target").replicas()  # in the target's certificate
    assert replica.client.info().model_id == "tiny-random"
    (replica,) = router("specdec-elsewhere").replicas()
    with pytest.raises(grpc.RpcError) as e:
        replica.client.info()
    assert e.value.code() == UNAVAILABLE


# -- reloading -----------------------------------------------------------------------------

def peer_serial(address: str, ca: Path) -> int:
    """The serial of the certificate a server presents to a new connection."""
    host, port = address.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname=host) as conn:
        der = conn.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def test_server_certificate_reloads_without_a_restart(pki, tmp_path):
    good, _ = pki
    ca = good["ca"][0]
    folder = tmp_path / "live"
    folder.mkdir()
    for suffix, source in ((".crt", good["draft"][0]), (".key", good["draft"][1])):
        shutil.copy(source, folder / f"draft{suffix}")
    cert, key = folder / "draft.crt", folder / "draft.key"
    server, address = _serve(create_draft, DraftConfig(
        model="tiny-random-draft", port=0, max_sessions=4, tls_cert=str(cert),
        tls_key=str(key)))
    try:
        first = x509.load_pem_x509_certificate(cert.read_bytes()).serial_number
        assert peer_serial(address, ca) == first
        old = grpc.secure_channel(address, credentials(ca), OPTIONS)
        assert info(old, "draft").model_id == "tiny-random-draft"

        # A new CA signs the new certificate: only clients trusting it can connect now.
        new_ca = certs.make_ca(days=2)
        (tmp_path / "new-ca.crt").write_bytes(new_ca.cert_pem())
        issued = certs.issue(new_ca, "specdec-draft", HOSTS, days=2)
        # Half a rotation (the new key, the old certificate) is not served: the old pair is.
        certs.write_file(key, issued.key_pem(), 0o600)
        assert peer_serial(address, ca) == first
        certs.write_file(cert, issued.cert_pem(), 0o644)

        assert peer_serial(address, tmp_path / "new-ca.crt") == issued.cert.serial_number
        with grpc.secure_channel(address, credentials(tmp_path / "new-ca.crt"),
                                 OPTIONS) as channel:
            assert info(channel, "draft").model_id == "tiny-random-draft"
        with grpc.secure_channel(address, credentials(ca), OPTIONS) as channel:
            assert refused(channel, "draft") == UNAVAILABLE
        assert server.tls.reloads == 1
        # The connection made before the rotation is still up.
        assert info(old, "draft").model_id == "tiny-random-draft"
        old.close()
    finally:
        server.stop(0)


# -- start-up errors -----------------------------------------------------------------------

def test_unusable_tls_files_are_clear_start_up_errors(pki, tmp_path):
    good, _ = pki
    (d_crt, d_key), t_key, ca = good["draft"], good["target"][1], good["ca"][0]
    with pytest.raises(ValueError, match="no such file"):
        tls.server_tls(str(tmp_path / "missing.crt"), str(d_key))
    with pytest.raises(ValueError, match="does not match certificate"):
        tls.server_tls(str(d_crt), str(t_key))
    (tmp_path / "junk.pem").write_text("hello\n")
    with pytest.raises(ValueError, match="not a PEM file"):
        tls.server_tls(str(d_crt), str(d_key), str(tmp_path / "junk.pem"))
    unreadable = tmp_path / "unreadable.key"
    shutil.copy(d_key, unreadable)
    unreadable.chmod(0)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(ValueError, match="cannot read"):
            tls.server_tls(str(d_crt), str(unreadable))
    with pytest.raises(ValueError, match="--tls-cert and --tls-key"):
        tls.server_tls(client_ca=str(ca))
    with pytest.raises(ValueError, match="--tls-cert and --tls-key"):
        tls.client_tls(str(ca), cert=str(d_crt))
    with pytest.raises(ValueError, match="needs TLS"):
        tls.client_tls(server_name="specdec-target")
    assert tls.server_tls() is None and tls.client_tls() is None  # plaintext by default
    # The service exits with status 2 at once, before loading its model.
    assert draft_main(["--model", "no-such-model", "--port", "0", "--tls-cert", str(d_crt),
                       "--tls-key", str(t_key)]) == 2


def test_tls_flags_reach_the_configs(tmp_path):
    cfg = draft_args(["--model", "m", "--tls-cert", "c.pem", "--tls-key", "k.pem",
                      "--tls-client-ca", "ca.pem"])
    assert (cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) == ("c.pem", "k.pem", "ca.pem")
    assert draft_args(["--model", "m"]).tls_cert == ""
    cfg = coordinator_args(["--tls-ca", "ca.pem", "--tls-cert", "c.pem", "--tls-key",
                            "k.pem", "--tls-server-name", "specdec-target"])
    assert (cfg.tls_ca, cfg.tls_cert, cfg.tls_key, cfg.tls_server_name) == \
        ("ca.pem", "c.pem", "k.pem", "specdec-target")
    assert CoordinatorConfig(**cfg.to_dict()) == cfg  # what Serve's replicas get


# -- specdec certs -------------------------------------------------------------------------

def test_specdec_certs_writes_a_ca_and_verifiable_certificates(tmp_path, capsys):
    out = tmp_path / "certs"
    assert cli_main(["certs", "--out", str(out), "--hosts",
                     "127.0.0.1,localhost,specdec.example", "--days", "3"]) == 0
    printed = capsys.readouterr().out
    assert f"--tls-client-ca {out / 'ca.crt'}" in printed
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    expected = {"draft": ExtendedKeyUsageOID.SERVER_AUTH,
                "target": ExtendedKeyUsageOID.SERVER_AUTH,
                "coordinator": ExtendedKeyUsageOID.SERVER_AUTH,
                "coordinator-client": ExtendedKeyUsageOID.CLIENT_AUTH,
                "client": ExtendedKeyUsageOID.CLIENT_AUTH}
    serials = {}
    for role, usage in expected.items():
        crt, key = out / f"{role}.crt", out / f"{role}.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, role
        assert str(crt) in printed
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        cert.verify_directly_issued_by(ca)  # raises if not signed by the CA
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) \
            == [usage]
        tls.check_pair(crt.read_bytes(), key.read_bytes(), str(crt), str(key))
        serials[role] = cert.serial_number
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == \
                {"127.0.0.1"}
            dns = san.get_values_for_type(x509.DNSName)
            assert {"localhost", "specdec.example", f"specdec-{role}",
                    f"specdec-{role}.specdec.svc.cluster.local"} <= set(dns)
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    # Again over the same folder: the same CA, new certificates (a rotation).
    ca_bytes = (out / "ca.crt").read_bytes()
    assert cli_main(["certs", "--out", str(out), "--days", "3"]) == 0
    assert (out / "ca.crt").read_bytes() == ca_bytes
    again = x509.load_pem_x509_certificate((out / "draft.crt").read_bytes())
    assert again.serial_number != serials["draft"]
    again.verify_directly_issued_by(ca)
