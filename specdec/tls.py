"""TLS material for specdec's gRPC hops: PEM files in, grpc credentials out.

Servers (the draft and target services): `ServerTLS(cert, key, client_ca)` checks its files
when it is made (readable, PEM, the key matches the certificate) and `credentials()` gives
grpc.dynamic_ssl_server_credentials. gRPC calls its fetcher before the handshake of every
new connection; the fetcher stats the files (mtime, size, inode: a rewrite, a rename over
them, or Kubernetes' symlink swap of a Secret volume, as cert-manager's renewals arrive)
and, when they changed and still form a valid pair, serves them from then on. No restart:
established connections keep the certificate they were handshaken with, new connections
get the new one. A half-done rotation (a new certificate whose key has not arrived yet, a
file missing for a moment) is logged once and skipped: the last good pair keeps serving
until the files agree. With `client_ca` every client must present a certificate signed by
that CA (mutual TLS); the CA bundle reloads the same way.

Clients (the coordinator): `ClientTLS(ca, cert, key, server_name)` reads and checks its
files when it is made. A grpc channel's credentials are fixed when the channel is made and
its reconnects reuse them, so a channel made before a rotation keeps presenting the old
client certificate for as long as it lives. `reload()` says whether the files changed (and
loaded them); the channel owner then makes new channels: coordinator.remote.routing.Router does
on its next refresh (every generation asks it), so the coordinator follows rotations too.

Names: a server's certificate must name what its clients dial (an IP such as 127.0.0.1, or
a DNS name). Where the dialled address is not that name (a pod IP found through a headless
Service), `server_name` (or the per-address name from the router) sets
grpc.ssl_target_name_override: the name checked against the certificate.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

log = logging.getLogger(__name__)

Signature = tuple  # (mtime_ns, size, inode) of each file, None for a missing one


# -- files ---------------------------------------------------------------------------------

def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file, or ValueError saying what is wrong with `path`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ValueError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path}: is a directory, not a PEM file") from None
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read it ({exc.strerror})") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{what} {path}: not a PEM file (no -----BEGIN line)")
    return data


def load_certificates(data: bytes, path: str, what: str) -> list:
    """The x509 certificates in a PEM bundle (ValueError if none or malformed)."""
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"{what} {path}: not a PEM certificate ({exc})") from None
    if not certs:
        raise ValueError(f"{what} {path}: holds no certificate")
    return certs


def _public_der(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def check_pair(cert_pem: bytes, key_pem: bytes, cert_path: str, key_path: str):
    """The leaf certificate of `cert_pem` if `key_pem` is its private key, else ValueError.
    Logs a warning for a certificate that is expired or not valid yet."""
    from cryptography.hazmat.primitives import serialization

    leaf = load_certificates(cert_pem, cert_path, "certificate")[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise ValueError(f"key {key_path}: is encrypted; specdec needs an unencrypted PEM "
                         "key (a mounted Secret)") from None
    except Exception as exc:  # noqa: BLE001 - ValueError, UnsupportedAlgorithm, ...
        raise ValueError(f"key {key_path}: not a PEM private key ({exc})") from None
    if _public_der(key.public_key()) != _public_der(leaf.public_key()):
        raise ValueError(f"key {key_path} does not match certificate {cert_path} (their "
                         "public keys differ: a key from another pair?)")
    now = datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc < now:
        log.warning("certificate %s expired at %s", cert_path, leaf.not_valid_after_utc)
    elif leaf.not_valid_before_utc > now:
        log.warning("certificate %s is not valid before %s", cert_path,
                    leaf.not_valid_before_utc)
    return leaf


def signature(paths: Sequence[str]) -> Signature:
    """What changes when any of the files changes: (mtime_ns, size, inode) each."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


