"""`specdec certs`: a development CA and a certificate for every specdec role, signed by it.

For local runs and tests, not production (use cert-manager or your own PKI there). Keys are
ECDSA P-256, written unencrypted with mode 0600; every file is written to a temporary
name and renamed into place, so a service that reloads its files (specdec.tls) never sees
half a file. Running it again over the same folder keeps the CA (unless --new-ca) and
issues new certificates, a rotation every reloading service picks up.

Roles (name: files, extended key usage, SANs):
  draft, target       server certificates (serverAuth) for the model services
  coordinator-client  the coordinator's client certificate (clientAuth) for mTLS to them
  coordinator         a server certificate for the coordinator's client-facing ports
  client              a client certificate (clientAuth) for a user of the client API
Server certificates name every --hosts entry plus the role's Kubernetes Service names
(specdec-draft, specdec-draft.NAMESPACE, ...svc, ...svc.cluster.local).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOSTS = "127.0.0.1,localhost,::1"
DEFAULT_NAMESPACE = "specdec"
CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid from a little before now

# role -> (Kubernetes Service it is reached by or None, server?, client?)
ROLES: dict[str, tuple[str | None, bool, bool]] = {
    "draft": ("specdec-draft", True, False),
    "target": ("specdec-target", True, False),
    "coordinator-client": (None, False, True),
    "coordinator": ("specdec-coordinator", True, False),
    "client": (None, False, True),
}


@dataclass
class Issued:
    cert: object  # cryptography.x509.Certificate
    key: object  # an EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "specdec (development)"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(days: int = 3650, common_name: str = "specdec development CA") -> Issued:
    """A self-signed CA (may sign leaf certificates only: path length 0)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key, now = _new_key(), _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def _san(hosts: Sequence[str]):
    from cryptography import x509

    names = []
    for host in dict.fromkeys(h.strip() for h in hosts if h.strip()):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue(ca: Issued, common_name: str, hosts: Sequence[str] = (), server: bool = True,
          client: bool = False, days: int = 365) -> Issued:
    """A leaf certificate signed by `ca` for `hosts` (IPs and DNS names), with the extended
    key usages asked for (serverAuth, clientAuth)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if not (server or client):
        raise ValueError("a certificate must be for a server, a client or both")
    key, now = _new_key(), _now()
    not_after = min(now + datetime.timedelta(days=days), ca.cert.not_valid_after_utc)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
        ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca.cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                     key_agreement=False, content_commitment=False,
                                     data_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False,
                                     decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca.key.public_key()), critical=False)
    )
    names = list(hosts) or [common_name]
    builder = builder.add_extension(_san(names), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write `data` with `mode` via a temporary file renamed over `path` (atomic)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(tmp, path)


def write_pair(out: Path, name: str, issued: Issued) -> tuple[Path, Path]:
    """out/NAME.crt (0644) and out/NAME.key (0600); the key first, so a reloading service
    that sees the new certificate finds its key already in place."""
    crt, key = out / f"{name}.crt", out / f"{name}.key"
    write_file(key, issued.key_pem(), 0o600)
    write_file(crt, issued.cert_pem(), 0o644)
    return crt, key


def load_ca(out: Path) -> Issued | None:
    """The CA in out/ca.crt and out/ca.key, if both are there."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    crt, key = out / "ca.crt", out / "ca.key"
    if not (crt.exists() and key.exists()):
        return None
    return Issued(x509.load_pem_x509_certificate(crt.read_bytes()),
                  serialization.load_pem_private_key(key.read_bytes(), password=None))


def role_hosts(role: str, hosts: Sequence[str], namespace: str = DEFAULT_NAMESPACE
               ) -> list[str]:
    """SANs of a role's certificate: a server's = `hosts` + its Service's DNS names; a
    client's = its name."""
    service, server, _ = ROLES[role]
    if not server:
        return [f"specdec-{role}"]
    names = list(hosts)
    if service:
        names += [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
                  f"{service}.{namespace}.svc.cluster.local"]
    return names


