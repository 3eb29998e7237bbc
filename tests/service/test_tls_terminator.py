"""specdec.tls_proxy.TLSTerminator with real sockets and certificates: TLS to a plaintext
backend, rotation picked up by new connections, a half-done rotation skipped, plaintext
and strangers refused."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import threading
import time

import pytest
from cryptography import x509

from specdec import certs
from specdec.tls import ServerTLS
from specdec.tls_proxy import TLSTerminator

HOSTS = ["127.0.0.1"]


class Loop:
    """An event loop in a thread, for the backend and the terminator."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _backend(reader, writer):
    """Answers every request with the bytes it got, as an HTTP/1.0 body."""
    data = await reader.read(4096)
    writer.write(b"HTTP/1.0 200 OK\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
    await writer.drain()
    writer.close()


@pytest.fixture()
def running(tmp_path):
    pki = certs.make_dev_certs(tmp_path / "pki", HOSTS, days=2,
                               roles=("coordinator", "client"))
    loop = Loop()
    backend = loop.run(asyncio.start_server(_backend, "127.0.0.1", 0))
    backend_port = backend.sockets[0].getsockname()[1]

    def start(client_ca: bool):
        crt, key = pki["coordinator"]
        tls = ServerTLS(str(crt), str(key), str(pki["ca"][0]) if client_ca else "")
        term = TLSTerminator(tls, "127.0.0.1", backend_port)
        port = loop.run(term.start("127.0.0.1", 0))
        return term, port

    yield pki, start, tmp_path
    loop.close()


def _get(port: int, ca, pair=None) -> tuple[bytes, int]:
    """(response, serial of the server's certificate) over TLS."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if pair is not None:
        ctx.load_cert_chain(str(pair[0]), str(pair[1]))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET /x HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        serial = x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).serial_number
    return data, serial


def _refused(port: int, ca, pair=None) -> bool:
    """The terminator ended the connection without a backend answer. (In TLS 1.3 the
    client's handshake can finish before the server has checked its certificate, so the
    refusal may show only when reading.)"""
    try:
        data, _ = _get(port, ca, pair)
    except (ssl.SSLError, ConnectionError, ValueError):
        return True
    return data == b""


def test_tls_in_front_of_a_plaintext_backend(running):
    pki, start, _ = running
    _term, port = start(client_ca=False)
    data, _ = _get(port, pki["ca"][0])
    assert data.startswith(b"HTTP/1.0 200 OK") and data.endswith(b"GET /x HTTP/1.0\r\n\r\n")


def test_plaintext_and_strangers_are_refused(running, tmp_path):
    pki, start, _ = running
    term, port = start(client_ca=True)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert s.recv(4096) == b""  # aborted: no HTTP answer in plaintext
    assert _refused(port, pki["ca"][0])  # no client certificate
    stranger = certs.make_dev_certs(tmp_path / "stranger", HOSTS, days=2, roles=("client",))
    assert _refused(port, pki["ca"][0], stranger["client"])
    # With TLS 1.3 the client may see the refusal before the server's handler has
    # counted it: wait for the count, briefly.
    deadline = time.monotonic() + 5
    while term.handshake_failures < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert term.handshake_failures >= 3
    data, _ = _get(port, pki["ca"][0], pki["client"])  # still serving the right client
    assert data.startswith(b"HTTP/1.0 200 OK")


def test_rotation_reaches_new_connections_and_half_done_ones_are_skipped(running):
    pki, start, tmp_path = running
    term, port = start(client_ca=False)
    _, first = _get(port, pki["ca"][0])
    # A half-done rotation: a new certificate whose key has not arrived (old key kept).
    old_key = tmp_path / "old.key"
    shutil.copy(pki["coordinator"][1], old_key)
    rotated = certs.make_dev_certs(tmp_path / "pki", HOSTS, days=2, roles=("coordinator",))
    shutil.copy(old_key, rotated["coordinator"][1])
    _, during = _get(port, pki["ca"][0])
    assert during == first  # the mismatched pair was not used
    # The key arrives: the next connection gets the new certificate, with no restart.
    certs.make_dev_certs(tmp_path / "pki", HOSTS, days=2, roles=("coordinator",))
    _, after = _get(port, pki["ca"][0])
    assert after != first and term.tls.reloads == 1