def describe(cert) -> str:
    """'CN=draft, serial 1f2e..., valid until 2027-01-01' for logs."""
    return (f"{cert.subject.rfc4514_string()}, serial {cert.serial_number:x}, valid until "
            f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")


# -- servers -------------------------------------------------------------------------------

@dataclass
class ServerTLS:
    """A server's certificate and key, and for mTLS the CA its clients' certificates must
    chain to; reloaded when the files change (see the module docstring)."""

    cert: str
    key: str
    client_ca: str = ""  # "" = no client certificate asked for (TLS, not mTLS)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._contents, self._config, leaf = self._load()
        self._applied = self._failed = self._signature()
        self.leaf = leaf
        self.reloads = 0

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca)

    @property
    def contents(self) -> tuple[bytes, bytes, bytes | None]:
        """(certificate, key, client CA or None) PEM bytes, as last loaded."""
        return self._contents

    def _paths(self) -> list[str]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])

    def _signature(self) -> Signature:
        return signature(self._paths())

    def _load(self):
        cert_pem = read_pem(self.cert, "certificate")
        key_pem = read_pem(self.key, "key")
        leaf = check_pair(cert_pem, key_pem, self.cert, self.key)
        ca_pem = None
        if self.client_ca:
            ca_pem = read_pem(self.client_ca, "client CA")
            load_certificates(ca_pem, self.client_ca, "client CA")
        config = grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)], ca_pem)
        return (cert_pem, key_pem, ca_pem), config, leaf

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's certificate-configuration fetcher, called before every new connection's
        handshake: None (keep serving what it serves) or the configuration from files
        that changed. Must not raise (gRPC would log and keep the old one anyway)."""
        sig = self._signature()
        if sig == self._applied:
            return None
        with self._lock:
            if sig == self._applied:
                return None
            try:
                contents, config, leaf = self._load()
            except (OSError, ValueError) as exc:
                if sig != self._failed:
                    log.warning("TLS files changed but cannot be used yet, still serving "
                                "%s: %s", describe(self.leaf), exc)
                    self._failed = sig
                return None
            self._applied = sig
            if contents == self._contents:  # touched, not changed
                return None
            self._contents, self._config, self.leaf = contents, config, leaf
            self.reloads += 1
            log.info("TLS certificate reloaded from %s: %s (new connections use it)",
                     self.cert, describe(leaf))
            return config

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that reload (one fetcher call per new connection)."""
        return grpc.dynamic_ssl_server_credentials(
            self._config, self.fetch, require_client_authentication=self.mutual)

    def summary(self) -> str:
        mode = f"mTLS, client certificates from {self.client_ca}" if self.mutual else "TLS"
        return f"{mode}; certificate {self.cert}: {describe(self.leaf)}"


def add_server_tls_flags(p: argparse.ArgumentParser) -> None:
    """--tls-cert, --tls-key, --tls-client-ca (the model services)."""
    p.add_argument("--tls-cert", default="", metavar="PEM",
                   help="serve TLS with this certificate (chain) file; it must name the "
                        "hosts clients dial (IPs and/or DNS names). Reloaded when it changes "
                        "(new connections get the new one). Default: plaintext")
    p.add_argument("--tls-key", default="", metavar="PEM",
                   help="the private key of --tls-cert (unencrypted PEM)")
    p.add_argument("--tls-client-ca", default="", metavar="PEM",
                   help="mutual TLS: refuse every client without a certificate signed by "
                        "this CA bundle (e.g. only the coordinator). Needs --tls-cert")


@dataclass
class ServerTLSFields:
    """The server TLS fields of a service's configuration (flags: add_server_tls_flags)."""

    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""


def server_tls(cert: str = "", key: str = "", client_ca: str = "",
               flag: str = "--tls") -> ServerTLS | None:
    """ServerTLS from the three flags' values; None (plaintext) when none is given;
    ValueError for an incomplete set or an unusable file. `flag`: the flags' common
    prefix, for the message (`--tls` on the model services, `--api-tls` on the
    coordinator's client API)."""
    if not (cert or key or client_ca):
        return None
    if not (cert and key):
        raise ValueError(f"TLS needs both {flag}-cert and {flag}-key"
                         + (f" ({flag}-client-ca alone is not enough)" if client_ca else ""))
    return ServerTLS(cert, key, client_ca)


