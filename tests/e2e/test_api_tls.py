"""TLS on every hop through a real Ray Serve coordinator: mutual TLS to the model services,
mutual TLS on the client API's gRPC port and HTTPS port (coordinator.deploy.front), real
certificates from specdec.certs, and plaintext or strangers refused on every port."""

from __future__ import annotations

import socket
import ssl
import time

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from specdec import certs
from specdec.client import Client, SpecdecAPIError
from specdec.tls import client_tls
from specdec.v1 import generate_pb2, generate_pb2_grpc
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig
from tests.e2e.conftest import sessions_released, start_coordinator

pytestmark = pytest.mark.slow

HOSTS = ["127.0.0.1", "localhost"]
OPTIONS = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel
KEY = "tls-test-key-" + "x" * 16
AUTH = [("authorization", f"Bearer {KEY}")]


def _serve(create, cfg):
    server, port, engine = create(cfg)
    server.start()
    return server, f"127.0.0.1:{port}", engine


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """Draft and target with mTLS, a coordinator with mTLS to them and mTLS on its client
    API; yields a dict of addresses, certificate paths and engines."""
    good = certs.make_dev_certs(tmp_path_factory.mktemp("pki"), HOSTS, days=2)
    other = certs.make_dev_certs(tmp_path_factory.mktemp("stranger"), HOSTS, days=2,
                                 roles=("client",))
    ca = str(good["ca"][0])

    def fields(role):
        return {"tls_cert": str(good[role][0]), "tls_key": str(good[role][1]),
                "tls_client_ca": ca}

    draft, d_addr, d_engine = _serve(create_draft, DraftConfig(
        model="tiny-random-draft", port=0, max_sessions=8, **fields("draft")))
    target, t_addr, t_engine = _serve(create_target, TargetConfig(
        model="tiny-random", port=0, max_sessions=8, **fields("target")))
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"tester:{KEY}\n")
    proc, port, http_port = start_coordinator([
        "--api-keys", str(keys),
        "--draft", d_addr, "--target", t_addr, "--max-concurrency", "4",
        "--tls-ca", ca, "--tls-cert", str(good["coordinator-client"][0]),
        "--tls-key", str(good["coordinator-client"][1]),
        "--api-tls-cert", str(good["coordinator"][0]),
        "--api-tls-key", str(good["coordinator"][1]), "--api-tls-client-ca", ca])
    yield {"address": f"127.0.0.1:{port}", "http": f"https://127.0.0.1:{http_port}",
           "http_port": http_port, "port": port, "draft": d_addr, "target": t_addr,
           "good": good, "other": other, "ca": ca, "engines": (d_engine, t_engine)}
    output = proc.output
    assert proc.stop() == 0, output[-3000:]
    draft.stop(0)
    target.stop(0)


def _client(secure, role="client", pki="good") -> Client:
    crt, key = secure[pki][role]
    return Client(secure["address"], timeout=60, channel_options=OPTIONS, metadata=AUTH,
                  tls=client_tls(secure["ca"], str(crt), str(key)))


def _httpx(secure, pki="good") -> httpx.Client:
    crt, key = secure[pki]["client"]
    ctx = ssl.create_default_context(cafile=secure["ca"])
    ctx.load_cert_chain(str(crt), str(key))
    return httpx.Client(base_url=secure["http"], verify=ctx, timeout=60,
                        headers={"authorization": f"Bearer {KEY}"})


def test_generation_over_tls_equals_target_only(secure):
    with _client(secure) as client:
        spec = client.generate("Hello there", max_new_tokens=12, num_draft_tokens=4)
        plain = client.generate("Hello there", max_new_tokens=12, num_draft_tokens=0)
        streamed = list(client.stream("Hello there", max_new_tokens=12, num_draft_tokens=4))
    assert spec.token_ids == plain.token_ids and len(spec.token_ids) == 12
    assert tuple(t for c in streamed for t in c.token_ids) == tuple(spec.token_ids)
    assert spec.stats.drafted_tokens > 0  # the draft was used, over mTLS