def make_dev_certs(out: Path, hosts: Sequence[str] = tuple(DEFAULT_HOSTS.split(",")),
                   days: int = 365, namespace: str = DEFAULT_NAMESPACE,
                   roles: Sequence[str] = tuple(ROLES), new_ca: bool = False,
                   say: Callable[[str], None] = lambda _m: None) -> dict[str, tuple[Path, Path]]:
    """The CA (kept if out/ has one, unless `new_ca`) and each role's pair, in `out`;
    {"ca": (crt, key), role: (crt, key), ...}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    ca = None if new_ca else load_ca(out)
    if ca is None:
        ca = make_ca(max(days, 3650))
        paths = {"ca": write_pair(out, "ca", ca)}
        say(f"wrote a new CA: {paths['ca'][0]} (key {paths['ca'][1]}), valid until "
            f"{ca.cert.not_valid_after_utc:%Y-%m-%d}")
    else:
        paths = {"ca": (out / "ca.crt", out / "ca.key")}
        say(f"kept the CA in {paths['ca'][0]} (pass --new-ca for a new one)")
    for role in roles:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        _, server, client = ROLES[role]
        names = role_hosts(role, hosts, namespace)
        issued = issue(ca, f"specdec-{role}", names, server=server, client=client, days=days)
        paths[role] = write_pair(out, role, issued)
        use = "+".join(u for u, on in (("serverAuth", server), ("clientAuth", client)) if on)
        say(f"wrote {role}: {paths[role][0]} and {paths[role][1]} ({use}, serial "
            f"{issued.cert.serial_number:x}, SANs {', '.join(names)})")
    return paths


def flags_text(paths: dict[str, tuple[Path, Path]]) -> str:
    """How to use what make_dev_certs wrote."""
    ca = paths["ca"][0]
    lines = ["flags:"]
    for role in ("draft", "target"):
        if role in paths:
            crt, key = paths[role]
            lines.append(f"  python -m {role}_service ... --tls-cert {crt} --tls-key {key} "
                         f"--tls-client-ca {ca}")
    if "coordinator-client" in paths:
        crt, key = paths["coordinator-client"]
        lines.append(f"  python -m coordinator ... --tls-ca {ca} --tls-cert {crt} "
                     f"--tls-key {key}")
    if "coordinator" in paths:
        lines.append(f"  (coordinator.crt/.key: for the client-facing ports; clients trust "
                     f"{ca}; client.crt/.key: a client certificate)")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    if args.days <= 0:
        print("error: --days must be positive", file=sys.stderr)
        return 2
    paths = make_dev_certs(Path(args.out), hosts, args.days, args.namespace,
                           new_ca=args.new_ca, say=lambda m: print(m, flush=True))
    print(flags_text(paths))
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser(
        "certs",
        help="make a development CA and certificates for draft, target, coordinator, client",
        description="Make a development CA (kept if --out already has one) and, signed by it, "
                    "a certificate and key for each role: draft and target (servers), "
                    "coordinator-client (the coordinator's client certificate for mutual "
                    "TLS), coordinator (server, for its client-facing ports) and client. "
                    "Keys are written with mode 0600. For local use and tests.",
    )
    c.add_argument("--out", required=True, metavar="DIR",
                   help="folder to write ca.crt/.key and ROLE.crt/.key to (created, mode "
                        "0700)")
    c.add_argument("--hosts", default=DEFAULT_HOSTS, metavar="HOST[,HOST...]",
                   help="IPs and DNS names every server certificate names (clients must "
                        "dial one of them); the role's Kubernetes Service names are added "
                        "(default: %(default)s)")
    c.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                   help="Kubernetes namespace for the Service names in the server "
                        "certificates (default: %(default)s)")
    c.add_argument("--days", type=int, default=365,
                   help="validity of each certificate in days; the CA lasts at least 10 "
                        "years (default: %(default)s)")
    c.add_argument("--new-ca", action="store_true",
                   help="make a new CA even if DIR has one (everything must then trust the "
                        "new ca.crt)")
    c.set_defaults(func=_run)