# -- clients -------------------------------------------------------------------------------

@dataclass
class ClientTLS:
    """What a client trusts (`ca`) and, for mTLS, the certificate it presents; see the
    module docstring for what happens when the files change."""

    ca: str = ""  # "" = gRPC's default roots
    cert: str = ""
    key: str = ""
    server_name: str = ""  # "" = the name in each dialled address (or the router's)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("a client certificate needs both --tls-cert and --tls-key")
        self._contents, self._credentials, self.leaf = self._load()
        self._applied = self._failed = signature(self._paths())

    @property
    def mutual(self) -> bool:
        return bool(self.cert)

    def _paths(self) -> list[str]:
        return [p for p in (self.ca, self.cert, self.key) if p]

    def _load(self):
        ca_pem = cert_pem = key_pem = leaf = None
        if self.ca:
            ca_pem = read_pem(self.ca, "CA bundle")
            load_certificates(ca_pem, self.ca, "CA bundle")
        if self.cert:
            cert_pem, key_pem = read_pem(self.cert, "certificate"), read_pem(self.key, "key")
            leaf = check_pair(cert_pem, key_pem, self.cert, self.key)
        creds = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)
        return (ca_pem, cert_pem, key_pem), creds, leaf

    def reload(self) -> bool:
        """True when the files changed and the new ones were loaded: channels made from
        now on use them (make new ones; old ones keep what they were made with)."""
        sig = signature(self._paths())
        if sig == self._applied:
            return False
        with self._lock:
            if sig == self._applied:
                return False
            try:
                contents, creds, leaf = self._load()
            except (OSError, ValueError) as exc:
                if sig != self._failed:
                    log.warning("client TLS files changed but cannot be used yet, keeping "
                                "the old ones: %s", exc)
                    self._failed = sig
                return False
            self._applied = sig
            if contents == self._contents:
                return False
            self._contents, self._credentials, self.leaf = contents, creds, leaf
            log.info("client TLS files reloaded%s",
                     f": {describe(leaf)}" if leaf is not None else "")
            return True

    def channel(self, address: str, options: Sequence[tuple] = (),
                server_name: str | None = None) -> grpc.Channel:
        """A TLS channel to `address` with the files as last loaded. The name checked
        against the server's certificate: `self.server_name`, else `server_name`, else
        the host in `address`."""
        return grpc.secure_channel(address, self._credentials,
                                   options=self._options(options, server_name))

    def aio_channel(self, address: str, options: Sequence[tuple] = (),
                    server_name: str | None = None) -> grpc.aio.Channel:
        """channel(), on grpc.aio."""
        return grpc.aio.secure_channel(address, self._credentials,
                                       options=self._options(options, server_name))

    def _options(self, options: Sequence[tuple], server_name: str | None) -> list:
        options = list(options)
        name = self.server_name or server_name
        if name:
            options.append(("grpc.ssl_target_name_override", name))
        return options

    def summary(self) -> str:
        mode = "mTLS" if self.mutual else "TLS"
        trust = self.ca or "the system's roots"
        who = f", client certificate {describe(self.leaf)}" if self.leaf is not None else ""
        name = f", server name {self.server_name}" if self.server_name else ""
        return f"{mode}: servers verified against {trust}{who}{name}"


def client_tls(ca: str = "", cert: str = "", key: str = "",
               server_name: str = "") -> ClientTLS | None:
    """ClientTLS from flag values; None (plaintext) when neither --tls-ca nor --tls-cert is
    given (a --tls-server-name or --tls-key alone is an error)."""
    if not (ca or cert or key):
        if server_name:
            raise ValueError("--tls-server-name needs TLS (--tls-ca and/or --tls-cert)")
        return None
    return ClientTLS(ca, cert, key, server_name)


def open_channel(address: str, options: Sequence[tuple] = (), tls: ClientTLS | None = None,
                 server_name: str | None = None) -> grpc.Channel:
    """Plaintext when `tls` is None, else `tls.channel(...)`."""
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    return tls.channel(address, options, server_name)