def test_plaintext_is_refused_on_every_port(secure):
    request = generate_pb2.GenerateRequest(prompt="Hi", max_new_tokens=2)
    for address in (secure["address"], secure["draft"], secure["target"]):
        with grpc.insecure_channel(address, options=OPTIONS) as channel:
            with pytest.raises(grpc.RpcError) as err:
                generate_pb2_grpc.GeneratorStub(channel).Generate(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, address
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the HTTPS port: no answer
        httpx.get(f"http://127.0.0.1:{secure['http_port']}/health", timeout=5)


def test_client_api_refuses_no_certificate_and_a_strangers(secure):
    # No client certificate: the handshake fails.
    no_cert = Client(secure["address"], timeout=10, channel_options=OPTIONS,
                     tls=client_tls(secure["ca"]))
    with no_cert, pytest.raises(SpecdecAPIError) as err:
        no_cert.generate("Hi", max_new_tokens=2)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    # A certificate from another CA.
    with _client(secure, pki="other") as stranger, pytest.raises(SpecdecAPIError) as err:
        stranger.generate("Hi", max_new_tokens=2)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(httpx.HTTPError), _httpx(secure, pki="other") as http:
        http.get("/health")
    # And the right one still works on both.
    with _httpx(secure) as http:
        assert http.get("/health").status_code == 200


def test_https_api_with_the_openai_client(secure):
    with _httpx(secure) as http:
        client = openai.OpenAI(base_url=secure["http"] + "/v1", api_key=KEY,
                               http_client=http)
        model = client.models.list().data[0].id
        out = client.completions.create(model=model, prompt="Hello there", max_tokens=8,
                                        temperature=0)
        assert out.usage.completion_tokens == 8
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
            temperature=0, stream=True))
        assert sum(len(c.choices[0].delta.content or "") for c in chunks if c.choices) > 0
        assert "specdec" in http.get("/demo").text  # the demo page over HTTPS


def test_health_and_cancel_through_the_tls_front(secure):
    crt, key = secure["good"]["client"]
    creds = grpc.ssl_channel_credentials(open(secure["ca"], "rb").read(),
                                         open(key, "rb").read(), open(crt, "rb").read())
    with grpc.secure_channel(secure["address"], creds, options=OPTIONS) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stream = generate_pb2_grpc.GeneratorStub(channel).GenerateStream(
            generate_pb2.GenerateRequest(prompt="Once", max_new_tokens=400,
                                         num_draft_tokens=4), timeout=60, metadata=AUTH)
        next(stream)
        stream.cancel()
    assert sessions_released(*secure["engines"], within_s=5)


def test_the_api_key_is_checked_through_the_front(secure):
    crt, key = secure["good"]["client"]
    keyless = Client(secure["address"], timeout=10, channel_options=OPTIONS,
                     tls=client_tls(secure["ca"], str(crt), str(key)))
    with keyless, pytest.raises(SpecdecAPIError) as err:
        keyless.generate("Hi", max_new_tokens=2)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer" in str(err.value)
    with _httpx(secure) as http:
        r = http.get("/v1/models", headers={"authorization": "Bearer wrong-key-0000000000"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_bad_input_keeps_its_status_through_the_front(secure):
    with _client(secure) as client, pytest.raises(SpecdecAPIError) as err:
        client.generate("Hi", max_new_tokens=2, temperature=-1.0)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature" in str(err.value)


def test_a_garbage_handshake_does_not_stop_the_front(secure):
    for port in (secure["port"], secure["http_port"]):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
            s.settimeout(5)
            try:
                s.recv(1024)
            except (TimeoutError, ConnectionError):
                pass
    time.sleep(0.2)
    with _client(secure) as client:
        assert len(client.generate("Hi", max_new_tokens=3).token_ids) == 3


def test_specdec_generate_over_tls(secure, capsys):
    from specdec.cli import main

    crt, key = secure["good"]["client"]
    args = ["generate", "Hello there", "--max-new-tokens", "5", "--address",
            secure["address"], "--tls-ca", secure["ca"], "--json", "--api-key", KEY]
    assert main(args + ["--tls-cert", str(crt), "--tls-key", str(key)]) == 0
    assert '"tokenIds"' in capsys.readouterr().out
    assert main(args) == 1  # no client certificate: refused, and said so
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_bytes_that_do_not_parse_are_invalid_argument_through_the_front(secure):
    crt, key = secure["good"]["client"]
    creds = grpc.ssl_channel_credentials(open(secure["ca"], "rb").read(),
                                         open(key, "rb").read(), open(crt, "rb").read())
    with grpc.secure_channel(secure["address"], creds, options=OPTIONS) as channel:
        for method, call in (("Generate", channel.unary_unary),
                             ("GenerateStream", channel.unary_stream)):
            rpc = call(f"/specdec.v1.Generator/{method}")  # raw bytes in and out
            with pytest.raises(grpc.RpcError) as err:
                result = rpc(b"\x0a\xff\xff\xff", timeout=10, metadata=AUTH)
                list(result) if method == "GenerateStream" else result
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert "not a valid protobuf message" in err.value.details()
    with _client(secure) as client:  # and the front still serves
        assert len(client.generate("Hi", max_new_tokens=3).token_ids) == 3
