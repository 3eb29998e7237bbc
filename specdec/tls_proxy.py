"""A TLS terminator for HTTP: TLS (optionally mutual) on a public port, plaintext bytes to a
backend on loopback. The coordinator puts it in front of Ray Serve's HTTP proxy, which
cannot reload certificates or ask for client certificates.

Certificates come from a specdec.tls.ServerTLS, which checks its files before every
accepted connection (stat only) and reloads them when they changed and still form a valid
pair; the terminator builds a new ssl.SSLContext after each reload, so new connections get
the new certificate and open ones keep theirs, with no restart. The handshake happens after
accept (StreamWriter.start_tls), so the context is chosen per connection. ALPN offers only
http/1.1: Serve's HTTP proxy (uvicorn) speaks HTTP/1.1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile

from specdec.tls import ServerTLS

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
CHUNK = 64 * 1024


def ssl_context(cert_pem: bytes, key_pem: bytes, ca_pem: bytes | None,
                alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
    """A server-side SSLContext from PEM bytes (mutual when `ca_pem` is given). The key
    passes through a private temporary file: the ssl module loads keys only from files."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="specdec-tls-") as tmp:
        path = os.path.join(tmp, "pair.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(cert_pem.rstrip(b"\n") + b"\n" + key_pem)
        ctx.load_cert_chain(path)
    if ca_pem is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
    ctx.set_alpn_protocols(list(alpn))
    return ctx


class TLSTerminator:
    """Accepts on (host, port), does the TLS handshake, and pipes the plaintext to
    (backend_host, backend_port). Runs on the event loop that calls `start`."""

    def __init__(self, tls: ServerTLS, backend_host: str, backend_port: int):
        self.tls = tls
        self.backend = (backend_host, backend_port)
        self._ctx = None
        self._built_at = -1  # tls.reloads when _ctx was built
        self._server: asyncio.base_events.Server | None = None
        self.handshake_failures = 0

    def context(self) -> ssl.SSLContext:
        """The SSLContext for the next connection, rebuilt when the files changed."""
        self.tls.fetch()  # reloads if the files changed and are valid (never raises)
        if self._ctx is None or self._built_at != self.tls.reloads:
            cert_pem, key_pem, ca_pem = self.tls.contents
            self._ctx = ssl_context(cert_pem, key_pem, ca_pem)
            self._built_at = self.tls.reloads
        return self._ctx

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound (useful with port 0)."""
        self.context()  # unusable files fail now, not at the first client
        self._server = await asyncio.start_server(self._accept, host, port)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        peer = writer.get_extra_info("peername")
        try:
            await writer.start_tls(self.context(), ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except (TimeoutError, ssl.SSLError, OSError, ConnectionError) as exc:
            # A plaintext client, a client certificate from another CA, a port scan.
            self.handshake_failures += 1
            log.info("TLS handshake with %s failed: %s", peer, exc)
            writer.transport.abort()
            return
        try:
            b_reader, b_writer = await asyncio.open_connection(*self.backend)
        except OSError as exc:
            log.warning("cannot reach the HTTP backend %s:%d: %s", *self.backend, exc)
            writer.transport.abort()
            return
        await asyncio.gather(_pipe(reader, b_writer), _pipe(b_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF or an error, then close the writer (which ends the other side)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError, ssl.SSLError):
        pass
    finally:
        try:
            writer.close()
        except (OSError, RuntimeError):
            pass
